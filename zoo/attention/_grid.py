"""The patch grid shared by the 2-D families (`window2d`, `neighborhood`): the grid options and `set_grid`, the
token checks, the prefix tokens every token sees, and the backends.

The tokens are `num_prefix_tokens` prefix tokens (class, registers) and then the rows x cols patch grid in raster
order. A family's geometry is one function of the grid in its own file; from it come its dense `[n, n]` pattern
(`with_prefix`, the reference the tests compare with), its FlexAttention pattern (`prefix_table`) and its torch
path. A NaFlex batch gives every sample a grid of its own (`set_grids`): on FlexAttention one call covers the whole
padded batch (`ragged_pattern`: its mask_mod reads each token's sample, row and column from per-sample tables, as
FlexAttention's document masking does); the torch path and the reference run each distinct grid on its samples'
leading tokens (`ragged_attend`). Either way windows never span two samples or padding.

Letter legend: b - batch, h - heads, n - tokens, m - keys, d - head dim, p - prefix tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase
from ._flex import FlexMask, check_backend, flex_attend
from ._paths import Path, choose_path

__all__ = [
    "GridAttention",
    "check_grid",
    "check_ragged",
    "check_tokens",
    "global_rows",
    "grid_coordinates",
    "masked_sdpa",
    "prefix_table",
    "ragged_attend",
    "ragged_pattern",
    "ragged_tables",
    "with_prefix",
]

# An axis rule (`GridAttention.axis_rule`): `rule(length, *options, device)` -> per cell `[length]` long, its group,
# its step in the group, and the first and one-past-last step of the cells of its group it sees.
AxisRule = Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]
# The group `ragged_tables` gives a prefix token (`prefix_table`'s -1) and a padded one.
PREFIX, PADDED = -1, -2


def check_grid(grid_size: object) -> tuple[int, int]:
    """A user-typed `grid_size` as `(rows, cols)`."""
    if not isinstance(grid_size, (tuple, list)) or len(grid_size) != 2:
        raise ValueError(f"grid_size={grid_size!r} is not allowed: expected (rows, cols), two integers >= 1")
    return check_int("grid_size[0]", grid_size[0], 1), check_int("grid_size[1]", grid_size[1], 1)


def check_tokens(n: int, grid_size: tuple[int, int] | None, num_prefix_tokens: int) -> tuple[int, int]:
    """The grid, once `n` tokens are checked to be the prefix tokens and the grid's patches."""
    if grid_size is None:
        raise ValueError(
            "grid_size is not set: pass grid_size=(rows, cols) of the patch grid, or call set_grid (zoo.create_model "
            "does both from the patch embedding)"
        )
    rows, cols = grid_size
    if n != num_prefix_tokens + rows * cols:
        raise ValueError(
            f"{n} tokens do not fit grid_size={tuple(grid_size)} with num_prefix_tokens={num_prefix_tokens}: "
            f"expected {num_prefix_tokens} + {rows} x {cols} = {num_prefix_tokens + rows * cols}"
        )
    return rows, cols


def grid_coordinates(grid_size: tuple[int, int], device=None) -> tuple[Tensor, Tensor]:
    """The row and the column of every cell, each `[rows * cols]` long, in raster order."""
    rows, cols = grid_size
    cells = torch.arange(rows * cols, device=device)
    return cells // cols, cells % cols


def with_prefix(cells: Tensor, num_prefix_tokens: int) -> Tensor:
    """A dense pattern over the cells, `[c, c]` bool, as one over the tokens, `[p + c, p + c]`: the prefix tokens
    see and are seen by every token."""
    n = num_prefix_tokens + cells.shape[-1]
    keep = torch.ones(n, n, dtype=torch.bool, device=cells.device)
    keep[num_prefix_tokens:, num_prefix_tokens:] = cells
    return keep


def prefix_table(values: Tensor, num_prefix_tokens: int) -> Tensor:
    """A per-cell lookup table `[c]` as a per-token one `[p + c]` for a FlexAttention mask_mod, -1 at the prefix
    tokens (whose rows and columns a mask_mod allows whole)."""
    return torch.cat([values.new_full((num_prefix_tokens,), -1), values])


def masked_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    scale: float | None,
    dropout_p: float,
    may_be_empty: bool = True,
) -> Tensor:
    """SDPA with a bool `keep` mask (True = attend) broadcastable to `[b, h, n, m]`, or None; a query with no
    kept key gets zeros, not NaN (`may_be_empty=False` skips that guard where every query keeps a key)."""
    if keep is None or not may_be_empty:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p, scale=scale)
    any_kept = keep.any(-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep | ~any_kept, dropout_p=dropout_p, scale=scale)
    return out * any_kept


def global_rows(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None, dropout_p: float):
    """The prefix tokens' queries `q: [b, h, p, d]` against every key `k, v: [b, h, n, d]` -> `[b, h, p, d]`."""
    keep = None if mask is None else mask[:, None, None, :]
    return masked_sdpa(q, k, v, keep, scale, dropout_p)


def check_ragged(grids: list, b: int, n: int, p: int) -> list[tuple[int, int]]:
    """Every sample's grid `(rows, cols)` of a batch of `b` samples of `n` tokens with `p` prefix tokens, checked
    to be one a sample and to fit the tokens."""
    if len(grids) != b:
        raise ValueError(f"{len(grids)} grids set (set_grids) for a batch of {b} samples")
    for rows, cols in grids:
        if p + rows * cols > n:
            raise ValueError(
                f"grid {rows} x {cols} with {p} prefix tokens needs {p + rows * cols} tokens, the batch has {n}"
            )
    return [tuple(grid) for grid in grids]


def ragged_attend(attend_grid, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, grids: list, p: int) -> Tensor:
    """A 2-D family on a batch whose samples have grids of their own (NaFlex), one distinct grid at a time: the
    samples of each grid are run together on their leading `p + rows * cols` tokens, exactly as that grid alone, so
    no window spans two samples or padding; padded queries get zeros (the torch path and the reference; on
    FlexAttention `ragged_pattern` covers the batch in one call).

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool or None; grids: `(rows, cols)` per sample, checked
    (`check_ragged`); attend_grid(q, k, v, mask, grid) runs one grid -> `[b, h, n, d]`.
    """
    n = q.shape[2]
    out = q.new_zeros(q.shape)
    by_grid: dict[tuple[int, int], list[int]] = {}
    for index, grid in enumerate(grids):
        by_grid.setdefault(tuple(grid), []).append(index)
    for (rows, cols), samples in by_grid.items():
        length = p + rows * cols
        index = torch.tensor(samples, device=q.device)
        part = [x.index_select(0, index)[:, :, :length] for x in (q, k, v)]
        keep = None if mask is None else mask.index_select(0, index)[:, :length]
        result = attend_grid(*part, keep, (rows, cols))
        out = out.index_copy(0, index, F.pad(result, (0, 0, 0, n - length)))
    return out


def ragged_tables(rule: AxisRule, options: tuple, grids: tuple, p: int, n: int, device: torch.device) -> Tensor:
    """`[8, b, n]` long: for every token of each sample (`p` prefix tokens, its grid in raster order, padding up to
    `n`), the `rule` tables of its row (group, step, first and one-past-last step it sees) then of its column, on
    that sample's own grid; a prefix token has -1 in all eight (`PREFIX`), a padded one group `PADDED` and 0 steps.
    Exactly n entries a sample: FlexAttention's mask_mod reads them (see `BLOCK` in `_flex`)."""
    tables = torch.zeros(8, len(grids), n, dtype=torch.long, device=device)
    tables[[0, 4]] = PADDED
    by_grid: dict[tuple[int, int], list[int]] = {}
    for index, grid in enumerate(grids):
        by_grid.setdefault(tuple(grid), []).append(index)
    for grid, samples in by_grid.items():
        per_token = [
            prefix_table(table[coord], p)
            for coord, length in zip(grid_coordinates(grid, device), grid, strict=True)
            for table in rule(length, *options, device)
        ]
        index = torch.tensor(samples, device=device)
        tables[:, index, : p + grid[0] * grid[1]] = torch.stack(per_token)[:, None]
    return tables


@functools.lru_cache(maxsize=8)
def ragged_pattern(rule: AxisRule, options: tuple, grids: tuple, p: int, n: int, device: torch.device) -> FlexMask:
    """One FlexAttention pattern for a packed batch whose samples have grids of their own (`grids`, a tuple of
    `(rows, cols)`, one a sample), in the sequence order (not the window or band order of `flex_pattern`, which
    would differ from sample to sample): a cell sees the cells its row's and its column's `rule`
    allow on its own sample's grid (`ragged_tables`), prefix tokens see and are seen by every token of their sample,
    padding is seen by none and sees none (its output is zeros). Cached: the blocks of a forward are built once for
    all its layers."""
    row_group, row, row_low, row_high, col_group, col, col_low, col_high = ragged_tables(
        rule, options, grids, p, n, device
    )

    def mask_mod(b, h, q_idx, kv_idx):
        rows = (
            (row_group[b, kv_idx] == row_group[b, q_idx])
            & (row[b, kv_idx] >= row_low[b, q_idx])
            & (row[b, kv_idx] < row_high[b, q_idx])
        )
        cols = (
            (col_group[b, kv_idx] == col_group[b, q_idx])
            & (col[b, kv_idx] >= col_low[b, q_idx])
            & (col[b, kv_idx] < col_high[b, q_idx])
        )
        query, key = row_group[b, q_idx], row_group[b, kv_idx]
        prefix = ((query == PREFIX) | (key == PREFIX)) & (query != PADDED) & (key != PADDED)
        return (rows & cols) | prefix

    return FlexMask(mask_mod, n, batch=len(grids))


class GridAttention(AttentionBase):
    """Attention on the patch grid: the `grid_size`, `num_prefix_tokens`, `backend` and `reference` options
    (checked by `init_grid`), `set_grid`, and the path of each call (`choose_path`: the reference, FlexAttention or
    the torch path). A subclass implements `reference_attention` (its reference function: its dense pattern over
    exact softmax), `flex_pattern`, `torch_attention` and `axis_rule` (its pattern along one axis, from which
    `ragged_pattern` builds the FlexAttention pattern of a batch of samples with grids of their own)."""

    needs_grid: ClassVar[bool] = True
    has_attention_weights: ClassVar[bool] = True

    def init_grid(
        self, grid_size: tuple[int, int] | None, num_prefix_tokens: int, backend: str, reference: bool
    ) -> None:
        """Check and set the grid options; called by the subclass constructors after `AttentionBase.__init__`."""
        self.grid_size = None if grid_size is None else check_grid(grid_size)
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, 0)
        self.reference = check_bool("reference", reference)
        self.backend = check_backend(backend, self.attn_drop.p, self.reference)
        self.grids: list[tuple[int, int]] | None = None

    def set_grid(self, grid_size: tuple[int, int]) -> None:
        """The patch grid `(rows, cols)` of the next forwards (the model calls it when the image size changes)."""
        self.grid_size = check_grid(grid_size)

    def set_grids(self, grids: list[tuple[int, int]] | None) -> None:
        """Every sample's own grid for the next forwards (NaFlex batches: sample i's tokens are the prefix tokens,
        its rows x cols patches in raster order, then padding up to the batch's length); None: one grid for all,
        `grid_size`."""
        self.grids = None if grids is None else [check_grid(grid) for grid in grids]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        p, (b, _, n, _) = self.num_prefix_tokens, q.shape
        if self.grids is None:
            return self._attend_grid(q, k, v, mask, check_tokens(n, self.grid_size, p))
        grids = check_ragged(self.grids, b, n, p)
        # With backend 'auto' the torch path runs: each padded length would compile a FlexAttention kernel of its own.
        flex = self.backend == "flex"
        if len(set(grids)) == 1 and p + grids[0][0] * grids[0][1] == n:  # one grid, no padding: the plain call
            return self._attend_grid(q, k, v, mask, grids[0], flex=flex)
        dropout_p = self.attn_drop.p if self.training else 0.0
        if choose_path(q, reference=self.reference, backend=self.backend, dropout_p=dropout_p, flex=flex) is Path.FLEX:
            pattern = ragged_pattern(*self.axis_rule(), tuple(grids), p, n, q.device)
            return flex_attend(q, k, v, pattern, mask, scale=self.scale)
        return ragged_attend(functools.partial(self._attend_grid, flex=False), q, k, v, mask, grids, p)

    def _attend_grid(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, grid: tuple[int, int], flex: bool = True
    ) -> Tensor:
        """Samples that share one grid, `[b, h, p + rows * cols, d]`, on the path `choose_path` picks."""
        dropout_p = self.attn_drop.p if self.training else 0.0
        path = choose_path(q, reference=self.reference, backend=self.backend, dropout_p=dropout_p, flex=flex)
        if path is Path.REFERENCE:
            return self.reference_attention(q, k, v, mask, grid, dropout_p)
        if path is Path.FLEX:
            return flex_attend(q, k, v, self.flex_pattern(grid, q.device), mask, scale=self.scale)
        return self.torch_attention(q, k, v, mask, grid, dropout_p)

    def reference_attention(self, q, k, v, mask, grid: tuple[int, int], dropout_p: float) -> Tensor:
        """The family's reference function on `[b, h, n, d]` tensors: its dense pattern over exact softmax."""
        raise NotImplementedError

    def flex_pattern(self, grid: tuple[int, int], device: torch.device) -> FlexMask:
        """The same pattern for FlexAttention."""
        raise NotImplementedError

    def torch_attention(self, q, k, v, mask, grid: tuple[int, int], dropout_p: float) -> Tensor:
        """The torch path on `[b, h, n, d]` tensors."""
        raise NotImplementedError

    def axis_rule(self) -> tuple[AxisRule, tuple]:
        """`(rule, options)`: the pattern along one axis of the grid (`AxisRule`, called `rule(length, *options,
        device)`), of which the family's pattern on the cells is that of the rows and that of the columns together.
        Module-level functions and plain options, so that equal layers share one cached `ragged_pattern`."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, grid_size={self.grid_size}, num_prefix_tokens={self.num_prefix_tokens}, "
            f"backend={self.backend!r}{', reference=True' if self.reference else ''}"
        )
