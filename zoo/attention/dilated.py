"""Dilated (atrous) sliding-window attention, after the strided pattern of "Generating Long Sequences with Sparse
Transformers" (Child et al. 2019), https://arxiv.org/abs/1904.10509, as "Atrous Self Attention" and Longformer's
dilated sliding window (Beltagy et al. 2020, https://arxiv.org/abs/2004.05150).

Query i attends to the keys j with i - j a multiple of `dilation` and |i - j| <= `window` (causal:
0 <= i - j <= window): `window // dilation + 1` keys each side, spread over the `window` span. Positions are
regrouped by i mod dilation, where the pattern is a plain sliding window of `window // dilation` steps, computed
blocked by `local_attention`: memory and time O(n * window / dilation). `dilation=1` is `local`; a window
covering the sequence with dilation 1 is exact softmax attention. `reference=True` computes the pattern as a dense
`[n, n]` mask over exact softmax, for the tests.
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
from ._flash_parts import band_parts, on_kept_prefixes, parts_attention, prefix_lengths, use_flash_parts
from ._flex import FlexMask, check_backend, flex_attend, use_flex
from ._registry import register_attention
from .local import local_attention

__all__ = ["DilatedAttention", "dilated_allowed", "dilated_attention", "dilated_mask"]


def dilated_allowed(offsets: Tensor, window: int, dilation: int, is_causal: bool) -> Tensor:
    """True where query - key `offsets` (any shape) lie in the window, a multiple of `dilation` apart."""
    return band_keep(offsets, window, is_causal) & (offsets % dilation == 0)


@functools.lru_cache(maxsize=64)
def dilated_mask(window: int, dilation: int, is_causal: bool = False) -> FlexMask:
    """The FlexAttention pattern, `dilated_allowed` on i - j."""

    def mask_mod(b, h, q_idx, kv_idx):
        return dilated_allowed(q_idx - kv_idx, window, dilation, is_causal)

    return FlexMask(mask_mod)


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
    """Dilated sliding-window attention.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. Any n: the
    sequence is padded to a multiple of `dilation` (and to whole blocks) inside and the output unpadded.
    `reference=True`: the pattern as a dense mask (`allowed_attention`), O(n^2).
    """
    if window < dilation:
        raise ValueError(f"window={window} is shorter than dilation={dilation}: no key but the query itself")
    b, _, n, d = q.shape
    if reference:
        allowed = dilated_allowed(position_offsets(n, q.device), window, dilation, is_causal)
        return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)
    if dilation == 1:
        return local_attention(q, k, v, mask, is_causal, window=window, scale=scale, dropout_p=dropout_p)
    lengths = prefix_lengths(q, mask, dropout_p)
    if lengths is not None:
        run = functools.partial(dilated_attention, is_causal=is_causal, window=window, dilation=dilation, scale=scale)
        return on_kept_prefixes(run, q, k, v, lengths)
    if use_flash_parts(q, mask, dropout_p, min(window // dilation, n // dilation)):
        return _dilated_flash(q, k, v, is_causal, window // dilation, dilation, d**-0.5 if scale is None else scale)
    (q, pad), (k, _), (v, _) = (pad_to_multiple(x, dilation) for x in (q, k, v))
    if mask is not None or pad:
        mask = torch.ones(b, n, dtype=torch.bool, device=q.device) if mask is None else mask
        mask = rearrange(F.pad(mask, (0, pad), value=False), "b (t r) -> (b r) t", r=dilation)
    # Residue class i mod dilation becomes a batch entry: b, h, (t r), d -> (b r), h, t, d.
    q, k, v = (rearrange(x, "b h (t r) d -> (b r) h t d", r=dilation) for x in (q, k, v))
    out = local_attention(q, k, v, mask, is_causal, window=window // dilation, scale=scale, dropout_p=dropout_p)
    return rearrange(out, "(b r) h t d -> b h (t r) d", b=b)[:, :, :n]


def _dilated_flash(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, steps: int, dilation: int, scale: float):
    """The flash-parts path: residue classes as a batch dim, `[b, h, (t r), d] -> [b, r, h, t, d]` (views when
    n is a multiple of `dilation`), the output laid out `[b, t, r, h, d]` so that regrouping it is a view too."""
    n = q.shape[2]
    t, rem = divmod(n, dilation)
    if rem:
        # Residues below `rem` hold t + 1 positions, the others t: two calls on views of the padded sequence.
        q, k, v = (F.pad(x, (0, 0, 0, dilation - rem)) for x in (q, k, v))
    q, k, v = (rearrange(x, "b h (t r) d -> b r h t d", r=dilation) for x in (q, k, v))
    if not rem:
        out = parts_attention(q, k, v, band_parts(t, steps, is_causal, q.device, q.dtype), scale)
        return rearrange(out, "b r h t d -> b h (t r) d")
    long = parts_attention(
        *(x[:, :rem] for x in (q, k, v)), band_parts(t + 1, steps, is_causal, q.device, q.dtype), scale
    )
    short = parts_attention(
        *(x[:, rem:, :, :t] for x in (q, k, v)), band_parts(t, steps, is_causal, q.device, q.dtype), scale
    )
    out = torch.cat([long, F.pad(short, (0, 0, 0, 1))], dim=1)
    return rearrange(out, "b r h t d -> b h (t r) d")[:, :, :n]


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
        if not self.reference and use_flex(self.backend, q, dropout_p):
            pattern = dilated_mask(self.window, self.dilation, is_causal)
            return flex_attend(q, k, v, pattern, mask, scale=self.scale)
        return dilated_attention(
            q,
            k,
            v,
            mask,
            is_causal,
            window=self.window,
            dilation=self.dilation,
            scale=self.scale,
            dropout_p=dropout_p,
            reference=self.reference,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, dilation={self.dilation}, backend={self.backend!r}"
