"""Softmax-one: "Attention Is Off By One" (Miller 2023), https://www.evanmiller.org/attention-is-off-by-one.html

Exact attention with the off-by-one softmax `softmax1(x)_i = exp(x_i) / (1 + sum_j exp(x_j))`:

    out_i = sum_j exp(s_ij) / (1 + sum_j' exp(s_ij')) v_j,    s = q k^T * scale

A head may give (almost) no weight to every key, instead of being forced to spread a full unit of weight.
`softmax1_reference` computes the weights through a logsumexp (the tests' oracle). It equals ordinary softmax over
the keys plus one extra key with logit 0 and value 0, which is the torch path: SDPA (flash kernels) on keys and
values with a zero row prepended.
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
from .softmax import causal_keep, softmax_attention

__all__ = ["Softmax1Attention", "softmax1_attention", "softmax1_reference"]


def softmax1_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The weights written out through a logsumexp.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. Padded keys
    (and, causally, later keys) are left out of the sum; a query that sees no key outputs zero.
    """
    dtype = torch.promote_types(q.dtype, torch.float32)
    scores = (q.to(dtype) * (scale or q.shape[-1] ** -0.5)) @ k.to(dtype).transpose(-2, -1)  # [b, h, n, n]
    keep = None
    if is_causal:
        keep = causal_keep(q.shape[-2], k.shape[-2], q.device)
    if mask is not None:
        keep = mask[:, None, None, :] if keep is None else keep & mask[:, None, None, :]
    if keep is not None:
        # The lowest finite value, not -inf: a row that sees no key then has zero weights and finite gradients.
        scores = scores.masked_fill(~keep, torch.finfo(dtype).min)
    # log(1 + sum_j exp(s_j)): the logsumexp over the keys and one more logit 0.
    log_norm = torch.logaddexp(scores.logsumexp(dim=-1, keepdim=True), scores.new_zeros(()))
    weights = F.dropout(torch.exp(scores - log_norm), p=dropout_p)
    return (weights @ v.to(dtype)).to(v.dtype)


def softmax1_attention(
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
    """Off-by-one softmax attention on the path `choose_path` picks: `softmax1_reference` with `reference=True`.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. The torch path
    prepends one zero key and value, and a dummy zero query too, so causal attention stays square and aligned
    (query i + 1 sees the zero key and keys 0..i) and runs on SDPA's `is_causal` path.
    """
    if choose_path(q, reference=reference) is Path.REFERENCE:
        return softmax1_reference(q, k, v, mask, is_causal, scale, dropout_p)
    b, h, _, d = q.shape
    zero = q.new_zeros(b, h, 1, d)
    q1, k1, v1 = (torch.cat([zero, t], dim=-2) for t in (q, k, v))
    mask1 = None
    if mask is not None:
        mask1 = F.pad(mask, (1, 0), value=True)[:, None, None, :]
    return softmax_attention(q1, k1, v1, mask1, is_causal, scale, dropout_p)[:, :, 1:]


@register_attention("softmax1")
class Softmax1Attention(AttentionBase):
    """Exact multi-head attention with the off-by-one softmax; `reference=True` selects the explicit reference."""

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

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        return softmax1_attention(q, k, v, mask, is_causal, self.scale, dropout_p, reference=self.reference)
