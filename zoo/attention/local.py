"""Sliding-window (local) attention, computed in blocks.

Each query attends to the keys within `window` positions on either side, |i - j| <= window (causal:
0 <= i - j <= window), as in the local attention baseline of "Long Range Arena" (Tay et al. 2020),
https://arxiv.org/abs/2011.04006, and the sliding window of "Longformer" (Beltagy et al. 2020),
https://arxiv.org/abs/2004.05150. The sequence is cut into blocks of the window length, each block attends to
itself and its neighbour blocks, and a band mask keeps the exact window: memory and time O(n * window), no
n x n tensor. A window as long as the sequence is exact softmax attention. `reference=True` computes the window
as a dense `[n, n]` mask over exact softmax, for the tests.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._blocks import allowed_attention, as_sdpa_mask, band_keep, position_offsets, window_layout
from ._common import AttentionBase
from ._flash_parts import band_parts, on_kept_prefixes, parts_attention, prefix_lengths, use_flash_parts
from ._flex import FlexMask, check_backend, flex_attend, use_flex
from ._registry import register_attention

__all__ = ["LocalAttention", "local_attention", "local_mask"]


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 256,
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Sliding-window attention.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. Any n: the
    sequence is padded to whole blocks inside and the output unpadded. `reference=True`: the window as a dense
    mask (`allowed_attention`), O(n^2).
    """
    b, _, n, d = q.shape
    if reference:
        allowed = band_keep(position_offsets(n, q.device), window, is_causal)
        return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)
    lengths = prefix_lengths(q, mask, dropout_p)
    if lengths is not None:
        run = functools.partial(local_attention, is_causal=is_causal, window=window, scale=scale)
        return on_kept_prefixes(run, q, k, v, lengths)
    if use_flash_parts(q, mask, dropout_p, min(window, n)):
        scale = d**-0.5 if scale is None else scale
        return parts_attention(q, k, v, band_parts(n, window, is_causal, q.device, q.dtype), scale)
    layout = window_layout(n, window, is_causal)
    keep = layout.window_keep(layout.keep(mask, q.device))  # [b, k, (s w)]
    keep = keep[:, :, None, None, :] & band_keep(layout.offsets(q.device), window, is_causal)[None]
    out = F.scaled_dot_product_attention(
        layout.blocks(q),
        layout.windows(k),
        layout.windows(v),
        attn_mask=as_sdpa_mask(keep, b),
        dropout_p=dropout_p,
        scale=scale,
    )
    return layout.unblock(out, b)


@functools.lru_cache(maxsize=64)
def local_mask(window: int, is_causal: bool = False) -> FlexMask:
    """The FlexAttention pattern: |i - j| <= window (causal: 0 <= i - j <= window), as `band_keep`."""

    def mask_mod(b, h, q_idx, kv_idx):
        return band_keep(q_idx - kv_idx, window, is_causal)

    return FlexMask(mask_mod)


@register_attention("local")
class LocalAttention(AttentionBase):
    """Sliding-window attention: `window` positions each side (behind, when causal), default 256;
    `reference=True`: the dense reference."""

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"window": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        window: int = 256,
        backend: Literal["auto", "torch", "flex"] = "auto",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.window = check_int("window", window, 1)
        self.reference = check_bool("reference", reference)
        self.backend = check_backend(backend, self.attn_drop.p, self.reference)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        if not self.reference and use_flex(self.backend, q, dropout_p):
            return flex_attend(q, k, v, local_mask(self.window, is_causal), mask, scale=self.scale)
        return local_attention(
            q,
            k,
            v,
            mask,
            is_causal,
            window=self.window,
            scale=self.scale,
            dropout_p=dropout_p,
            reference=self.reference,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, backend={self.backend!r}"
