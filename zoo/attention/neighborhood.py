"""Neighborhood attention: "Neighborhood Attention Transformer" (Hassani et al. 2023),
https://arxiv.org/abs/2204.07143, with the dilation of "Dilated Neighborhood Attention Transformer" (Hassani and
Shi 2022), https://arxiv.org/abs/2209.15001, as NATTEN computes them.

Each patch attends to the `kernel` x `kernel` patches around it on the grid. At the borders the window is
clamped inside the grid rather than cut, so every query sees exactly kernel x kernel keys (NATTEN's semantics:
along an axis of L cells the window starts at clamp(i - kernel // 2, 0, L - kernel)). With `dilation` δ the
axis splits into δ groups of the cells equal mod δ, and the clamped window of `kernel` cells runs over the
query's group, spanning about δ * kernel cells. An axis whose group is shorter than the kernel is seen whole
(NATTEN refuses such grids). Prefix tokens (class, registers) attend to every token and every token to them. A
kernel covering the grid is exact softmax attention.

`neighborhood_reference` writes the pattern out on dense `[n, n]` scores (the tests' oracle). The torch path cuts
each dilation group into tiles of queries; a tile's keys are the (tile + kernel - 1)-wide region holding all its
queries' neighbourhoods, gathered once (`_kernels.neighborhood`), and a `[tile, region]` mask keeps each query's
own kernel x kernel keys: one SDPA call over all tiles, O(n (tile + kernel)^2) work, no n x n tensor. The
window along an axis is `clamped_window` (per cell: `axis_neighborhood`), from which come the dense pattern
(`neighborhood_keep`), the FlexAttention pattern (`neighborhood_mask`) and the tiles' masks.

FlexAttention skips whole blocks of 128 queries x 128 keys, so the token order decides the cost. In raster order
a block of queries is a strip of one row (128 of 256 columns) whose neighbourhoods reach key blocks on `kernel`
rows, about 2 x kernel of them. The FlexAttention pattern therefore orders the grid in bands of `tile_rows` rows,
each band column by column (`tile_order`): 128 consecutive cells of a band are a tile_rows x 128 / tile_rows
patch wherever they start, and their neighbourhoods reach few key blocks (at 256 x 256 with kernel 23, 8 x 16
tiles reach about 14 where raster rows reach 46). `tile_rows='auto'` picks the height whose blocks reach the
fewest key blocks, counted exactly (`auto_tile_rows`; 1, raster order, where no band beats it, as on narrow grids
whose raster blocks already span a few whole rows); the prefix tokens go after the grid, so that the first band
starts a block. The mask_mod reads each position's row and column from tables written in that order.

Letter legend: b - batch, h - heads, n - tokens, m - keys, d - head dim, p - prefix tokens, y / x - grid rows /
columns, gy / gx - tiles along them, ty / tx - rows / columns of a tile, ry / rx - of its key region.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from .._validate import check_int
from ._blocks import allowed_attention
from ._flex import BLOCK, FlexMask
from ._grid import GridAttention, check_tokens, global_rows, grid_coordinates, prefix_table, with_prefix
from ._kernels.neighborhood import tiled_region_attention
from ._registry import register_attention

__all__ = [
    "NeighborhoodAttention",
    "auto_tile_rows",
    "axis_neighborhood",
    "axis_neighbors",
    "clamped_window",
    "neighborhood_attention",
    "neighborhood_keep",
    "neighborhood_mask",
    "neighborhood_reference",
    "tile_order",
]

# Floats of the count images `_reached_blocks` holds at once: bounds its memory at any grid.
COUNT_ELEMENTS = 1 << 24
# Queries per tile side. Smaller tiles gather fewer unused keys but make SDPA calls too small, larger ones gather
# more of the region no query of the tile sees; 8 was the fastest, or close to it, at every kernel size tried on CPU.
TILE = 8


def clamped_window(step: Tensor, group_length: Tensor | int, kernel: int) -> tuple[Tensor, Tensor]:
    """NATTEN's window along one dilation group of `group_length` cells: for the query at `step` (any shape) the
    first cell it sees, clamp(step - size // 2, 0, group_length - size), and the window's size, min(kernel,
    group_length) cells."""
    size = torch.as_tensor(group_length, device=step.device).clamp(max=kernel)
    return torch.minimum((step - size // 2).clamp(min=0), group_length - size), size


def axis_neighborhood(length: int, kernel: int, dilation: int, device=None) -> tuple[Tensor, ...]:
    """Along an axis of `length` cells, per cell `[length]` long: its dilation group (cells equal mod dilation), its
    step in the group, and the first and one-past-last step of its neighbourhood."""
    cell = torch.arange(length, device=device)
    group, step = cell % dilation, cell // dilation
    start, size = clamped_window(step, (length - group + dilation - 1) // dilation, kernel)
    return group, step, start, start + size


def axis_neighbors(length: int, kernel: int, dilation: int, device=None) -> Tensor:
    """`[length, length]` bool: cell j is in the neighbourhood of cell i along an axis of `length` cells."""
    group, step, start, stop = axis_neighborhood(length, kernel, dilation, device)
    return (group[:, None] == group) & (step >= start[:, None]) & (step < stop[:, None])


def neighborhood_keep(
    grid_size: tuple[int, int], num_prefix_tokens: int, kernel: int, dilation: int = 1, device=None
) -> Tensor:
    """`[n, n]` bool, True where token i may attend to token j (the dense pattern of `neighborhood_attention`)."""
    rows, cols = grid_size
    along_rows = axis_neighbors(rows, kernel, dilation, device)
    along_cols = axis_neighbors(cols, kernel, dilation, device)
    patches = rearrange(along_rows[:, None, :, None] & along_cols[None, :, None, :], "y x i j -> (y x) (i j)")
    return with_prefix(patches, num_prefix_tokens)


def neighborhood_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 0,
    kernel: int = 7,
    dilation: int = 1,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The pattern (`neighborhood_keep`) on dense scores, O(n^2): the tests' oracle.

    q, k, v: `[b, h, n, d]` with n = num_prefix_tokens + rows * cols; mask: `[b, n]` bool key padding mask,
    True = keep -> `[b, h, n, d]`.
    """
    allowed = neighborhood_keep(grid_size, num_prefix_tokens, kernel, dilation, q.device)  # [n, n]
    return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)


def tile_order(grid_size: tuple[int, int], tile_rows: int, device=None) -> Tensor:
    """`[rows * cols]` long: the raster indices of the cells in bands of `tile_rows` rows, each band column by
    column, top to bottom in a column (1 is raster order). Any `BLOCK` consecutive cells of a band form a
    tile_rows x BLOCK / tile_rows patch; the last band holds the rows left over."""
    row, col = grid_coordinates(grid_size, device)
    return torch.argsort(row // tile_rows * (grid_size[1] * tile_rows) + col * tile_rows + row % tile_rows)


def _reached_blocks(
    grid_size: tuple[int, int], kernel: int, dilation: int, tile_rows: int, device: torch.device | None
) -> int:
    """The (query block, key block) pairs of `BLOCK` cells of the grid in `tile_order` (prefix tokens left out) in
    which some query sees some key, counted exactly without an `[n, n]` mask: per query block, the cells its
    queries see are where the product of their rows' and their columns' neighbourhoods, `[y, q] @ [q, x]`, counts
    at least one."""
    rows, cols = grid_size
    cells = rows * cols
    blocks = -(-cells // BLOCK)
    order = tile_order(grid_size, tile_rows, device)
    # Per query position, padded to whole blocks with cells that see nothing: its row's and its column's neighbours.
    along_rows = axis_neighbors(rows, kernel, dilation, device).float()[order // cols]
    along_cols = axis_neighbors(cols, kernel, dilation, device).float()[order % cols]
    along_rows = rearrange(F.pad(along_rows, (0, 0, 0, blocks * BLOCK - cells)), "(k q) y -> k y q", q=BLOCK)
    along_cols = rearrange(F.pad(along_cols, (0, 0, 0, blocks * BLOCK - cells)), "(k q) x -> k q x", q=BLOCK)
    step = max(1, COUNT_ELEMENTS // cells)
    reached = 0
    for first in range(0, blocks, step):
        seen = torch.bmm(along_rows[first : first + step], along_cols[first : first + step]).flatten(1) > 0
        seen = F.pad(seen[:, order], (0, blocks * BLOCK - cells))  # [k, n] in tile order
        reached += int(seen.unflatten(1, (blocks, BLOCK)).any(-1).sum())
    return reached


@functools.lru_cache(maxsize=64)
def auto_tile_rows(grid_size: tuple[int, int], kernel: int, dilation: int, device: torch.device | None = None) -> int:
    """The band height `tile_rows='auto'` orders the grid in: of 1 (raster order), 2, 4, ..., `BLOCK` (up to the
    rows), the one whose query blocks reach the fewest key blocks (`_reached_blocks`, counted on `device`: (rows *
    cols)^2 multiply-adds per height, seconds on a CPU for a large grid, hence the cache), the lowest on a tie."""
    heights = [1 << i for i in range(BLOCK.bit_length()) if 1 << i <= grid_size[0]]
    reached = [_reached_blocks(grid_size, kernel, dilation, height, device) for height in heights]
    return heights[reached.index(min(reached))]


def check_tile_rows(tile_rows: object) -> int | Literal["auto"] | None:
    """A user-typed `tile_rows`: 'auto', None or an integer >= 1."""
    if tile_rows is None or (isinstance(tile_rows, str) and tile_rows == "auto"):
        return tile_rows
    if isinstance(tile_rows, int) and not isinstance(tile_rows, bool) and tile_rows >= 1:
        return tile_rows
    raise ValueError(
        f"tile_rows={tile_rows!r} is not allowed: expected 'auto' (the band height with the fewest key blocks), None "
        f"(raster order) or an integer >= 1 (the rows of the patch a FlexAttention block of {BLOCK} queries covers)"
    )


def neighborhood_mask(
    grid_size: tuple[int, int],
    num_prefix_tokens: int,
    kernel: int,
    dilation: int,
    device: torch.device,
    tile_rows: int | Literal["auto"] | None = "auto",
) -> FlexMask:
    """The FlexAttention pattern: per token, the `axis_neighborhood` tables of its row and column, written in
    `tile_order` (the grid in bands of `tile_rows` rows, `auto_tile_rows` for 'auto', then the prefix tokens), or
    in the sequence order (prefix tokens, then the grid in raster order) for `tile_rows=None`."""
    if tile_rows == "auto":
        tile_rows = auto_tile_rows(tuple(grid_size), kernel, dilation, device)
    return _neighborhood_mask(tuple(grid_size), num_prefix_tokens, kernel, dilation, device, tile_rows)


@functools.lru_cache(maxsize=64)
def _neighborhood_mask(
    grid_size: tuple[int, int],
    num_prefix_tokens: int,
    kernel: int,
    dilation: int,
    device: torch.device,
    tile_rows: int | None,
) -> FlexMask:
    p = num_prefix_tokens
    order = None
    # Bands of one row without prefix tokens are the sequence order.
    if tile_rows is not None and (tile_rows > 1 or p):
        prefix = torch.arange(p, device=device)
        order = torch.cat([p + tile_order(grid_size, tile_rows, device), prefix])
    tables = []
    for coord, length in zip(grid_coordinates(grid_size, device), grid_size, strict=True):
        # Per token: its dilation group (-1 for a prefix token), its step in the group and the first and
        # one-past-last step it sees; per position of `order` where there is one.
        axis = [prefix_table(x[coord], p) for x in axis_neighborhood(length, kernel, dilation, device)]
        tables.append(axis if order is None else [x[order] for x in axis])
    (row_group, row, row_low, row_high), (col_group, col, col_low, col_high) = tables

    def mask_mod(b, h, q_idx, kv_idx):
        rows = (
            (row_group[kv_idx] == row_group[q_idx]) & (row[kv_idx] >= row_low[q_idx]) & (row[kv_idx] < row_high[q_idx])
        )
        cols = (
            (col_group[kv_idx] == col_group[q_idx]) & (col[kv_idx] >= col_low[q_idx]) & (col[kv_idx] < col_high[q_idx])
        )
        return (rows & cols) | (row_group[q_idx] < 0) | (row_group[kv_idx] < 0)

    return FlexMask(mask_mod, p + grid_size[0] * grid_size[1], order=order)


def _axis_tiles(length: int, kernel: int, tile: int, device) -> tuple[Tensor, Tensor]:
    """Along an axis of `length` cells (one dilation group) cut into tiles of `tile` queries: the key cells of
    each tile's region `[g, r]` and which of them each query sees `[g, tile, r]` (padded queries included)."""
    size = min(kernel, length)
    region = min(tile + size - 1, length)
    first = torch.arange(0, length, tile, device=device)
    start = (first - size // 2).clamp(0, length - region)
    keys = start[:, None] + torch.arange(region, device=device)  # [g, r]
    queries = first[:, None] + torch.arange(tile, device=device)  # [g, tile]
    low, _ = clamped_window(queries, length, kernel)
    seen = (keys[:, None, :] >= low[..., None]) & (keys[:, None, :] < low[..., None] + size)
    return keys, seen


def _group_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    prefix: tuple[Tensor, Tensor, Tensor | None] | None,
    kernel: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """Neighbourhoods of one dilation group, dilation 1 inside it.

    q, k, v: `[b, h, y, x, d]`; keep: `[b, y, x]` bool or None; prefix: keys `[b, h, p, d]`, values and their keep
    `[b, p]` (or None) that every query also sees -> `[b, h, y, x, d]`.
    """
    rows, cols = q.shape[2:4]
    row_tiles = _axis_tiles(rows, kernel, min(TILE, rows), q.device)
    col_tiles = _axis_tiles(cols, kernel, min(TILE, cols), q.device)
    return tiled_region_attention(q, k, v, keep, prefix, row_tiles, col_tiles, scale, dropout_p)


def neighborhood_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 0,
    kernel: int = 7,
    dilation: int = 1,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Neighbourhood attention on the patch grid, prefix tokens global.

    q, k, v: `[b, h, n, d]` with n = num_prefix_tokens + rows * cols (prefix first, then the grid in raster
    order); mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. One tiled SDPA call per
    dilation group (dilation^2 of them).
    """
    b, h, n, d = q.shape
    p = num_prefix_tokens
    rows, cols = check_tokens(n, grid_size, p)
    grid_q, grid_k, grid_v = (rearrange(x[:, :, p:], "b h (y x) d -> b h y x d", y=rows) for x in (q, k, v))
    keep = None if mask is None else rearrange(mask[:, p:], "b (y x) -> b y x", y=rows)
    prefix = (k[:, :, :p], v[:, :, :p], None if mask is None else mask[:, :p]) if p else None
    if dilation == 1:
        out = _group_attention(grid_q, grid_k, grid_v, keep, prefix, kernel, scale, dropout_p)
    else:
        out = q.new_empty(b, h, rows, cols, d)
        for first_row in range(min(dilation, rows)):
            for first_col in range(min(dilation, cols)):
                cells = (slice(None), slice(None), slice(first_row, None, dilation), slice(first_col, None, dilation))
                group_keep = None if keep is None else keep[:, cells[2], cells[3]]
                out[cells] = _group_attention(
                    grid_q[cells], grid_k[cells], grid_v[cells], group_keep, prefix, kernel, scale, dropout_p
                )
    out = rearrange(out, "b h y x d -> b h (y x) d")
    if not p:
        return out
    return torch.cat([global_rows(q[:, :, :p], k, v, mask, scale, dropout_p), out], dim=2)


@register_attention("neighborhood")
class NeighborhoodAttention(GridAttention):
    """Each patch attends to the `kernel` x `kernel` (odd, default 7) patches around it, clamped inside the grid,
    every `dilation`-th cell (default 1); prefix tokens global. On FlexAttention the grid is ordered in bands of
    `tile_rows` rows ('auto', default: the height that reaches the fewest key blocks; None: raster order)."""

    test_options: ClassVar[dict] = {"grid_size": (6, 6), "num_prefix_tokens": 1, "kernel": 3}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        kernel: int = 7,
        dilation: int = 1,
        grid_size: tuple[int, int] | None = None,
        num_prefix_tokens: int = 0,
        backend: Literal["auto", "torch", "flex"] = "auto",
        tile_rows: int | Literal["auto"] | None = "auto",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.init_grid(grid_size, num_prefix_tokens, backend, reference)
        self.kernel = check_int("kernel", kernel, 1)
        if kernel % 2 == 0:
            raise ValueError(f"kernel={kernel} is not allowed: expected an odd integer (the query at the centre)")
        self.dilation = check_int("dilation", dilation, 1)
        self.tile_rows = check_tile_rows(tile_rows)

    def reference_attention(self, q, k, v, mask, grid: tuple[int, int], dropout_p: float) -> Tensor:
        return neighborhood_reference(
            q,
            k,
            v,
            mask,
            grid_size=grid,
            num_prefix_tokens=self.num_prefix_tokens,
            kernel=self.kernel,
            dilation=self.dilation,
            scale=self.scale,
            dropout_p=dropout_p,
        )

    def axis_rule(self):
        return axis_neighborhood, (self.kernel, self.dilation)

    def flex_pattern(self, grid: tuple[int, int], device: torch.device):
        return neighborhood_mask(grid, self.num_prefix_tokens, self.kernel, self.dilation, device, self.tile_rows)

    def torch_attention(self, q, k, v, mask, grid: tuple[int, int], dropout_p: float) -> Tensor:
        return neighborhood_attention(
            q,
            k,
            v,
            mask,
            grid_size=grid,
            num_prefix_tokens=self.num_prefix_tokens,
            kernel=self.kernel,
            dilation=self.dilation,
            scale=self.scale,
            dropout_p=dropout_p,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel={self.kernel}, dilation={self.dilation}, tile_rows={self.tile_rows!r}"
