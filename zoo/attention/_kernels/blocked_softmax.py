"""The blocked softmax kernel of the projection family (`linformer.blocked_attention`, used by Linformer's and
Nystromformer's short-sided attentions): blocks of queries and keys, an online softmax over the key blocks, and a
hand-written backward that recomputes the weights from the saved log-normaliser, as flash attention does, so no
`[n, m]` tensor is ever stored.

Letter legend: b - batch, h - heads, n - queries, m - keys, d - head dim, e - value dim.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._workspace import first_order_only, rows_per_block, unwritten

__all__ = ["BlockedAttention"]


# Bytes of one `[b h, w_q, w_k]` block of logits in `BlockedAttention`: small enough to stay in cache and to be
# reused (a fresh `[n, r]` buffer costs page faults as dear as the exp on it), large enough to keep the op count low.
_BLOCK_BYTES = 2**22
# Most keys per block: the long side of a `[few, n]` attention is cut into blocks of this many keys.
_MAX_KEY_BLOCK = 1024


def _key_blocks(m: int) -> list[slice]:
    width = min(m, _MAX_KEY_BLOCK)
    return [slice(start, min(start + width, m)) for start in range(0, m, width)]


class BlockedAttention(torch.autograd.Function):
    """`softmax(q k^T) v` over the kept keys: q `[b, h, n, d]`, k `[b, h, m, d]`, v `[b, h, m, e]`, keep `[b, m]`
    bool or None -> `[b, h, n, e]` laid out as `[b, n, h, e]`."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None):
        b, h, n, _ = q.shape
        m, e = k.shape[-2], v.shape[-1]
        key_blocks = _key_blocks(m)
        wk = key_blocks[0].stop
        wq = rows_per_block(n, b * h * wk * q.element_size(), _BLOCK_BYTES, q.device)
        scores_ws = unwritten(q, (b * h * wq * wk,))
        drop = None if keep is None else ~keep[:, None, None, :]  # [b, 1, 1, m]
        floor = torch.finfo(q.dtype).min
        out = unwritten(q, (b, n, h, e)).permute(0, 2, 1, 3)
        lse = unwritten(q, (b, h, n, 1))
        k_t = k.transpose(-2, -1)
        for start in range(0, n, wq):
            qrows = slice(start, min(start + wq, n))
            w = qrows.stop - qrows.start
            q_rows = q[:, :, qrows]
            row_max = row_sum = acc = None
            for keys in key_blocks:
                scores = torch.matmul(
                    q_rows, k_t[..., keys], out=scores_ws[: b * h * w * (keys.stop - keys.start)].view(b, h, w, -1)
                )
                if drop is not None:
                    scores.masked_fill_(drop[..., keys], floor)
                block_max = scores.amax(-1, keepdim=True)
                if row_max is None:
                    new_max = block_max
                else:
                    new_max = torch.maximum(row_max, block_max)
                    correction = torch.exp(row_max - new_max)
                    row_sum.mul_(correction)
                    acc.mul_(correction)
                weights = scores.sub_(new_max).exp_()
                if drop is not None:
                    weights.masked_fill_(drop[..., keys], 0.0)
                block_sum = weights.sum(-1, keepdim=True)
                if acc is None:
                    row_sum, acc = block_sum, torch.matmul(weights, v[:, :, keys])
                else:
                    row_sum.add_(block_sum)
                    acc.add_(torch.matmul(weights, v[:, :, keys]))
                row_max = new_max
            # A query with no kept key: weights all zero, sum 0 -> output 0 (and lse +inf: zero weights in backward).
            # copy_ rather than out=: torch.compile cannot trace an `out=` view that is not contiguous
            out[:, :, qrows] = acc.div_(row_sum.clamp_min(torch.finfo(q.dtype).tiny))
            lse[:, :, qrows] = row_max.add_(row_sum.log())
        lse.masked_fill_(lse == float("-inf"), float("inf"))
        ctx.save_for_backward(q, k, v, keep, out, lse)
        ctx.blocks = (wq, wk)
        return out

    @staticmethod
    @first_order_only
    def backward(ctx, grad_out: Tensor):
        q, k, v, keep, out, lse = ctx.saved_tensors
        wq, wk = ctx.blocks
        b, h, n, _ = q.shape
        m = k.shape[-2]
        key_blocks = _key_blocks(m)
        scores_ws, grad_ws = unwritten(q, (b * h * wq * wk,)), unwritten(q, (b * h * wq * wk,))
        drop = None if keep is None else ~keep[:, None, None, :]
        grad_q = unwritten(q, q.shape)
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
        k_t = k.transpose(-2, -1)
        for start in range(0, n, wq):
            qrows = slice(start, min(start + wq, n))
            w = qrows.stop - qrows.start
            q_rows, grad_rows = q[:, :, qrows], grad_out[:, :, qrows]
            # sum_j p_ij dp_ij = grad_out_i . out_i (the softmax backward's row term).
            delta = (grad_rows * out[:, :, qrows]).sum(-1, keepdim=True)
            grad_q_rows = None
            for keys in key_blocks:
                shape = (b, h, w, keys.stop - keys.start)
                size = math.prod(shape)
                weights = torch.matmul(q_rows, k_t[..., keys], out=scores_ws[:size].view(shape))
                weights = weights.sub_(lse[:, :, qrows]).exp_()
                if drop is not None:
                    weights.masked_fill_(drop[..., keys], 0.0)
                grad_v[:, :, keys] += torch.matmul(weights.transpose(-2, -1), grad_rows)
                grad_scores = torch.matmul(grad_rows, v[:, :, keys].transpose(-2, -1), out=grad_ws[:size].view(shape))
                grad_scores = grad_scores.sub_(delta).mul_(weights)
                grad_k[:, :, keys] += torch.matmul(grad_scores.transpose(-2, -1), q_rows)
                part = torch.matmul(grad_scores, k[:, :, keys])
                grad_q_rows = part if grad_q_rows is None else grad_q_rows.add_(part)
            grad_q[:, :, qrows] = grad_q_rows
        return grad_q, grad_k, grad_v, None
