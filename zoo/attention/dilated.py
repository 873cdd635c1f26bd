"""Dilated (atrous) sliding-window attention, after the strided pattern of "Generating Long Sequences with Sparse
Transformers" (Child et al. 2019), https://arxiv.org/abs/1904.10509, as "Atrous Self Attention" and Longformer's
dilated sliding window (Beltagy et al. 2020, https://arxiv.org/abs/2004.05150).

    out_i = sum_{j in W(i)} softmax_j(q_i . k_j * scale) v_j,
    W(i) = {j : |i - j| <= window and (i - j) mod dilation = 0}      (causal: 0 <= i - j <= window)

`window // dilation + 1` keys each side, spread over the `window` span; `dilation=1` is `local`. `dilated_reference`
writes this out on dense `[n, n]` scores. Faster paths (`choose_path` picks one per call): FlexAttention; the CPU
flash parts (`_kernels.windowed.dilated_parts`); and the torch path here, which regroups the positions by
i mod dilation, where the pattern is a plain sliding window of `window // dilation` steps computed by
`local_attention`: memory and time O(n * window / dilation). A window covering the sequence with dilation 1 is
exact softmax attention.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from .._validate import check_bool, check_int
from ._blocks import allowed_attention, band_keep, position_offsets
from ._common import AttentionBase, pad_to_multiple
from ._flex import FlexMask, check_backend, flex_attend
from ._kernels.flash_parts import on_kept_prefixes, parts_apply, prefix_lengths
from ._kernels.windowed import dilated_parts
from ._paths import Path, choose_path
from ._registry import register_attention
from .local import local_attention

__all__ = ["DilatedAttention", "dilated_allowed", "dilated_attention", "dilated_mask", "dilated_reference"]


def dilated_allowed(offsets: Tensor, window: int, dilation: int, is_causal: bool) -> Tensor:
    """True where query - key `offsets` (any shape) lie in the window, a multiple of `dilation` apart."""
    return band_keep(offsets, window, is_causal) & (offsets % dilation == 0)


@functools.lru_cache(maxsize=64)
def dilated_mask(window: int, dilation: int, is_causal: bool = False) -> FlexMask:
    """The FlexAttention pattern, `dilated_allowed` on i - j."""

    def mask_mod(b, h, q_idx, kv_idx):
        return dilated_allowed(q_idx - kv_idx, window, dilation, is_causal)

    return FlexMask(mask_mod)


def dilated_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 256,
    dilation: int = 2,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The equation on dense scores, O(n^2): the tests' oracle.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`.
    """
    allowed = dilated_allowed(position_offsets(q.shape[-2], q.device), window, dilation, is_causal)  # [n, n]
    return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)


def dilated_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 256,
    dilation: int = 2,
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Dilated sliding-window attention on the path `choose_path` picks (FlexAttention is the module's).

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. Any n: the
    sequence is padded to a multiple of `dilation` (and to whole blocks) inside and the output unpadded.
    `reference=True`: `dilated_reference`.
    """
    if window < dilation:
        raise ValueError(f"window={window} is shorter than dilation={dilation}: no key but the query itself")
    path = choose_path(q, reference=reference, kernel=_kernel_applies(q, mask, dropout_p, window, dilation))
    return _dilated_on(path, q, k, v, mask, is_causal, window, dilation, scale, dropout_p)


def _kernel_applies(q: Tensor, mask: Tensor | None, dropout_p: float, window: int, dilation: int):
    """`choose_path`'s `kernel` predicate: the flash parts take the residue classes' windows (dilation 1 is
    `local_attention`'s, which chooses its own path)."""
    n = q.shape[-2]
    return lambda: dilation > 1 and parts_apply(q, mask, dropout_p, min(window // dilation, n // dilation))


def _dilated_on(
    path: Path,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    window: int,
    dilation: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """Dilated sliding-window attention on `path`."""
    if path is Path.REFERENCE:
        return dilated_reference(
            q, k, v, mask, is_causal, window=window, dilation=dilation, scale=scale, dropout_p=dropout_p
        )
    if path is Path.FLEX:
        return flex_attend(q, k, v, dilated_mask(window, dilation, is_causal), mask, scale=scale)
    if dilation == 1:
        return local_attention(q, k, v, mask, is_causal, window=window, scale=scale, dropout_p=dropout_p)
    if path is Path.KERNEL:
        lengths = prefix_lengths(q, mask, dropout_p)
        if lengths is not None:
            run = functools.partial(
                dilated_attention, is_causal=is_causal, window=window, dilation=dilation, scale=scale
            )
            return on_kept_prefixes(run, q, k, v, lengths)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return dilated_parts(q, k, v, is_causal, window // dilation, dilation, scale)
    return _dilated_regrouped(q, k, v, mask, is_causal, window, dilation, scale, dropout_p)


def _dilated_regrouped(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    window: int,
    dilation: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """The torch path: residue class i mod dilation as a batch entry, a sliding window of `window // dilation`
    steps in each (`local_attention`)."""
    b, _, n, _ = q.shape
    (q, pad), (k, _), (v, _) = (pad_to_multiple(x, dilation) for x in (q, k, v))
    if mask is not None or pad:
        mask = torch.ones(b, n, dtype=torch.bool, device=q.device) if mask is None else mask
        mask = rearrange(F.pad(mask, (0, pad), value=False), "b (t r) -> (b r) t", r=dilation)
    # Residue class i mod dilation becomes a batch entry: b, h, (t r), d -> (b r), h, t, d.
    q, k, v = (rearrange(x, "b h (t r) d -> (b r) h t d", r=dilation) for x in (q, k, v))
    out = local_attention(q, k, v, mask, is_causal, window=window // dilation, scale=scale, dropout_p=dropout_p)
    return rearrange(out, "(b r) h t d -> b h (t r) d", b=b)[:, :, :n]


@register_attention("dilated")
class DilatedAttention(AttentionBase):
    """Dilated sliding window: keys at multiples of `dilation` (default 2) within `window` (default 256);
    `reference=True`: the dense reference."""

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"window": 12, "dilation": 3}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        window: int = 256,
        dilation: int = 2,
        backend: Literal["auto", "torch", "flex"] = "auto",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.window = check_int("window", window, 1)
        self.dilation = check_int("dilation", dilation, 1)
        self.reference = check_bool("reference", reference)
        self.backend = check_backend(backend, self.attn_drop.p, self.reference)
        if window < dilation:
            raise ValueError(f"window={window} is shorter than dilation={dilation}; use window >= dilation")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        kernel = _kernel_applies(q, mask, dropout_p, self.window, self.dilation)
        path = choose_path(
            q, reference=self.reference, backend=self.backend, dropout_p=dropout_p, flex=True, kernel=kernel
        )
        return _dilated_on(path, q, k, v, mask, is_causal, self.window, self.dilation, self.scale, dropout_p)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, dilation={self.dilation}, backend={self.backend!r}"
