"""Exact softmax attention: "Attention Is All You Need" (Vaswani et al. 2017), https://arxiv.org/abs/1706.03762

    out = softmax(q k^T * scale + mask) v,    scale = d^-1/2

The baseline every other variant is measured against. `softmax_reference` writes the equation out (the tests'
oracle); the torch path is `F.scaled_dot_product_attention` (flash / memory-efficient kernels on GPU).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool
from ._common import AttentionBase
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = ["SoftmaxAttention", "softmax_attention", "softmax_reference"]


def causal_keep(n: int, m: int, device: torch.device) -> Tensor:
    """`[n, m]` bool, True where query i may see key j (j <= i, aligned at the end when m > n)."""
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(m - n)


def softmax_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The equation written out: scores, mask, softmax.

    q: `[b, h, n, d]`, k and v: `[b, h, m, d]`; mask: bool (True = keep) or additive, broadcastable to
    `[b, h, n, m]` -> `[b, h, n, d]`.
    """
    scores = (q * (scale or q.shape[-1] ** -0.5)) @ k.transpose(-2, -1)  # [b, h, n, m]
    if is_causal:
        scores = scores.masked_fill(~causal_keep(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = F.dropout(scores.softmax(dim=-1), p=dropout_p)
    return weights @ v


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    *,
    reference: bool = False,
) -> Tensor:
    """Exact attention on the path `choose_path` picks: `softmax_reference` with `reference=True`, else SDPA.

    q: `[b, h, n, d]`, k and v: `[b, h, m, d]`; mask: bool (True = keep) or additive, broadcastable to
    `[b, h, n, m]` -> `[b, h, n, d]`.
    """
    if mask is not None and is_causal:
        causal = causal_keep(q.shape[-2], k.shape[-2], q.device)
        mask = mask & causal if mask.dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))
        is_causal = False
    if choose_path(q, reference=reference) is Path.REFERENCE:
        return softmax_reference(q, k, v, mask, is_causal, scale, dropout_p)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )


@register_attention("softmax")
class SoftmaxAttention(AttentionBase):
    """Exact multi-head attention; takes any mask SDPA takes (key padding, `[b, 1, n, m]`, additive).

    `reference=True`: the explicit pure-PyTorch path the tests compare with (otherwise SDPA).
    """

    supports_causal = True
    has_attention_weights = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.reference = check_bool("reference", reference)

    def prepare_mask(self, attn_mask: Tensor | None, batch: int, length: int) -> Tensor | None:
        if attn_mask is not None and attn_mask.dim() == 2:
            return attn_mask[:, None, None, :]
        return attn_mask

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        return softmax_attention(q, k, v, mask, is_causal, self.scale, dropout_p, reference=self.reference)
