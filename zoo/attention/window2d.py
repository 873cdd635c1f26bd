"""Windowed 2-D attention: "Exploring Plain Vision Transformer Backbones for Object Detection" (ViTDet, Li et al.
2022), https://arxiv.org/abs/2203.16527, as the image encoder of "Segment Anything" (Kirillov et al. 2023,
https://arxiv.org/abs/2304.02643) runs it, with the shifted windows of "Swin Transformer" (Liu et al. 2021),
https://arxiv.org/abs/2103.14030.

The tokens are `num_prefix_tokens` prefix tokens (class, registers) and then the H x W patch grid in raster
order. The grid is padded at the bottom and right to a multiple of `window`, as SAM's `window_partition` does,
and cut into non-overlapping `window` x `window` windows; each patch attends exactly within its window and to
the prefix tokens, and the prefix tokens attend to every token. Padded cells never get weight (SAM attends to its
zero padding; here it is masked). With `shift` s the windows move by s cells: Swin rolls the grid by -s and masks
the regions the roll wraps around, which is the same as window boundaries at s, s + window, ... with a first
window of s cells, computed here by padding window - s cells before the grid. An axis no longer than the window
is one window and is not shifted (Swin's rule, per axis). A window covering the grid is exact softmax attention.

The window geometry is `axis_windows` / `window_ids`, from which come the dense pattern (`window2d_keep`, which
`window2d_reference` runs over exact softmax: the tests' oracle), the FlexAttention pattern (`window2d_mask`) and
the torch path's partition (where the windows tile the grid, the one-write gathers of `_kernels.window2d`). The
grid options, `set_grid` and the choice of path are `_grid.GridAttention`'s, shared with `neighborhood`.

Letter legend: b - batch, h - heads, n - tokens, m - keys, d - head dim, p - prefix tokens, y / x - grid rows /
columns, gy / gx - windows along them, wy / wx - rows / columns of a window, g - windows.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor

from .._validate import check_int
from ._blocks import allowed_attention
from ._flex import FlexMask
from ._grid import GridAttention, check_tokens, global_rows, grid_coordinates, masked_sdpa, with_prefix
from ._kernels.window2d import FromWindows, ToWindows
from ._registry import register_attention

__all__ = [
    "Window2dAttention",
    "axis_windows",
    "window2d_attention",
    "window2d_keep",
    "window2d_mask",
    "window2d_reference",
    "window_axis",
    "window_ids",
]


def axis_windows(length: int, window: int, shift: int) -> tuple[int, int, int]:
    """(window length, cells padded before, cells padded after) along an axis of `length` cells: an axis no longer
    than the window is one window and is not shifted; with a shift, the first window holds `shift` cells."""
    if length <= window:
        return length, 0, 0
    lead = window - shift if shift else 0
    return window, lead, -(length + lead) % window


def window_ids(grid_size: tuple[int, int], window: int, shift: int = 0, device=None) -> Tensor:
    """`[rows * cols]` long: the window of every cell, one number per window, in raster order of the windows."""
    row, col = grid_coordinates(grid_size, device)
    (row_size, top, _), (col_size, left, _) = (axis_windows(length, window, shift) for length in grid_size)
    # Column windows number at most the column count, so (row window, column window) -> one id is one to one.
    return (row + top) // row_size * (grid_size[1] + 1) + (col + left) // col_size


def window_axis(length: int, window: int, shift: int = 0, device=None) -> tuple[Tensor, ...]:
    """Along an axis of `length` cells, per cell `[length]` long: its group (0, one for all), its step (the cell) and
    the first and one-past-last cell of its window (`axis_windows`; the pattern along an axis, `axis_rule`)."""
    size, lead, _ = axis_windows(length, window, shift)
    cell = torch.arange(length, device=device)
    first = (cell + lead) // size * size - lead
    return torch.zeros_like(cell), cell, first.clamp(min=0), (first + size).clamp(max=length)


def window2d_keep(
    grid_size: tuple[int, int], num_prefix_tokens: int, window: int, shift: int = 0, device=None
) -> Tensor:
    """`[n, n]` bool, True where token i may attend to token j (the dense pattern of `window2d_attention`)."""
    ids = window_ids(grid_size, window, shift, device)
    return with_prefix(ids[:, None] == ids, num_prefix_tokens)


def window2d_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 0,
    window: int = 14,
    shift: int = 0,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The pattern (`window2d_keep`) on dense scores, O(n^2): the tests' oracle.

    q, k, v: `[b, h, n, d]` with n = num_prefix_tokens + rows * cols; mask: `[b, n]` bool key padding mask,
    True = keep -> `[b, h, n, d]`.
    """
    allowed = window2d_keep(grid_size, num_prefix_tokens, window, shift, q.device)  # [n, n]
    return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)


@functools.lru_cache(maxsize=64)
def window2d_mask(
    grid_size: tuple[int, int], num_prefix_tokens: int, window: int, shift: int, device: torch.device
) -> FlexMask:
    """The FlexAttention pattern, written in window order (window after window, `window_ids`, then the prefix
    tokens), where each window's tokens are contiguous and its blocks dense. The prefix tokens go last so that the
    first window starts a block: windows of a multiple of 128 cells (16 x 16) then fill whole blocks."""
    p = num_prefix_tokens
    ids = window_ids(grid_size, window, shift, device)
    order = torch.cat([p + torch.argsort(ids, stable=True), torch.arange(p, device=device)])
    # Per position of `order`: its window, -1 for a prefix token.
    ordered_id = torch.cat([ids.sort(stable=True).values, ids.new_full((p,), -1)])

    def mask_mod(b, h, q_idx, kv_idx):
        return (ordered_id[q_idx] == ordered_id[kv_idx]) | (ordered_id[q_idx] < 0) | (ordered_id[kv_idx] < 0)

    return FlexMask(mask_mod, p + grid_size[0] * grid_size[1], order=order)


def window2d_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 0,
    window: int = 14,
    shift: int = 0,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Exact attention inside 2-D windows of the patch grid, prefix tokens global.

    q, k, v: `[b, h, n, d]` with n = num_prefix_tokens + rows * cols (prefix first, then the grid in raster
    order); mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. One SDPA call over all windows,
    `[(b g), h, wy wx, d]` against the window's cells and the prefix keys.
    """
    b, _, n, _ = q.shape
    p = num_prefix_tokens
    rows, cols = check_tokens(n, grid_size, p)
    (wy, top, bottom), (wx, left, right) = axis_windows(rows, window, shift), axis_windows(cols, window, shift)
    if not (top or bottom or left or right):
        return _tiled_attention(q, k, v, mask, p, (rows // wy, wy, cols // wx, wx), scale, dropout_p)

    def partition(x: Tensor) -> Tensor:
        grid = rearrange(x, "b h (y x) d -> b h y x d", y=rows)
        grid = F.pad(grid, (0, 0, left, right, top, bottom))
        return rearrange(grid, "b h (gy wy) (gx wx) d -> (b gy gx) h (wy wx) d", wy=wy, wx=wx)

    queries, keys, values = (partition(x[:, :, p:]) for x in (q, k, v))
    windows = queries.shape[0] // b
    if p:
        keys = torch.cat([keys, repeat(k[:, :, :p], "b h p d -> (b g) h p d", g=windows)], dim=2)
        values = torch.cat([values, repeat(v[:, :, :p], "b h p d -> (b g) h p d", g=windows)], dim=2)
    keep = _window_keep(mask, b, p, (rows, cols), (top, bottom, left, right), (wy, wx), q.device)
    # Every window holds a grid cell: only a padding mask can leave a query without keys.
    out = masked_sdpa(queries, keys, values, keep, scale, dropout_p, may_be_empty=mask is not None)
    out = rearrange(out, "(b gy gx) h (wy wx) d -> b h (gy wy) (gx wx) d", b=b, gx=(left + cols + right) // wx, wy=wy)
    out = rearrange(out[:, :, top : top + rows, left : left + cols], "b h y x d -> b h (y x) d")
    if not p:
        return out
    return torch.cat([global_rows(q[:, :, :p], k, v, mask, scale, dropout_p), out], dim=2)


def _tiled_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: int, tiles: tuple, scale: float | None, dropout_p: float
) -> Tensor:
    """`window2d_attention` where the windows tile the grid (no padding, no shift remainder): each of q, k, v moved
    into its windows in one write (keys and values with the prefix tokens appended), and the windows' output written
    back once, laid out as `[b, n, h, d]`, so that the projection after it reads it without a copy. tiles:
    (gy, wy, gx, wx)."""
    gy, wy, gx, wx = tiles
    queries = ToWindows.apply(q, p, tiles, False)
    keys, values = (ToWindows.apply(x, p, tiles, True) for x in (k, v))
    keep = _window_keep(mask, q.shape[0], p, (gy * wy, gx * wx), (0, 0, 0, 0), (wy, wx), q.device)
    out = masked_sdpa(queries, keys, values, keep, scale, dropout_p, may_be_empty=mask is not None)
    prefix = global_rows(q[:, :, :p], k, v, mask, scale, dropout_p) if p else None
    return FromWindows.apply(out, prefix, p, tiles)


def _window_keep(
    mask: Tensor | None, b: int, p: int, grid: tuple[int, int], pads: tuple, window: tuple[int, int], device
) -> Tensor | None:
    """The keys each window's queries may see, `[(b g), 1, 1, m]` in the windows' order: the window's cells (its
    padding cells never, masked cells never), then the prefix tokens; None where every key is kept. pads: (top,
    bottom, left, right) cells of padding, window: (wy, wx)."""
    if mask is None and not any(pads):
        return None
    (rows, cols), (top, bottom, left, right), (wy, wx) = grid, pads, window
    cells = torch.ones(1, rows * cols, dtype=torch.bool, device=device) if mask is None else mask[:, p:]
    cells = F.pad(rearrange(cells, "b (y x) -> b y x", y=rows), (left, right, top, bottom), value=False)
    keep = rearrange(cells, "b (gy wy) (gx wx) -> b (gy gx) (wy wx)", wy=wy, wx=wx).expand(b, -1, -1)
    if p:
        prefix = torch.ones(1, p, dtype=torch.bool, device=device) if mask is None else mask[:, :p]
        keep = torch.cat([keep, prefix[:, None].expand(b, keep.shape[1], -1)], dim=-1)
    return rearrange(keep, "b g m -> (b g) 1 1 m")


@register_attention("window2d")
class Window2dAttention(GridAttention):
    """Exact attention in `window` x `window` windows of the patch grid (default 14, SAM's), optionally shifted
    by `shift` cells (an int, or True for window // 2); prefix tokens global."""

    test_options: ClassVar[dict] = {"grid_size": (6, 6), "num_prefix_tokens": 1, "window": 4}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        window: int = 14,
        shift: int | bool = 0,
        grid_size: tuple[int, int] | None = None,
        num_prefix_tokens: int = 0,
        backend: Literal["auto", "torch", "flex"] = "auto",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.init_grid(grid_size, num_prefix_tokens, backend, reference)
        self.window = check_int("window", window, 1)
        if isinstance(shift, bool):
            shift = window // 2 if shift else 0
        self.shift = check_int("shift", shift, 0, window - 1)

    def reference_attention(self, q, k, v, mask, grid: tuple[int, int], dropout_p: float) -> Tensor:
        return window2d_reference(
            q,
            k,
            v,
            mask,
            grid_size=grid,
            num_prefix_tokens=self.num_prefix_tokens,
            window=self.window,
            shift=self.shift,
            scale=self.scale,
            dropout_p=dropout_p,
        )

    def axis_rule(self):
        return window_axis, (self.window, self.shift)

    def flex_pattern(self, grid: tuple[int, int], device: torch.device):
        return window2d_mask(grid, self.num_prefix_tokens, self.window, self.shift, device)

    def torch_attention(self, q, k, v, mask, grid: tuple[int, int], dropout_p: float) -> Tensor:
        return window2d_attention(
            q,
            k,
            v,
            mask,
            grid_size=grid,
            num_prefix_tokens=self.num_prefix_tokens,
            window=self.window,
            shift=self.shift,
            scale=self.scale,
            dropout_p=dropout_p,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, shift={self.shift}"
