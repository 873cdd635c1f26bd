"""LSH attention: "Reformer: The Efficient Transformer" (Kitaev et al. 2020), https://arxiv.org/abs/2001.04451

Shared-QK attention restricted by angular locality-sensitive hashing. Keys are the L2-normalised queries (the
module keeps timm's `qkv` weights so checkpoints copy, but only the q and v rows are used). Each of `n_hashes`
rounds hashes every position with a random rotation R, `h(x) = argmax([xR; -xR])`, into `n_buckets` buckets
(`length / bucket_size` rounded up to even, as in the paper); positions are sorted by (bucket, position), cut
into chunks of `bucket_size`, and each chunk attends to itself and the chunk before it (the paper's
`floor(s_i / m) - 1 <= floor(s_j / m) <= floor(s_i / m)`: chunk 0 has none before it). A query attends to itself
only when nothing else is visible (its logit is set to -5e4). Rounds are combined by their log-sum-exp weights;
with `count_duplicates` (the paper's eq. 6: a key that a query sees in N rounds gets logit - log N in each) the
result is exact softmax over the union of the keys a query saw in any round. The length is padded internally to
a multiple of `bucket_size`; padded positions and masked keys are hashed into a bucket after all real ones and
masked, so they never receive weight.

Causal mode keeps the causal part of the paper's rule with one more restriction: a query sees the keys of its
own bucket at earlier (or equal) positions at most `bucket_size` places back in the sorted order, i.e. the
previous `bucket_size` positions of its bucket. That set depends only on the past (for a given length, which sets
the bucket count); the paper's chunk boundaries move with the hashes of later positions, so future tokens would
decide which past keys a query sees.

Both rules are "0 <= x_q - x_k <= width" on a per-round code x (the chunk index with width 1; or, causal,
`rank + bucket * (w + 1)` with width w), which the fast path evaluates with integer arithmetic on blocks of chunks
in a custom autograd function that saves the attention weights, never logits or masks. `reference=True` is the
O(n^2) reference: the same rules on dense `[n, n]` matrices and one softmax over the union of the rounds, for the
tests.

Letter legend: b - batch, h - heads, r - hash rounds, n - length (padded: l), t - chunks of all rounds and heads,
w - chunk length (`bucket_size`), s - keys a chunk sees (2w, or w with one chunk), d - head dim, u - buckets / 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase, pad_to_multiple
from ._registry import register_attention
from ._seeded import SeedStepMixin
from ._workspace import exporting, unwritten

__all__ = ["ReformerAttention", "lsh_attention", "lsh_bucket_count", "lsh_buckets"]

# A query's logit for its own key (the paper subtracts 1e5; reformer-pytorch sets -5e4), and what is added to
# the logit of a key it may not see: far below the self logit, so exp() of it is exactly 0 next to any real key.
SELF_LOGIT = -5e4
MASKED_LOGIT = -1e9
# Logits per block of chunks in the fast path (8 MiB of float32): few enough ops per call that scheduling costs
# little, small enough that a block's temporaries stay in cache.
BLOCK_SCORES = 2**21
# Columns per group in the two-level argmax of the hash.
GROUP = 8


def lsh_bucket_count(length: int, bucket_size: int) -> int:
    """Buckets for `length` positions: one per `bucket_size` positions, rounded up to even (one if it fits)."""
    chunks = -(-length // bucket_size)
    return 1 if chunks == 1 else chunks + chunks % 2


def _signed_argmax(x: Tensor, half: int) -> Tensor:
    """`argmax([x; -x])` over the columns of `x: [..., groups, GROUP]` whose column j repeats column j % half (+ half
    for -x) -> `[...]`, in two levels: max / min per group (fast value reductions), the winning group, the column
    inside it. A repeat computed by the matmul may differ from its original in the last bit and win, so the winner
    is folded back to its original column."""
    high, low = x.amax(-1), x.amin(-1)
    group = torch.maximum(high, low.neg()).argmax(-1, keepdim=True)
    positive = high.gather(-1, group) >= -low.gather(-1, group)
    inside = x.gather(-2, group[..., None].expand(*group.shape, x.shape[-1])).squeeze(-2)
    column = torch.where(positive, inside.argmax(-1, keepdim=True), inside.argmin(-1, keepdim=True))
    return ((group * x.shape[-1] + column) % half + half * ~positive).squeeze(-1)


def lsh_buckets(qk: Tensor, rotations: Tensor, keep: Tensor | None = None) -> Tensor:
    """Angular LSH, `argmax([xR; -xR])` in every round.

    qk: `[b, h, n, d]`; rotations: `[h, r, d, u]` (n_buckets = 2u; u = 0 means one bucket); keep: `[b, n]` bool
    or None -> buckets `[b, h, r, n]` int64 in `[0, n_buckets)`; positions with keep False get bucket
    `max(2u, 1)`, after every real one. No gradient flows through the hash.
    """
    b, h, n, _ = qk.shape
    rounds, half = rotations.shape[1], rotations.shape[-1]
    buckets = qk.new_zeros((b, h, n, rounds), dtype=torch.long)
    with torch.no_grad():
        if half:
            # [h, d, r, u'] with u' a multiple of GROUP: extra columns repeat the first ones (folded back by
            # _signed_argmax), so buckets stay in [0, 2u).
            columns = torch.arange(half + -half % GROUP, device=rotations.device) % half
            weight = rotations[..., columns].to(qk.dtype).permute(0, 2, 1, 3).flatten(2)
            step = max(1, BLOCK_SCORES // (b * h * weight.shape[-1]))
            for start in range(0, n, step):
                rotated = torch.matmul(qk[:, :, start : start + step], weight).unflatten(-1, (rounds, -1, GROUP))
                buckets[:, :, start : start + step] = _signed_argmax(rotated, half)
        buckets = buckets.transpose(-1, -2)
        if keep is not None:
            buckets = buckets.masked_fill(~keep[:, None, None, :], max(2 * half, 1))
    return buckets.contiguous()


@dataclass
class _ChunkLayout:
    """The sorted slots of all rounds, `t` chunks of `w`, and what the fast path's visibility rules need.

    Slot tensors have `(t + 1) w` rows (in their last dim): a leading dummy chunk, so that the keys of chunk i
    (chunks i - 1 and i) are the rows `[i w, (i + 2) w)`, a strided view. Chunk 0 of a round hides the chunk before.
    """

    rows: Tensor  # [(t + 1) w] the row in [b h l, *] of the position each slot holds
    unsort: Tensor  # [b h, r, l] the slot (not counting the dummy chunk) of every position in every round
    code: Tensor  # [(t + 1) w] the slot's code x in its own round
    codes: Tensor | None  # [r, (t + 1) w] the code of the slot's position in every round (count_duplicates)
    padded: Tensor  # [(t + 1) w] bool: a padded or masked position
    first_chunk: Tensor  # [t] bool: chunk 0 of its round
    chunk_len: int  # w, the bucket size
    keys_per_chunk: int  # s: 2w (the chunk and the one before it), or w with one chunk
    chunks: int  # chunks per round
    rounds: int
    is_causal: bool

    @classmethod
    @torch.no_grad()
    def build(cls, buckets: Tensor, w: int, n_buckets: int, is_causal: bool, count_duplicates: bool) -> _ChunkLayout:
        """From the buckets `[b, h, r, l]` of every position in every round."""
        b, h, rounds, length = buckets.shape
        chunks, arange = length // w, partial(torch.arange, device=buckets.device)
        sorted_buckets, order = buckets.sort(dim=-1, stable=True)
        rank = torch.empty_like(order).scatter_(-1, order, arange(length).expand_as(order))
        rows = (order + arange(b * h).view(b, h, 1, 1) * length).flatten()

        def code_of(rank: Tensor, buckets: Tensor) -> Tensor:
            return rank + buckets * (w + 1) if is_causal else rank.div(w, rounding_mode="floor")

        code, codes = code_of(arange(length), sorted_buckets).flatten(), None
        if count_duplicates and rounds > 1 and chunks > 1:
            # The code of every position in every round, `[b h l, r]`, gathered for the position of every slot.
            codes = code_of(rank, buckets).transpose(-1, -2).reshape(-1, rounds).index_select(0, rows).t()
        # The codes' bound from the sizes alone (reading code.max() would be a host sync): ranks stay below the
        # length, buckets at most n_buckets (padded positions).
        top = 2 * (length - 1 + n_buckets * (w + 1) if is_causal else (length - 1) // w) + 3 * w
        dtype = torch.int16 if top < 2**15 else torch.int32 if top < 2**31 else torch.int64

        def with_dummy(x: Tensor) -> Tensor:
            return torch.cat([x[..., :w], x], dim=-1)

        return cls(
            with_dummy(rows),
            (rank + arange(b * h * rounds).view(b, h, rounds, 1) * length).flatten(0, 1),
            with_dummy(code.to(dtype)),
            None if codes is None else with_dummy(codes.to(dtype)),
            with_dummy((sorted_buckets == n_buckets).flatten()),
            arange(b * h * rounds * chunks) % chunks == 0,
            w,
            2 * w if chunks > 1 else w,
            chunks,
            rounds,
            is_causal,
        )

    def blocks(self, step: int) -> list[tuple[int, int, int | None]]:
        """Chunk ranges (t0, t1) of at most `step` chunks, with their round when they lie in a single one."""
        total = self.first_chunk.shape[0]
        if self.chunks < step:
            size = step // self.chunks * self.chunks
            return [(t0, min(total, t0 + size), None) for t0 in range(0, total, size)]
        return [
            (start + c0, start + min(self.chunks, c0 + step), start // self.chunks % self.rounds)
            for start in range(0, total, self.chunks)
            for c0 in range(0, self.chunks, step)
        ]

    def window(self, x: Tensor, t0: int, t1: int) -> Tensor:
        """Slot rows `x: [(t + 1) w, *]` -> the keys of chunks t0..t1, `[t1 - t0, s, *]` (a view)."""
        start = (t0 + 1) * self.chunk_len - (self.keys_per_chunk - self.chunk_len)
        stop = start + (t1 - t0 - 1) * self.chunk_len + self.keys_per_chunk
        return x[start:stop].unfold(0, self.keys_per_chunk, self.chunk_len).movedim(-1, 1)

    def own(self, x: Tensor, t0: int, t1: int) -> Tensor:
        """Slot rows `x: [(t + 1) w, *]` -> the queries of chunks t0..t1, `[t1 - t0, w, *]` (a view)."""
        return x[(t0 + 1) * self.chunk_len : (t1 + 1) * self.chunk_len].unflatten(0, (t1 - t0, self.chunk_len))

    def before_first(self, t0: int, t1: int) -> Tensor:
        """`[t1 - t0, s]` bool: the key slots of the (absent) chunk before a chunk 0."""
        return self.first_chunk[t0:t1, None] & (
            torch.arange(self.keys_per_chunk, device=self.first_chunk.device) < self.keys_per_chunk - self.chunk_len
        )

    def mask_logits(self, dots: Tensor, t0: int, t1: int, round_: int | None) -> Tensor | None:
        """Self logit and hidden keys on the logits `dots: [t1 - t0, w, s]` of chunks t0..t1 (all in round
        `round_`, or None), in place; returns how many rounds each pair meets in (count_duplicates), or None.
        Called from `_LSHAttention.forward`, where autograd is off."""
        # A query's own key is on the diagonal of its own chunk.
        dots[:, :, self.keys_per_chunk - self.chunk_len :].diagonal(dim1=1, dim2=2).fill_(SELF_LOGIT)
        if self.is_causal:
            hidden = self._unseen(self.own(self.code, t0, t1), self.window(self.code, t0, t1))
            dots.add_(hidden.add_(self.before_first(t0, t1)[:, None]).clamp_max_(1), alpha=MASKED_LOGIT)
        else:
            hidden = self.window(self.padded, t0, t1) | self.before_first(t0, t1)
            dots.add_(hidden[:, None].to(dots.dtype), alpha=MASKED_LOGIT)
        if self.codes is None:
            return None
        # Rounds in which a pair does not meet; a visible pair meets in its own round, which can be skipped.
        missed = None
        for other, codes in enumerate(self.codes):
            if other != round_:
                miss = self._unseen(self.own(codes, t0, t1), self.window(codes, t0, t1))
                missed = miss if missed is None else missed.add_(miss)
        return missed.neg_().add_(self.rounds).clamp_min_(1)

    def _unseen(self, query: Tensor, key: Tensor) -> Tensor:
        """Codes `[g, w]`, `[g, s]` -> `[g, w, s]` int: 0 where 0 <= x_q - x_k <= width, else 1 (width: 1 for
        chunk indices, w causal)."""
        # a = 2 x_q - width, b = 2 x_k: |a - b| <= width, tested as (|a - b| + c) >> bits == 0 without compares.
        width = self.chunk_len if self.is_causal else 1
        bits, slack = width.bit_length(), 2 ** width.bit_length() - 1 - width
        distance = ((2 * query - width)[:, :, None] - 2 * key[:, None]).abs_()
        return (distance.add_(slack) if slack else distance).bitwise_right_shift_(bits).clamp_max_(1)


def _sum_rounds(slots: Tensor, unsort: Tensor) -> Tensor:
    """Slot rows `[*, d]` -> position rows `[b h l, d]`: the sum over rounds of each position's slot."""
    total = slots.index_select(0, unsort[:, 0].flatten())
    buffer = torch.empty_like(total)
    for index in unsort[:, 1:].unbind(1):
        total.add_(torch.index_select(slots, 0, index.flatten(), out=buffer))
    return total


class _LSHAttention(torch.autograd.Function):
    """The fast path: sort, attention within chunks in blocks of `BLOCK_SCORES` logits, the rounds combined.

    q, v: `[b h l, d]` rows -> `[b h l, d]`. Saves the sorted slots, their keys, the per-round attention weights
    (unnormalised) and one factor per slot (its round's share of the total normaliser / its own normaliser).
    """

    @staticmethod
    def forward(ctx, q: Tensor, v: Tensor, layout: _ChunkLayout, scale: float, dropout_p: float) -> Tensor:
        w, width, d = layout.chunk_len, layout.keys_per_chunk, q.shape[-1]
        # Slots after a dummy chunk, [(t + 1) w, d], and their keys q / |q|.
        queries, values = q.index_select(0, layout.rows), v.index_select(0, layout.rows)
        norm = queries.norm(dim=-1, keepdim=True).clamp_min_(1e-12)
        keys = queries / norm
        # Saved as |q| / scale, what the key gradient is divided by.
        norm = norm.div_(scale)
        t = queries.shape[0] // w - 1
        step = max(1, BLOCK_SCORES // (w * width))
        probs = unwritten(q, (t, w, width))
        kept = unwritten(q, (t, w, width), dtype=torch.bool) if dropout_p > 0 else None
        out, top, total = unwritten(q, (t, w, d)), unwritten(q, (t, w, 1)), unwritten(q, (t, w, 1))
        for t0, t1, round_ in layout.blocks(step):
            scores = torch.bmm(
                layout.own(queries, t0, t1) * scale, layout.window(keys, t0, t1).transpose(1, 2), out=probs[t0:t1]
            )
            count = layout.mask_logits(scores, t0, t1, round_)
            torch.amax(scores, -1, keepdim=True, out=top[t0:t1])
            # Unnormalised weights exp(s - top), divided by the rounds a pair meets in (logit - log count, the
            # paper's eq. 6); the normaliser is applied to the output rows instead.
            weights = scores.sub_(top[t0:t1]).exp_()
            if count is not None:
                weights = weights.div_(count)
            torch.sum(weights, -1, keepdim=True, out=total[t0:t1])
            if kept is not None:
                kept[t0:t1] = torch.rand_like(weights) >= dropout_p
                weights = weights * kept[t0:t1] / (1 - dropout_p)
            torch.bmm(weights, layout.window(values, t0, t1), out=out[t0:t1])
        # Rounds weighted by their share of the total normaliser (the paper's eq. 4), summed in position order.
        # Shares from differences of the rounds' maxima, not of log-normalisers: when a query sees only itself,
        # those are -5e4 + log(total), which float32 cannot resolve.
        unsort = layout.unsort
        top, total = top.view(-1), total.view(-1)
        highest = top[unsort].amax(1, keepdim=True)
        overall = (top[unsort] - highest).exp_().mul_(total[unsort]).sum(1).flatten()
        position = layout.rows[w:]
        factor = (top - highest.flatten()[position]).exp_().div_(overall[position])
        result = _sum_rounds(out.view(-1, d).mul_(factor[:, None]), unsort)
        ctx.save_for_backward(queries, values, keys, norm, probs, kept, factor, result)
        ctx.layout, ctx.scale, ctx.dropout_p, ctx.step = layout, scale, dropout_p, step
        return result

    @staticmethod
    def backward(ctx, grad_result: Tensor):
        queries, values, keys, norm, probs, kept, factor, result = ctx.saved_tensors
        layout, scale, step = ctx.layout, ctx.scale, ctx.step
        w, width, d = layout.chunk_len, layout.keys_per_chunk, queries.shape[-1]
        grad_result = grad_result.contiguous()
        # The final weights factor * probs are one softmax over all rounds' keys: d logits = p (dp - out . grad_out).
        delta = (result * grad_result).sum(-1)
        grad_q, grad_v = torch.zeros_like(queries), torch.zeros_like(values)
        for t0, t1, _ in layout.blocks(step):
            g = t1 - t0
            rows = layout.rows[(t0 + 1) * w : (t1 + 1) * w]
            rate = factor[t0 * w : t1 * w, None]
            # grad_out scaled by each query's factor, so the saved weights need no rescaling.
            grad_out = grad_result.index_select(0, rows).mul_(rate).view(g, w, d)
            weights = probs[t0:t1]
            grad_dots = torch.bmm(grad_out, layout.window(values, t0, t1).transpose(1, 2))
            if kept is not None:
                drop = kept[t0:t1] / (1 - ctx.dropout_p)
                grad_dots.mul_(drop)
                weights = weights * drop
            grad_values = torch.bmm(weights.transpose(1, 2), grad_out)
            grad_dots = grad_dots.sub_(delta[rows].mul_(rate[:, 0]).view(g, w, 1)).mul_(probs[t0:t1])
            # The self logit is a constant, not q.k: nothing flows through it.
            grad_dots[:, :, width - w :].diagonal(dim1=1, dim2=2).zero_()
            layout.own(grad_q, t0, t1).baddbmm_(grad_dots, layout.window(keys, t0, t1), alpha=scale)
            grad_keys = torch.bmm(grad_dots.transpose(1, 2), layout.own(queries, t0, t1))
            # Through the normalisation k = q / |q|: scale (g - k (k . g)) / |q|.
            key = layout.window(keys, t0, t1)
            grad_keys.addcmul_(key, torch.linalg.vecdot(key, grad_keys)[..., None], value=-1)
            # Chunk i's keys are slot rows [i w, (i + 2) w): add each half where it came from.
            for start in range(0, width, w):
                rows = slice((t0 + 1) * w - width + w + start, (t1 + 1) * w - width + w + start)
                grad_q[rows].view(g, w, d).addcdiv_(grad_keys[:, start : start + w], norm[rows].view(g, w, 1))
                grad_v[rows].view(g, w, d).add_(grad_values[:, start : start + w])
        # Every position sits in one slot per round: sum the rounds' gradients in position order.
        return _sum_rounds(grad_q, layout.unsort + w), _sum_rounds(grad_v, layout.unsort + w), None, None, None


def _dense_reference(
    q: Tensor,
    v: Tensor,
    buckets: Tensor,
    layout: _ChunkLayout,
    n_buckets: int,
    count_duplicates: bool,
    scale: float,
    dropout_p: float,
) -> Tensor:
    """The rules on dense `[l, l]` matrices, O(n^2): per round who meets whom, then one softmax over the union of
    the rounds (each key once with count_duplicates, else once per round it is met in). q, v: `[b, h, l, d]`."""
    w, length = layout.chunk_len, q.shape[-2]
    rank = (layout.unsort % length).view(buckets.shape)
    meets = torch.zeros(q.shape[:2] + (length, length), dtype=q.dtype, device=q.device)
    for round_ in range(buckets.shape[2]):
        bucket_q, bucket_k = buckets[:, :, round_, :, None], buckets[:, :, round_, None, :]
        rank_q, rank_k = rank[:, :, round_, :, None], rank[:, :, round_, None, :]
        if layout.is_causal:
            meets += (bucket_q == bucket_k) & (rank_q - rank_k >= 0) & (rank_q - rank_k <= w)
        else:
            # Own chunk or the one before (chunk 0 has none), and never a padded key.
            chunk_gap = rank_q.div(w, rounding_mode="floor") - rank_k.div(w, rounding_mode="floor")
            meets += (chunk_gap >= 0) & (chunk_gap <= 1) & (bucket_k != n_buckets)
    scores = (q * scale) @ F.normalize(q, dim=-1).transpose(-1, -2)
    scores = scores.masked_fill(torch.eye(length, dtype=torch.bool, device=q.device), SELF_LOGIT)
    if not count_duplicates:
        scores = scores + meets.clamp_min(1).log()
    # Padded and masked queries meet nobody: their rows stay finite (their outputs are unspecified).
    scores = scores.masked_fill((meets == 0) & meets.any(-1, keepdim=True), float("-inf"))
    return F.dropout(scores.softmax(-1), dropout_p) @ v


def lsh_attention(
    qk: Tensor,
    v: Tensor,
    rotations: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    bucket_size: int = 64,
    scale: float | None = None,
    count_duplicates: bool = True,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Shared-QK LSH attention (see the module docstring).

    qk: `[b, h, n, d]` (queries; keys are `qk / |qk|`), v: `[b, h, n, d]`; rotations: `[h, r, d, u]` with
    `2u = lsh_bucket_count(n, bucket_size)` (u = 0 for one bucket) and r hash rounds; mask: `[b, n]` bool key
    padding mask, True = keep -> `[b, h, n, d]` in v's dtype (outputs at masked positions are finite but
    meaningless). Logits are `scale * q_i . k_j`, scale = d^-1/2 by default. Computed in float32 at least.
    `reference=True`, and under `torch.export` (whose tracing refuses the fast path's `out=` workspaces): the O(n^2)
    dense reference instead of the blocked fast path.
    """
    b, h, n, d = qk.shape
    w, rounds = bucket_size, rotations.shape[1] if rotations.dim() == 4 else 0
    length = n + (-n % w)
    n_buckets = lsh_bucket_count(length, w)
    if rotations.shape != (h, rounds, d, n_buckets // 2) or rounds < 1:
        raise ValueError(
            f"rotations of shape {tuple(rotations.shape)} do not fit [heads={h}, rounds>=1, head_dim={d}, "
            f"n_buckets/2={n_buckets // 2}] for length {n} and bucket_size {w}"
        )
    scale = d**-0.5 if scale is None else scale
    out_dtype = v.dtype
    # Logits, exponentials and normalisers in float32 at least: bf16 would lose the normaliser.
    with torch.autocast(qk.device.type, enabled=False):
        dtype = torch.promote_types(v.dtype, torch.float32)
        q, _ = pad_to_multiple(qk.to(dtype), w)
        v, _ = pad_to_multiple(v.to(dtype), w)
        keep = mask
        if length != n:
            keep = torch.zeros(b, length, dtype=torch.bool, device=q.device)
            keep[:, :n] = True if mask is None else mask
        buckets = lsh_buckets(q, rotations, keep)
        layout = _ChunkLayout.build(buckets, w, n_buckets, is_causal, count_duplicates)
        if not reference and not exporting():
            q, v = (x.reshape(b * h * length, d) for x in (q, v))
            out = _LSHAttention.apply(q, v, layout, scale, dropout_p)
        else:
            out = _dense_reference(q, v, buckets, layout, n_buckets, count_duplicates, scale, dropout_p)
    return out.view(b, h, length, d)[:, :, :n].to(out_dtype)


@register_attention("reformer")
class ReformerAttention(SeedStepMixin, AttentionBase):
    """Reformer LSH attention with timm's projections; shared QK (the k rows of `qkv` and `k_norm` are unused).

    Options: `n_hashes` hash rounds (4: reformer-pytorch's default and the paper's main LSH setting),
    `bucket_size` (64, the paper's), `count_duplicates` (True: the paper's eq. 6 duplicate correction; False:
    reformer-pytorch's default, where a key seen in several rounds counts several times), `reference` (False: the
    blocked fast path; True: the O(n^2) dense reference, for tests).

    Rotations are drawn in every forward on the module's device as a pure function of (`seed`, `step`),
    `SeedStepMixin`'s persistent buffers (`seeded_normal`: no host sync, the same values on every device): `seed`
    is drawn once from torch's global RNG at construction, `step` counts optimizer steps
    (`zoo.attention.on_optimizer_step(model)`, which the training engine calls). So every training step hashes with
    fresh rotations (training never depends on one fixed hash), and all forwards within a step (gradient
    accumulation, activation recomputation, data-parallel replicas, evaluation) use the same ones. Rotations are
    per head and shared by the samples of a batch; each sample is hashed and attended on its own.
    """

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"bucket_size": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        n_hashes: int = 4,
        bucket_size: int = 64,
        count_duplicates: bool = True,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        check_int("n_hashes", n_hashes, 1)
        check_int("bucket_size", bucket_size, 1)
        check_bool("count_duplicates", count_duplicates)
        check_bool("reference", reference)
        super().__init__(dim, num_heads, **timm_args)
        self.n_hashes, self.bucket_size = n_hashes, bucket_size
        self.count_duplicates, self.reference = count_duplicates, reference
        self.register_seed_and_step(self.factory_kwargs["device"])

    def rotations(self, length: int) -> Tensor:
        """Random rotations `[h, r, d, n_buckets / 2]` (float32) for `length` positions at the current step, drawn
        on the buffers' device from (`seed`, `step`) with no host sync: the same values on every device."""
        half = lsh_bucket_count(length + (-length % self.bucket_size), self.bucket_size) // 2
        return self.seeded_normal(self.step, (self.num_heads, self.n_hashes, self.head_dim, half), torch.float32)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`x: [b, n, c]` -> (qk, qk, v), each `[b, h, n, d]`: only the q and v rows of `qkv` are computed."""
        weight = self.qkv.weight.unflatten(0, (3, -1))[0::2].flatten(0, 1)
        bias = None if self.qkv.bias is None else self.qkv.bias.unflatten(0, (3, -1))[0::2].flatten()
        qk, v = F.linear(x, weight, bias).unflatten(-1, (2, self.num_heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)
        qk = self.q_norm(qk)
        return qk, qk, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """Shared QK: `k` is ignored, the keys are the normalised `q`."""
        options = {
            "bucket_size": self.bucket_size,
            "count_duplicates": self.count_duplicates,
            "reference": self.reference,
        }
        dropout_p = self.attn_drop.p if self.training else 0.0
        return lsh_attention(
            q, v, self.rotations(q.shape[-2]), mask, is_causal, scale=self.scale, dropout_p=dropout_p, **options
        )

    def extra_repr(self) -> str:
        options = (
            f"bucket_size={self.bucket_size}, count_duplicates={self.count_duplicates}, reference={self.reference}"
        )
        return f"{super().extra_repr()}, n_hashes={self.n_hashes}, {options}"
