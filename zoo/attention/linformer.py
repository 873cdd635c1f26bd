"""Linformer: "Linformer: Self-Attention with Linear Complexity" (Wang et al. 2020), https://arxiv.org/abs/2006.04768

Keys and values are projected along the sequence by learned `E, F: [r, max_seq_len]` (r = `k` in the paper) before
exact attention, so the attention matrix is `[n, r]` and cost is linear in n. An input shorter than
`max_seq_len` uses the leading n columns of E and F; a longer one is an error. Padded keys and values are zeroed
before the projection, so they add nothing to any projected key or value.

Sharing (paper section 4): `share="none"` is the paper's headwise sharing (one E and one F per layer, shared by
its heads); `"kv"` uses E for values too (F = E); `"layerwise"` shares one E across every layer of a model, for
keys and values. See `LinformerAttention` for how layerwise sharing finds "every layer of a model".

This file also holds the sequence-length check, the masked softmax and the blocked attention the projection-family
files (nystrom, synthesizer) share. `reference=True` runs the `[n, r]` attention as an explicit softmax instead of SDPA.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from .._validate import check_bool, check_int
from ._common import AttentionBase, masked_fill_keys
from ._registry import register_attention
from ._workspace import exporting, first_order_only, rows_per_block, unwritten
from .softmax import softmax_attention

__all__ = [
    "LinformerAttention",
    "blocked_attention",
    "check_seq_len",
    "linformer_attention",
    "masked_softmax",
]

SHARING = ("none", "kv", "layerwise")


def check_seq_len(attention: str, length: int, max_seq_len: int) -> None:
    """ValueError for an input longer than the `max_seq_len` a variant was built for."""
    if length > max_seq_len:
        raise ValueError(
            f"attention {attention!r} was built with max_seq_len={max_seq_len} but got a sequence of {length} "
            f"tokens; build it with max_seq_len >= {length}"
        )


def masked_softmax(logits: Tensor, keep: Tensor | None) -> Tensor:
    """Softmax over the last dim of `logits` where `keep` (bool, broadcastable, True = keep) allows.

    Dropped entries get exactly zero weight and add nothing to the normaliser; a row with nothing kept is all
    zeros (not NaN, not uniform), with finite gradients.
    """
    if keep is None:
        return logits.softmax(dim=-1)
    weights = logits.masked_fill(~keep, torch.finfo(logits.dtype).min).softmax(dim=-1)
    return weights * keep


# Bytes of one `[b h, w_q, w_k]` block of logits in `blocked_attention`: small enough to stay in cache and to be
# reused (a fresh `[n, r]` buffer costs page faults as dear as the exp on it), large enough to keep the op count low.
_BLOCK_BYTES = 2**22
# Most keys per block: the long side of a `[few, n]` attention is cut into blocks of this many keys.
_MAX_KEY_BLOCK = 1024


def blocked_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None = None) -> Tensor:
    """`softmax(q k^T) v` over the kept keys (no scale: fold it into q or k), never storing `[n, m]`.

    q: `[b, h, n, d]`, k: `[b, h, m, d]`, v: `[b, h, m, e]`, keep: `[b, m]` bool (True = keep) or None -> `[b, h, n, e]`
    (laid out as `[b, n, h, e]`, so merging the heads is a view). Meant for the projection family, where one
    side is short (r landmarks or projected keys): blocks of queries and keys, online softmax over the key
    blocks, the weights recomputed in backward from the saved log-normaliser (as flash attention does). A
    query with no kept key gets zeros, as `masked_softmax` gives. Computed in q's dtype. Under `torch.export`, whose
    tracing refuses the blocks' `out=` workspaces, the `[n, m]` weights are formed instead.
    """
    if exporting():
        return masked_softmax(q @ k.transpose(-2, -1), None if keep is None else keep[:, None, None, :]) @ v
    return _BlockedAttention.apply(q, k, v, keep)


def _key_blocks(m: int) -> list[slice]:
    width = min(m, _MAX_KEY_BLOCK)
    return [slice(start, min(start + width, m)) for start in range(0, m, width)]


class _BlockedAttention(torch.autograd.Function):
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


def linformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    f: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Linformer attention `softmax(q (E k)^T * scale) (F v)`.

    q, k, v: `[b, h, n, d]`; e, f: `[r, n]` (the leading n columns of the `[r, max_seq_len]` projections);
    mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. The `[n, r]` attention runs on SDPA, or
    as an explicit softmax with `reference=True`.
    """
    if e.shape[-1] != k.shape[-2] or f.shape[-1] != v.shape[-2]:
        raise ValueError(f"projections {tuple(e.shape)}, {tuple(f.shape)} do not fit {k.shape[-2]} keys")
    k_proj = torch.einsum("rm,bhmd->bhrd", e, masked_fill_keys(k, mask))  # b h r d
    v_proj = torch.einsum("rm,bhmd->bhrd", f, masked_fill_keys(v, mask))  # b h r d
    return softmax_attention(q, k_proj, v_proj, scale=scale, dropout_p=dropout_p, reference=reference)


def _init_projection(weight: Tensor) -> Tensor:
    # The authors' fairseq code: nn.Linear(max_seq_len, k) initialised xavier-uniform with gain 1/sqrt(2).
    return nn.init.xavier_uniform_(weight, gain=1 / math.sqrt(2))


# Layerwise sharing: one projection per (bound attention class, max_seq_len, k). Weak keys, so a class (and its
# shared parameter) is freed with the last model that uses it.
_LAYERWISE: weakref.WeakKeyDictionary[type, dict[tuple, nn.Parameter]] = weakref.WeakKeyDictionary()


def _layerwise_projection(cls: type, max_seq_len: int, k: int, device, dtype) -> nn.Parameter:
    table = _LAYERWISE.setdefault(cls, {})
    if (max_seq_len, k) not in table:
        table[max_seq_len, k] = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, device=device, dtype=dtype)))
    return table[max_seq_len, k]


@register_attention("linformer")
class LinformerAttention(AttentionBase):
    """Linformer multi-head attention with timm's projections; non-causal (E and F mix the whole sequence).

    Parameters: `compress_k`, `compress_v` (`share="none"`) or one `compress` (`"kv"`, `"layerwise"`), each
    `[k, max_seq_len]`.

    Layerwise sharing: timm builds each block's attention from the `attn_layer` class alone, with no handle on
    the model, so the shared parameter is keyed by the module's class, `max_seq_len` and `k` (the first layer built
    picks its device and dtype; `model.to(...)` moves it once for all).
    `zoo.create_model` (and any caller of `attention_class(..., share="layerwise")`) makes a fresh bound class per
    call, so every layer of one model shares one E and two models built by two calls do not. Modules built
    directly from `LinformerAttention` or `create_attention` in one process all share one E per key. `deepcopy`
    keeps the sharing inside the copy. The state dict repeats the shared tensor under each layer's key (loading
    writes the same tensor each time); `model.parameters()` yields it once.
    """

    has_attention_weights = True
    test_options: ClassVar[dict] = {"k": 16, "max_seq_len": 64}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        k: int = 256,
        max_seq_len: int = 4096,
        share: Literal["none", "kv", "layerwise"] = "none",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        check_int("k", k, 1)
        check_int("max_seq_len", max_seq_len, 1)
        if k > max_seq_len:
            raise ValueError(f"k={k} must be <= max_seq_len={max_seq_len}: the projection cannot add keys")
        if share not in SHARING:
            raise ValueError(f"share={share!r} is not one of {', '.join(map(repr, SHARING))}")
        super().__init__(dim, num_heads, **timm_args)
        dd = self.factory_kwargs
        self.k = k
        self.max_seq_len = max_seq_len
        self.share = share
        self.reference = check_bool("reference", reference)
        if share == "layerwise":
            self.compress = _layerwise_projection(type(self), max_seq_len, k, **dd)
        elif share == "kv":
            self.compress = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, **dd)))
        else:
            self.compress_k = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, **dd)))
            self.compress_v = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, **dd)))

    def projections(self, length: int) -> tuple[Tensor, Tensor]:
        """E and F for a sequence of `length` tokens: the leading columns, each `[k, length]`."""
        check_seq_len(self.attention_name, length, self.max_seq_len)
        if self.share == "none":
            return self.compress_k[:, :length], self.compress_v[:, :length]
        return self.compress[:, :length], self.compress[:, :length]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        e, f = self.projections(k.shape[-2])
        dropout_p = self.attn_drop.p if self.training else 0.0
        return linformer_attention(q, k, v, e, f, mask, scale=self.scale, dropout_p=dropout_p, reference=self.reference)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}, max_seq_len={self.max_seq_len}, share={self.share!r}"
