"""Transformer-VQ: "Transformer-VQ: Linear-Time Transformers via Vector Quantization" (Lingle 2023),
https://arxiv.org/abs/2309.16354

Keys are vector-quantised to a per-head codebook of S codewords C, k_j -> C[z_j], so every query sees at most S
distinct logits:

    out_i = sum_j softmax_j(q_i . C[z_j] * scale) v_j
          = sum_s softmax_s(q_i . C[s] * scale + log N_s) (sum_{j : z_j = s} v_j / N_s),   N_s = #{j : z_j = s}

softmax over the N quantised keys equals softmax over the S codewords, each logit raised by log(count of keys
with that code) and each value the mean of those keys' values. `vq_attention_reference` is the first line on
dense `[n, n]` scores (the tests' oracle), `vq_attention` the second. The cost is O(N S d), linear in N. Causal mode
is the paper's block recurrence: exact softmax inside a block of `block_len` positions plus a cache of per-code
value sums and counts of all earlier blocks, merged in one softmax.

Training follows the paper: straight-through keys; a commitment loss `beta * |k - sg(c_z)|^2` left in
`aux_loss` after every training forward (`zoo.attention.auxiliary_loss(model)` adds it to the task loss); EMA
codewords with Laplace-smoothed counts, updated once per optimizer step from the statistics of every
micro-batch and every data-parallel replica. The paper also normalises q and k (`qk_norm=True` comes closest).

Letter legend: b - batch, h - heads, n - length, d - head dim, e - head dim + 1 (a ones column appended, whose
sum is the count), s - codes, k - blocks, i / j - query / key position in a block.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist
from einops import rearrange
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase, masked_fill_keys, pad_to_multiple
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = [
    "VQAttention",
    "code_sums",
    "codewords",
    "commitment_loss",
    "quantize",
    "vq_attention",
    "vq_attention_reference",
]


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    # Logits and per-code sums over thousands of keys lose too much in half precision: float32 at least.
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def _with_ones(x: Tensor) -> Tensor:
    """`[b, h, n, d]` -> `[b, h, n, e]`: per-code sums of the ones column are the per-code counts."""
    return torch.cat([x, x.new_ones(x.shape[:-1] + (1,))], dim=-1)


def quantize(k: Tensor, codebook: Tensor) -> Tensor:
    """Index of the nearest codeword: k `[b, h, n, d]`, codebook `[h, s, d]` -> codes `[b, h, n]` (int64)."""
    dtype = _compute_dtype(k, codebook)
    with torch.no_grad(), torch.autocast(k.device.type, enabled=False):
        k, codebook = k.to(dtype), codebook.to(dtype)
        # argmin |k - c|^2 = argmax (k.c - |c|^2 / 2): |k|^2 is the same for every code.
        score = torch.einsum("bhnd,hsd->bhns", k, codebook) - 0.5 * codebook.square().sum(-1)[:, None, :]
        return score.argmax(-1)


def codewords(codebook: Tensor, codes: Tensor) -> Tensor:
    """codebook `[h, s, d]`, codes `[b, h, n]` -> the codewords `[b, h, n, d]`."""
    heads = torch.arange(codebook.shape[0], device=codes.device)[:, None]
    return codebook[heads, codes]


def code_sums(x: Tensor, codes: Tensor, size: int, mask: Tensor | None = None) -> Tensor:
    """Per-code sums of `x: [b, h, n, e]` over the kept positions (`mask: [b, n]`, True = keep) -> `[b, h, s, e]`."""
    x = masked_fill_keys(x, mask)
    sums = x.new_zeros(x.shape[0], x.shape[1], size, x.shape[-1])
    return sums.scatter_add(2, codes[..., None].expand_as(x), x)


def commitment_loss(k: Tensor, codebook: Tensor, codes: Tensor, mask: Tensor | None = None) -> Tensor:
    """`|k - sg(c_z)|^2` summed over heads and dims, averaged over the kept positions -> float32 scalar.

    k: `[b, h, n, d]`, codebook `[h, s, d]` (a buffer: no gradient reaches it), codes `[b, h, n]`, mask `[b, n]`.
    """
    with torch.autocast(k.device.type, enabled=False):
        dtype = _compute_dtype(k)
        error = (k.to(dtype) - codewords(codebook.to(dtype), codes)).square().sum((1, 3))
        if mask is None:
            return error.mean()
        return (error * mask).sum() / mask.sum().clamp_min(1)


def _log_count_bias(logits: Tensor, count: Tensor) -> Tensor:
    """Add `log(count)` to `logits: [..., s]`; empty codes get the lowest finite logit, so no row becomes NaN."""
    logits = logits + count.clamp_min(1).log()
    return logits.masked_fill(count == 0, torch.finfo(logits.dtype).min)


def _seen_weights(logits: Tensor, seen: Tensor) -> Tensor:
    """Softmax of `logits` (unseen entries already at the lowest finite value), unseen weights set to 0.

    Only a row that sees no key changes: its uniform weights would average unseen (future) values; it gets 0.
    """
    return logits.softmax(-1).masked_fill(~seen, 0.0)


def vq_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    codebook: Tensor,
    codes: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    block_len: int = 512,
) -> Tensor:
    """Quadratic reference for `vq_attention`: exact softmax over the straight-through keys `codebook[codes]`.

    Same shapes, outputs and gradients as the fast path: keys straight through, non-causal through their code's
    mean (each key gets the mean of its code's per-key gradients, as the fast path shares a code's logit gradient),
    causal from queries of the key's own block of `block_len` only. Padded keys get no weight and a zero value.
    """
    out_dtype = v.dtype
    dtype = _compute_dtype(q, k, v, codebook)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with torch.autocast(v.device.type, enabled=False):
        q, k, v, codebook = q.to(dtype), k.to(dtype), v.to(dtype), codebook.to(dtype)
        n = q.shape[-2]
        k_hat = codewords(codebook, codes)
        straight = k
        if not is_causal:
            sums = code_sums(_with_ones(k), codes, codebook.shape[1], mask)
            means = sums[..., :-1] / sums[..., -1:].clamp_min(1)  # b h s d
            straight = means.gather(2, codes[..., None].expand_as(k))
        logits = torch.matmul(q * scale, (k_hat + (straight - straight.detach())).transpose(-2, -1))
        seen = torch.ones(n, n, dtype=torch.bool, device=q.device)
        if is_causal:
            position = torch.arange(n, device=q.device) // min(block_len, n)
            same_block = position[:, None] == position[None, :]
            logits = torch.where(same_block, logits, torch.matmul(q * scale, k_hat.transpose(-2, -1)))
            seen = seen.tril()
        if mask is not None:
            seen = seen & mask[:, None, None, :]
            v = masked_fill_keys(v, mask)
        out = torch.matmul(_seen_weights(logits.masked_fill(~seen, torch.finfo(dtype).min), seen), v)
    return out.to(out_dtype)


def vq_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    codebook: Tensor,
    codes: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    block_len: int = 512,
) -> Tensor:
    """Softmax attention over the quantised keys in time linear in the length, through the codebook.

    q, k, v: `[b, h, n, d]`; codebook `[h, s, d]`; codes `[b, h, n]` (`quantize(k, codebook)`); mask `[b, n]`
    bool key padding mask, True = keep -> `[b, h, n, d]` in v's dtype. Equals `vq_attention_reference` (the
    quadratic softmax over the quantised keys `codebook[codes]`). Computed in float32 at least, autocast off.

    Non-causal: per-code value sums and counts, then softmax over the s codes with `log(count)` added to the
    logits. The keys' gradient is straight-through per code: the gradient of code s's logit is shared equally
    by the keys with code s (the per-key straight-through gradient summed over each code, which would need
    `O(n s d^2)` to split exactly). Causal: blocks of `block_len`, exact straight-through softmax inside a block
    plus the per-code value sums and counts of all earlier blocks (an exclusive prefix sum over blocks); as in
    the paper, that cache carries no key gradient. A query whose visible keys are all padded gets zero.
    """
    out_dtype = v.dtype
    dtype = _compute_dtype(q, k, v, codebook)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with torch.autocast(v.device.type, enabled=False):
        q, k, v, codebook = q.to(dtype), k.to(dtype), v.to(dtype), codebook.to(dtype)
        if is_causal:
            out = _causal(q, k, v, codebook, codes, mask, scale, block_len)
        else:
            out = _non_causal(q, k, v, codebook, codes, mask, scale)
    return out.to(out_dtype)


def _non_causal(
    q: Tensor, k: Tensor, v: Tensor, codebook: Tensor, codes: Tensor, mask: Tensor | None, scale: float
) -> Tensor:
    """`[b, h, n, d]` attention over the s codes (see `vq_attention`)."""
    d = k.shape[-1]
    # One scatter for keys, values and counts: [b, h, s, d + d + 1].
    sums = code_sums(torch.cat([k, _with_ones(v)], dim=-1), codes, codebook.shape[1], mask)
    key_sum, value_sum, count = sums[..., :d], sums[..., d:-1], sums[..., -1]
    per_code = count.clamp_min(1)[..., None]
    key_mean = key_sum / per_code
    # Straight-through: the value is exactly the codeword, the gradient goes to the mean of the code's keys.
    keys = codebook + (key_mean - key_mean.detach())
    logits = _log_count_bias(torch.einsum("bhnd,bhsd->bhns", q * scale, keys), count[:, :, None, :])
    return torch.matmul(logits.softmax(-1), value_sum / per_code)


def _causal(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    codebook: Tensor,
    codes: Tensor,
    mask: Tensor | None,
    scale: float,
    block_len: int,
) -> Tensor:
    """`[b, h, n, d]` causal attention: exact inside a block, per-code cache of earlier blocks (see `vq_attention`)."""
    b, _, n, _ = q.shape
    s = codebook.shape[1]
    w = min(block_len, n)
    keep = mask if mask is not None else torch.ones(b, n, dtype=torch.bool, device=q.device)
    # Internal padding is a padded key: no weight, no count.
    keep, _ = pad_to_multiple(keep, w, dim=-1, value=False)
    q, _ = pad_to_multiple(q, w)
    k_hat, _ = pad_to_multiple(codewords(codebook, codes) + (k - k.detach()), w)
    v = masked_fill_keys(pad_to_multiple(v, w)[0], keep)
    codes, _ = pad_to_multiple(codes, w, dim=-1)
    qb, kb, vb = (rearrange(t, "b h (k i) d -> b h k i d", i=w) for t in (q * scale, k_hat, v))
    # [b, 1, k, i, j]: key j of the block is seen by query i when j <= i and j is kept.
    causal = torch.ones(w, w, dtype=torch.bool, device=q.device).tril()
    seen = causal & rearrange(keep, "b (k j) -> b 1 k 1 j", j=w)
    floor = torch.finfo(q.dtype).min
    logits = torch.einsum("bhkid,bhkjd->bhkij", qb, kb).masked_fill(~seen, floor)
    blocks = qb.shape[2]
    if blocks == 1:
        out = torch.matmul(_seen_weights(logits, seen), vb)
        return rearrange(out, "b h k i d -> b h (k i) d")[:, :, :n]
    # Per-block code sums of [v, 1] in one scatter (index block * s + code), then an exclusive prefix sum.
    block = torch.arange(blocks, device=q.device).repeat_interleave(w)
    sums = code_sums(_with_ones(v), codes + block * s, blocks * s, keep)
    sums = rearrange(sums, "b h (k s) e -> b h k s e", s=s)
    cache = torch.cat([torch.zeros_like(sums[:, :, :1]), sums[:, :, :-1].cumsum(2)], dim=2)
    count = cache[..., -1]
    cache_logits = _log_count_bias(torch.einsum("bhkid,hsd->bhkis", qb, codebook), count[:, :, :, None, :])
    # One softmax over [block keys | codes] is the logsumexp merge of the two parts.
    weights = torch.cat([logits, cache_logits], dim=-1).softmax(-1)
    cache_values = cache[..., :-1] / count.clamp_min(1)[..., None]
    out = torch.matmul(weights[..., :w].masked_fill(~seen, 0.0), vb) + torch.matmul(weights[..., w:], cache_values)
    return rearrange(out, "b h k i d -> b h (k i) d")[:, :, :n]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _in_backward() -> bool:
    """True while autograd runs a backward pass: where checkpointing and reversible stacks recompute a forward."""
    # The graph task id is what torch.utils.checkpoint itself reads to tell a recomputation apart; -1 outside.
    return torch._C._current_graph_task_id() != -1


def _number(name: str, value: float, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
        raise ValueError(f"{name}={value!r} must be a number in [{low}, {high})")


@register_attention("vq")
class VQAttention(AttentionBase):
    """Transformer-VQ multi-head attention with timm's projections; causal mode by blocks and a code cache.

    Buffers (persistent, so resuming restores them; none named like a timm weight): `codebook` `[h, s, d]`,
    the codewords the forward uses, and its EMA statistics `ema_count` `[h, s]` and `ema_sum` `[h, s, d]`.
    In training mode every forward sets `aux_loss` (`beta` x the commitment loss) and adds the keys' per-code
    statistics to a pending sum; in eval mode `aux_loss` is None and nothing is recorded.

    Call `zoo.attention.on_optimizer_step(model)` after every optimizer step: the pending statistics are summed
    over data-parallel replicas (one `all_reduce` when torch.distributed is initialised, so every replica makes
    the same update), folded into the EMA with `decay`, and the codewords set to the EMA sums over the
    Laplace-smoothed counts (`eps`). Updating once per step rather than in forward takes every micro-batch of a
    gradient-accumulation step into one update (the paper's codebook update per optimizer step), needs one
    collective per step, and never changes a buffer the pending backward has saved. A forward recomputed in
    backward (gradient checkpointing, `reversible`) is not counted again and keeps the first forward's loss.

    `reference=True` computes `vq_attention_reference` (quadratic) instead of `vq_attention`.
    """

    supports_causal = True
    test_options: ClassVar[dict] = {"codebook_size": 16, "block_len": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        codebook_size: int = 512,
        beta: float = 1e-4,
        decay: float = 0.99,
        eps: float = 1e-5,
        block_len: int = 512,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        check_int("codebook_size", codebook_size, 1)
        check_int("block_len", block_len, 1)
        _number("beta", beta, 0.0, float("inf"))
        _number("decay", decay, 0.0, 1.0)
        _number("eps", eps, 0.0, float("inf"))
        if eps == 0:
            raise ValueError("eps=0 leaves unused codewords with a zero count; use a small positive eps")
        check_bool("reference", reference)
        super().__init__(dim, num_heads, **timm_args)
        dd = self.factory_kwargs
        self.codebook_size = codebook_size
        self.beta = float(beta)
        self.decay = float(decay)
        self.eps = float(eps)
        self.block_len = block_len
        self.reference = reference
        # Drawn on the CPU from torch's global RNG, so the codebook does not depend on the device.
        codebook = torch.randn(num_heads, codebook_size, self.head_dim) * self.head_dim**-0.5
        self.register_buffer("codebook", codebook.to(**dd))
        self.register_buffer("ema_count", torch.ones(num_heads, codebook_size, **dd))
        # a copy: `.to` without a change of device or dtype returns the same tensor, and an ema_sum sharing the
        # codebook's storage was overwritten by every update's codewords (unused codewords then grew without bound)
        self.register_buffer("ema_sum", codebook.to(**dd, copy=True))
        self.aux_loss: Tensor | None = None
        # Sum of [k, 1] per code since the last optimizer step, [h, s, d + 1] float32: not a buffer, so DDP's
        # buffer broadcast never overwrites a replica's own statistics with rank 0's.
        self.pending: Tensor | None = None

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        codes = quantize(k, self.codebook)
        reference = choose_path(q, reference=self.reference) is Path.REFERENCE
        attention = vq_attention_reference if reference else vq_attention
        out = attention(q, k, v, self.codebook, codes, mask, is_causal, scale=self.scale, block_len=self.block_len)
        if self.training:
            self._commit(k, codes, mask)
        else:
            self.aux_loss = None
        return out

    def _commit(self, k: Tensor, codes: Tensor, mask: Tensor | None) -> None:
        """Leave the commitment loss in `aux_loss` and count the keys, once per training forward.

        A recomputation (gradient checkpointing, a reversible stack's backward) runs inside backward and repeats
        a forward already counted: it records nothing, and only fills an empty `aux_loss`. The forward's own loss
        keeps its graph under checkpointing; a reversible stack, whose forward builds none, empties `aux_loss`
        to take the recomputed loss with its graph. The loss is computed either way: checkpointing requires a
        recomputation to save the tensors its forward saved.
        """
        loss = self.beta * commitment_loss(k, self.codebook, codes, mask)
        if not _in_backward():
            self.aux_loss = loss
            self.record(k, codes, mask)
        elif self.aux_loss is None:
            self.aux_loss = loss

    @torch.no_grad()
    def record(self, k: Tensor, codes: Tensor, mask: Tensor | None) -> None:
        """Add the per-code sums of the kept keys `k: [b, h, n, d]` and their counts to `pending`."""
        stats = code_sums(_with_ones(k.detach().float()), codes, self.codebook_size, mask).sum(0)
        self.pending = stats if self.pending is None else self.pending + stats

    @torch.no_grad()
    def on_optimizer_step(self) -> None:
        """Fold the pending statistics (summed over replicas) into the EMA and recompute the codewords."""
        stats, self.pending = self.pending, None
        if _distributed():
            # Every replica joins the collective, also one that saw no training forward since the last step.
            if stats is None:
                stats = torch.zeros(*self.ema_sum.shape[:-1], self.head_dim + 1, device=self.codebook.device)
            dist.all_reduce(stats)
        if stats is None or not stats[..., -1].any():
            return
        stats = stats.to(_compute_dtype(self.ema_sum))
        ema_sum = self.ema_sum.to(stats.dtype).lerp(stats[..., :-1], 1 - self.decay)
        ema_count = self.ema_count.to(stats.dtype).lerp(stats[..., -1], 1 - self.decay)
        total = ema_count.sum(-1, keepdim=True)
        smoothed = (ema_count + self.eps) / (total + self.codebook_size * self.eps) * total
        self.ema_sum.copy_(ema_sum)
        self.ema_count.copy_(ema_count)
        self.codebook.copy_(ema_sum / smoothed[..., None])

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, codebook_size={self.codebook_size}, beta={self.beta}, decay={self.decay}, "
            f"eps={self.eps}, block_len={self.block_len}, reference={self.reference}"
        )
