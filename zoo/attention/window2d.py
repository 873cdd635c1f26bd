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

Shared with `neighborhood`: `GridAttention` (the grid options, `set_grid`, the backends) and the dense reference.

Letter legend: b - batch, h - heads, n - tokens, m - keys, d - head dim, p - prefix tokens, y / x - grid rows /
columns, gy / gx - windows along them, wy / wx - rows / columns of a window, g - windows.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase
from ._flex import check_backend, flex_attend, use_flex, window2d_mask
from ._registry import register_attention

__all__ = [
    "GridAttention",
    "Window2dAttention",
    "check_grid",
    "check_tokens",
    "dense_reference",
    "global_rows",
    "masked_sdpa",
    "window2d_attention",
    "window2d_keep",
]


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


def axis_windows(length: int, window: int, shift: int) -> tuple[int, int, int]:
    """(window length, cells padded before, cells padded after) along an axis of `length` cells."""
    if length <= window:
        return length, 0, 0
    lead = window - shift if shift else 0
    return window, lead, -(length + lead) % window


def window2d_keep(
    grid_size: tuple[int, int], num_prefix_tokens: int, window: int, shift: int = 0, device=None
) -> Tensor:
    """`[n, n]` bool, True where token i may attend to token j (the dense pattern of `window2d_attention`)."""
    rows, cols = grid_size
    cells = torch.arange(rows * cols, device=device)
    same = torch.ones((), dtype=torch.bool, device=device)
    for coord, length in ((cells // cols, rows), (cells % cols, cols)):
        size, lead, _ = axis_windows(length, window, shift)
        ids = (coord + lead) // size
        same = same & (ids[:, None] == ids)
    n = num_prefix_tokens + rows * cols
    keep = torch.ones(n, n, dtype=torch.bool, device=device)
    keep[num_prefix_tokens:, num_prefix_tokens:] = same
    return keep


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


def dense_reference(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, mask: Tensor | None, scale: float | None, dropout_p: float
) -> Tensor:
    """Explicit softmax under a dense pattern: `allowed` `[n, n]` bool, mask `[b, n]` key padding -> `[b, h, n, d]`.
    A query with no allowed key gets zeros. O(n^2) memory: for the tests."""
    keep = allowed if mask is None else allowed & mask[:, None, None, :]
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    weights = scores.masked_fill(~keep, float("-inf")).softmax(-1).nan_to_num(0.0)
    return F.dropout(weights, p=dropout_p) @ v


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

    def partition(x: Tensor) -> Tensor:
        grid = rearrange(x, "b h (y x) d -> b h y x d", y=rows)
        grid = F.pad(grid, (0, 0, left, right, top, bottom))
        return rearrange(grid, "b h (gy wy) (gx wx) d -> (b gy gx) h (wy wx) d", wy=wy, wx=wx)

    queries, keys, values = (partition(x[:, :, p:]) for x in (q, k, v))
    windows = queries.shape[0] // b
    keep = None
    if mask is not None or top or bottom or left or right:
        cells = torch.ones(1, rows * cols, dtype=torch.bool, device=q.device) if mask is None else mask[:, p:]
        cells = F.pad(rearrange(cells, "b (y x) -> b y x", y=rows), (left, right, top, bottom), value=False)
        keep = rearrange(cells, "b (gy wy) (gx wx) -> b (gy gx) (wy wx)", wy=wy, wx=wx)
    if p:
        keys = torch.cat([keys, repeat(k[:, :, :p], "b h p d -> (b g) h p d", g=windows)], dim=2)
        values = torch.cat([values, repeat(v[:, :, :p], "b h p d -> (b g) h p d", g=windows)], dim=2)
        if keep is not None:
            prefix = torch.ones(1, p, dtype=torch.bool, device=q.device) if mask is None else mask[:, :p]
            keep = torch.cat([keep.expand(b, -1, -1), prefix[:, None].expand(b, windows, -1)], dim=-1)
    if keep is not None:
        keep = rearrange(keep.expand(b, -1, -1), "b g m -> (b g) 1 1 m")
    # Every window holds a grid cell: only a padding mask can leave a query without keys.
    out = masked_sdpa(queries, keys, values, keep, scale, dropout_p, may_be_empty=mask is not None)
    out = rearrange(out, "(b gy gx) h (wy wx) d -> b h (gy wy) (gx wx) d", b=b, gx=(left + cols + right) // wx, wy=wy)
    out = rearrange(out[:, :, top : top + rows, left : left + cols], "b h y x d -> b h (y x) d")
    if not p:
        return out
    return torch.cat([global_rows(q[:, :, :p], k, v, mask, scale, dropout_p), out], dim=2)


class GridAttention(AttentionBase):
    """Attention on the patch grid: the `grid_size`, `num_prefix_tokens`, `backend` and `reference` options
    (checked by `init_grid`) and `set_grid`, shared by `window2d` and `neighborhood`. A subclass implements
    `pattern` (its dense reference), `flex_pattern` and `torch_attention`."""

    needs_grid = True
    has_attention_weights = True

    def init_grid(
        self, grid_size: tuple[int, int] | None, num_prefix_tokens: int, backend: str, reference: bool
    ) -> None:
        """Check and set the grid options; called by the subclass constructors after `AttentionBase.__init__`."""
        self.grid_size = None if grid_size is None else check_grid(grid_size)
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, 0)
        self.reference = check_bool("reference", reference)
        self.backend = check_backend(backend, self.attn_drop.p, self.reference)

    def set_grid(self, grid_size: tuple[int, int]) -> None:
        """The patch grid `(rows, cols)` of the next forwards (the model calls it when the image size changes)."""
        self.grid_size = check_grid(grid_size)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        grid = check_tokens(q.shape[-2], self.grid_size, self.num_prefix_tokens)
        if self.reference:
            allowed = self.pattern(grid, q.device)
            return dense_reference(q, k, v, allowed, mask, self.scale, dropout_p)
        if use_flex(self.backend, q, dropout_p):
            return flex_attend(q, k, v, self.flex_pattern(grid, q.device), mask, scale=self.scale)
        return self.torch_attention(q, k, v, mask, grid, dropout_p)

    def pattern(self, grid: tuple[int, int], device: torch.device) -> Tensor:
        """`[n, n]` bool: which token may attend to which."""
        raise NotImplementedError

    def flex_pattern(self, grid: tuple[int, int], device: torch.device):
        """The `FlexMask` of the pattern (see `_flex.py`)."""
        raise NotImplementedError

    def torch_attention(self, q, k, v, mask, grid: tuple[int, int], dropout_p: float) -> Tensor:
        """The torch path on `[b, h, n, d]` tensors."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, grid_size={self.grid_size}, num_prefix_tokens={self.num_prefix_tokens}, "
            f"backend={self.backend!r}{', reference=True' if self.reference else ''}"
        )


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

    def pattern(self, grid: tuple[int, int], device: torch.device) -> Tensor:
        return window2d_keep(grid, self.num_prefix_tokens, self.window, self.shift, device)

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
