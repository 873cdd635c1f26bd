"""The blocked kernel of Reformer's LSH attention (`zoo.attention.reformer`): positions sorted by bucket, chunks of
`bucket_size` attending to themselves and the chunk before, in blocks of chunks, with a hand-written backward.

Both visibility rules are "0 <= x_q - x_k <= width" on a per-round code x (the chunk index with width 1; or,
causal, `rank + bucket * (w + 1)` with width w), which `ChunkLayout` evaluates with integer arithmetic on blocks
of chunks; `LSHAttention` saves the attention weights, never logits or masks. It computes what
`reformer.lsh_reference` computes on dense `[n, n]` matrices.

Letter legend: b - batch, h - heads, r - hash rounds, l - padded length, t - chunks of all rounds and heads,
w - chunk length (`bucket_size`), s - keys a chunk sees (2w, or w with one chunk), d - head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from .._workspace import unwritten

__all__ = ["BLOCK_SCORES", "MASKED_LOGIT", "SELF_LOGIT", "ChunkLayout", "LSHAttention"]

# A query's logit for its own key (the paper subtracts 1e5; reformer-pytorch sets -5e4), and what is added to
# the logit of a key it may not see: far below the self logit, so exp() of it is exactly 0 next to any real key.
SELF_LOGIT = -5e4
MASKED_LOGIT = -1e9
# Logits per block of chunks in the fast path (a few MiB of float32): few enough ops per call that scheduling costs
# little, small enough that a block's temporaries stay in cache.
BLOCK_SCORES = 2**21


@dataclass
class ChunkLayout:
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
    def build(cls, buckets: Tensor, w: int, n_buckets: int, is_causal: bool, count_duplicates: bool) -> ChunkLayout:
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
        Called from `LSHAttention.forward`, where autograd is off."""
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


class LSHAttention(torch.autograd.Function):
    """The fast path: sort, attention within chunks in blocks of `BLOCK_SCORES` logits, the rounds combined.

    q, v: `[b h l, d]` rows -> `[b h l, d]`. Saves the sorted slots, their keys, the per-round attention weights
    (unnormalised) and one factor per slot (its round's share of the total normaliser / its own normaliser).
    """

    @staticmethod
    def forward(ctx, q: Tensor, v: Tensor, layout: ChunkLayout, scale: float, dropout_p: float) -> Tensor:
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
