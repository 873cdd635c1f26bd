"""Longformer: "Longformer: The Long-Document Transformer" (Beltagy et al. 2020), https://arxiv.org/abs/2004.05150

A sliding window of `window` positions each side (the paper's window of 2 * window + 1) plus global positions G
(by default index 0, the class token) that attend to every position and that every position attends to:

    out_i = sum_{j in W(i)} softmax_j(q_i . k_j * scale) v_j,
    W(i) = {j : |i - j| <= window} | G, and every j for i in G          (causal: only j <= i throughout)

One softmax over the union of the window and the global keys, a key in both counted once. `longformer_reference`
writes this out on dense `[n, n]` scores. Faster paths (`choose_path` picks one per call): FlexAttention; the CPU
flash parts (`_kernels.windowed.longformer_parts`); and the torch path here, the window blocked as `local`'s with
the global keys appended to every block and the global queries against the whole sequence: memory and time
O(n * (window + g)). A window as long as the sequence is exact attention.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._blocks import allowed_attention, as_sdpa_mask, band_keep, rows_attention, window_layout
from ._common import AttentionBase
from ._flex import FlexMask, check_backend, flex_attend
from ._kernels.flash_parts import on_kept_prefixes, prefix_lengths, use_flash_parts
from ._kernels.windowed import longformer_parts
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = ["LongformerAttention", "longformer_attention", "longformer_mask", "longformer_reference"]


def _is_global(length: int, global_indices: Sequence[int], device: torch.device) -> Tensor:
    """`[length]` bool, True at the global positions."""
    is_global = torch.zeros(length, dtype=torch.bool, device=device)
    is_global[list(global_indices)] = True
    return is_global


def _sees(q_idx: Tensor, kv_idx: Tensor, is_global: Tensor, window: int, is_causal: bool) -> Tensor:
    """True where query position `q_idx` sees key position `kv_idx` (broadcast): its window, or either one global
    (causal: j <= i throughout). The dense reference and the FlexAttention pattern both."""
    allowed = band_keep(q_idx - kv_idx, window, is_causal) | is_global[q_idx] | is_global[kv_idx]
    return allowed & (kv_idx <= q_idx) if is_causal else allowed


def longformer_mask(
    length: int, window: int, global_indices: Sequence[int], is_causal: bool, device: torch.device
) -> FlexMask:
    """The FlexAttention pattern over `length` positions (`_sees`); cached by the global positions' values."""
    return _longformer_mask(length, window, tuple(global_indices), is_causal, device)


@functools.lru_cache(maxsize=64)
def _longformer_mask(
    length: int, window: int, global_indices: tuple[int, ...], is_causal: bool, device: torch.device
) -> FlexMask:
    is_global = _is_global(length, global_indices, device)

    def mask_mod(b, h, q_idx, kv_idx):
        return _sees(q_idx, kv_idx, is_global, window, is_causal)

    return FlexMask(mask_mod, length)


def longformer_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 256,
    global_indices: Sequence[int] = (0,),
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The equation on dense scores, O(n^2): the tests' oracle.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep; global_indices: g distinct
    positions in [0, n) -> `[b, h, n, d]`.
    """
    n = q.shape[-2]
    positions = torch.arange(n, device=q.device)
    is_global = _is_global(n, global_indices, q.device)
    allowed = _sees(positions[:, None], positions, is_global, window, is_causal)  # [n, n]
    return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)


def longformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 256,
    global_indices: Sequence[int] = (0,),
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Sliding-window attention with global positions on the path `choose_path` picks (FlexAttention is the
    module's).

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep; global_indices: g distinct
    positions in [0, n) -> `[b, h, n, d]`. Causal: every query, global ones included, sees only j <= i.
    `reference=True`: `longformer_reference`.
    """
    _check_global_indices(global_indices, q.shape[-2])
    kernel = _kernel_applies(q, mask, dropout_p, window, global_indices)
    path = choose_path(q, reference=reference, kernel=kernel)
    return _longformer_on(path, q, k, v, mask, is_causal, window, global_indices, scale, dropout_p)


def _kept_prefixes(q: Tensor, mask: Tensor | None, dropout_p: float, global_indices: Sequence[int]):
    """`prefix_lengths`, where every global position lies inside each non-empty prefix (an empty sample's rows are
    zero either way); else None."""
    lengths = prefix_lengths(q, mask, dropout_p)
    if lengths is None:
        return None
    shortest = min((kept for kept in lengths if kept), default=q.shape[-2])
    return lengths if max(global_indices, default=-1) < shortest else None


def _kernel_applies(q: Tensor, mask: Tensor | None, dropout_p: float, window: int, global_indices: Sequence[int]):
    """`choose_path`'s `kernel` predicate: the flash parts run on each sample's kept prefix, or on the batch."""
    block = min(window, q.shape[-2])
    return lambda: (
        _kept_prefixes(q, mask, dropout_p, global_indices) is not None or use_flash_parts(q, mask, dropout_p, block)
    )


def _longformer_on(
    path: Path,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    window: int,
    global_indices: Sequence[int],
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """Longformer attention on `path`."""
    if path is Path.REFERENCE:
        return longformer_reference(
            q, k, v, mask, is_causal, window=window, global_indices=global_indices, scale=scale, dropout_p=dropout_p
        )
    if path is Path.FLEX:
        pattern = longformer_mask(q.shape[-2], window, global_indices, is_causal, q.device)
        return flex_attend(q, k, v, pattern, mask, scale=scale)
    rows = torch.tensor(list(global_indices), dtype=torch.long, device=q.device)
    if path is Path.KERNEL:
        lengths = _kept_prefixes(q, mask, dropout_p, global_indices)
        if lengths is not None:
            run = functools.partial(
                longformer_attention, is_causal=is_causal, window=window, global_indices=global_indices, scale=scale
            )
            return on_kept_prefixes(run, q, k, v, lengths)
        return longformer_parts(q, k, v, rows, is_causal, window, q.shape[-1] ** -0.5 if scale is None else scale)
    return _longformer_blocks(q, k, v, rows, mask, is_causal, window, scale, dropout_p)


def _longformer_blocks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    window: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """The torch path: `local`'s blocked window with the global keys `rows` (`[g]` long) appended to every block,
    then the global queries against the whole sequence."""
    b, _, n, _ = q.shape
    layout = window_layout(n, window, is_causal)
    keep = layout.keep(mask, q.device)  # [b or 1, k * w]
    attn_mask = layout.window_keep(keep)[:, :, None, None, :] & band_keep(layout.offsets(q.device), window, is_causal)
    if len(rows):
        # Global keys join every block's keys, except for queries whose window already holds them.
        offsets = layout.query_positions(q.device)[..., None] - rows  # [k, w, g]
        outside = ~band_keep(offsets, window, is_causal)
        if is_causal:
            outside &= offsets >= 0
        global_mask = keep[:, rows][:, None, None, None, :] & outside[None, :, None]  # [b, k, 1, w, g]
        attn_mask = torch.cat([attn_mask, global_mask], dim=-1)
    keys = layout.windows(k, extra=k[:, :, rows] if len(rows) else None)
    values = layout.windows(v, extra=v[:, :, rows] if len(rows) else None)
    out = F.scaled_dot_product_attention(
        layout.blocks(q), keys, values, attn_mask=as_sdpa_mask(attn_mask, b), dropout_p=dropout_p, scale=scale
    )
    out = layout.unblock(out, b)
    if len(rows):
        # Global queries attend to the whole sequence.
        out_rows = rows_attention(q, k, v, rows, keep[:, :n], is_causal, scale, dropout_p)
        out = out.index_copy(2, rows, out_rows)
    return out


def _check_global_indices(global_indices: Sequence[int], n: int) -> None:
    """Global positions must lie inside the sequence of `n` tokens."""
    if any(index >= n for index in global_indices):
        raise ValueError(f"global_indices {tuple(global_indices)} reach past the sequence length {n}")


@register_attention("longformer")
class LongformerAttention(AttentionBase):
    """Sliding window of `window` (default 256) each side + global positions (default the class token, 0);
    `reference=True`: the dense reference."""

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"window": 8, "global_indices": (0, 20)}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        window: int = 256,
        global_indices: Sequence[int] = (0,),
        backend: Literal["auto", "torch", "flex"] = "auto",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.window = check_int("window", window, 1)
        indices = tuple(global_indices)
        for index in indices:
            check_int("each of global_indices", index, 0)
        if len(set(indices)) != len(indices):
            raise ValueError(f"global_indices={indices} repeats a position; give each position once")
        self.global_indices = indices
        self.reference = check_bool("reference", reference)
        self.backend = check_backend(backend, self.attn_drop.p, self.reference)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        _check_global_indices(self.global_indices, q.shape[-2])
        kernel = _kernel_applies(q, mask, dropout_p, self.window, self.global_indices)
        path = choose_path(
            q, reference=self.reference, backend=self.backend, dropout_p=dropout_p, flex=True, kernel=kernel
        )
        return _longformer_on(path, q, k, v, mask, is_causal, self.window, self.global_indices, self.scale, dropout_p)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, window={self.window}, global_indices={self.global_indices}, "
            f"backend={self.backend!r}"
        )
