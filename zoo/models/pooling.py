"""Pooling of the 1-D backbone `[b, n, d] -> [b, d]`, every one ignoring padded positions: the class token, the mean
of kept tokens, or attention pooling (a learned query scores each token through a small MLP, softmax over kept
tokens; Yang et al. 2016, https://aclanthology.org/N16-1174). The task heads are the tasks' (`zoo.tasks.heads`).

Letter legend: b - batch, n - tokens, d - model dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["POOLS", "AttentionPool", "masked_mean"]

POOLS = ("cls", "mean", "attention")


def masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """Mean over kept tokens: `x: [b, n, d]`, mask `[b, n]` -> `[b, d]` (zero for a sample with none kept)."""
    if mask is None:
        return x.mean(1)
    keep = mask[..., None].to(x.dtype)
    # masked_fill, not a product: a NaN or inf at a padded position must not reach the sum.
    total = x.masked_fill(~mask[..., None], 0.0).sum(1)
    return total / keep.sum(1).clamp_min(1.0)


class AttentionPool(nn.Module):
    """`score_i = u . tanh(W x_i + b)`, `a = softmax(score)` over kept tokens, summary `sum_i a_i x_i`."""

    def __init__(self, dim: int, *, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or dim
        self.fc = nn.Linear(dim, hidden)
        self.query = nn.Parameter(torch.randn(hidden) * hidden**-0.5)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """`x: [b, n, d]`, mask `[b, n]` -> `[b, d]`."""
        scores = torch.tanh(self.fc(x)) @ self.query
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
            # A sample with no kept token would give NaN weights; it gets zero weights instead.
            scores = scores.masked_fill(~mask.any(1, keepdim=True), 0.0)
        weights = scores.float().softmax(-1).to(x.dtype)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
            x = x.masked_fill(~mask[..., None], 0.0)
        return torch.einsum("bn,bnd->bd", weights, x)
