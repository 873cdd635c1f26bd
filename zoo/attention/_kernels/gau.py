"""The chunk kernel of GAU / FLASH (`zoo.attention.gau`): squared-ReLU attention inside each chunk, a few chunks
at a time, with a hand-written backward that recomputes the scores instead of keeping them.

Letter legend: c - chunks (of every sample and head), w - chunk length, s - query/key width, e - value width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._workspace import unwritten

__all__ = ["ChunkReluSquare", "relu_square"]


# Chunks per pass of `ChunkReluSquare`, by the bytes of their score matrices: small enough that the scores and
# their gradients reuse the same memory pass after pass (no page faults on fresh [n, w] buffers at long lengths).
_PASS_BYTES = 8 << 20


class ChunkReluSquare(torch.autograd.Function):
    """`relu(q k^T * inv_scale)^2 v` per chunk, a few chunks at a time, the scores recomputed in the backward
    instead of kept: memory O(n * w) only for q, k, v and the output, and every temporary chunk-sized.

    q, k `[c, w, s]`, v `[c, w, e]`, inv_scale `[c, 1, 1]` -> `[c, w, e]`. With R = relu(S), S = q k^T inv_scale,
    W = R^2 (lower triangle when causal): dV = W^T dO, dS = (dO V^T) * 2 R * inv_scale (masked like W),
    dQ = dS K, dK = dS^T Q.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, inv_scale: Tensor, is_causal: bool) -> Tensor:
        ctx.save_for_backward(q, k, v, inv_scale)
        ctx.is_causal = is_causal
        out = unwritten(v, v.shape)
        for rows in _passes(q):
            weights, _ = relu_square(q[rows], k[rows], inv_scale[rows], is_causal)
            torch.bmm(weights, v[rows], out=out[rows])
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, inv_scale = ctx.saved_tensors
        grad_q, grad_k, grad_v = (unwritten(x, x.shape) for x in (q, k, v))
        for rows in _passes(q):
            weights, relu = relu_square(q[rows], k[rows], inv_scale[rows], ctx.is_causal)
            torch.bmm(weights.transpose(1, 2), grad_out[rows], out=grad_v[rows])
            grad_scores = torch.bmm(grad_out[rows], v[rows].transpose(1, 2)).mul_(relu).mul_(2 * inv_scale[rows])
            if ctx.is_causal:
                grad_scores.tril_()
            torch.bmm(grad_scores, k[rows], out=grad_q[rows])
            torch.bmm(grad_scores.transpose(1, 2), q[rows], out=grad_k[rows])
        return grad_q, grad_k, grad_v, None, None


def _passes(q: Tensor) -> list[slice]:
    """Runs of chunks `[c, w, s]` whose `[w, w]` scores fill about `_PASS_BYTES`."""
    size = max(1, _PASS_BYTES // (q.shape[1] ** 2 * q.element_size()))
    return [slice(first, first + size) for first in range(0, q.shape[0], size)]


def relu_square(q: Tensor, k: Tensor, inv_scale: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    """Chunk weights relu(q k^T * inv_scale)^2 (lower triangle when causal) and relu(...) itself."""
    relu = torch.bmm(q, k.transpose(1, 2)).mul_(inv_scale).relu_()
    weights = relu.square()
    return (weights.tril_() if is_causal else weights), relu
