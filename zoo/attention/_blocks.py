"""Blocked windows shared by the local, dilated, sparse, Longformer, BigBird and banded_conv families.

A sequence of n positions is padded to a multiple of the block length w and split into k blocks. Each query block
attends to the keys of `before` blocks behind it, itself and `after` blocks ahead (its window, s blocks), plus
whatever keys a family appends (global tokens, random blocks, summaries). Scores exist per block, `[w, s * w]`, so
memory is O(n * s * w) and no n x n tensor is formed. Keys outside the sequence, internal padding and user
padding are masked out of the scores and the normaliser alike; a query whose keys are all masked returns zeros.

Letter legend: b - batch, h - heads, n - length (padded to k * w inside), d - head dim, k - blocks,
w - block length, s - blocks in a window, g - global positions, r - random blocks, m - key length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from ._workspace import unwritten

__all__ = [
    "BlockLayout",
    "allowed_attention",
    "as_sdpa_mask",
    "band_keep",
    "merge_partials",
    "partial_attention",
    "position_offsets",
    "rows_attention",
    "window_layout",
]


@dataclass(frozen=True)
class BlockLayout:
    """A sequence of `length` positions in blocks of `block`, each query block seeing `before` + 1 + `after` blocks.

    Tensors passed in are `[b, h, n, d]` with n either `length` (padded here with zeros) or `padded`.
    """

    length: int
    block: int
    before: int
    after: int

    @property
    def num_blocks(self) -> int:
        return math.ceil(self.length / self.block)

    @property
    def padded(self) -> int:
        return self.num_blocks * self.block

    @property
    def window_blocks(self) -> int:
        """Blocks in one window, s."""
        return self.before + 1 + self.after

    def pad(self, x: Tensor) -> Tensor:
        """`[b, h, n, d]` -> `[b, h, k * w, d]`, zeros after the sequence."""
        if x.shape[-2] == self.padded:
            return x
        return F.pad(x, (0, 0, 0, self.padded - x.shape[-2]))

    def keep(self, mask: Tensor | None, device: torch.device) -> Tensor:
        """Key padding mask `[b, n]` (True = keep) or None -> `[b or 1, k * w]`, False on the internal padding."""
        if mask is None:
            mask = torch.ones(1, self.length, dtype=torch.bool, device=device)
        return F.pad(mask, (0, self.padded - mask.shape[-1]), value=False)

    def blocks(self, x: Tensor) -> Tensor:
        """`[b, h, n, d]` -> `[(b k), h, w, d]`."""
        return rearrange(self.pad(x), "b h (k w) d -> (b k) h w d", w=self.block)

    def windows(self, x: Tensor, extra: Tensor | None = None) -> Tensor:
        """`[b, h, n, d]` -> `[(b k), h, (s w) + g, d]`: the keys of each block's window, zeros outside the
        sequence, followed by the `extra` keys `[b, h, g, d]` every block shares."""
        return _LookAround.apply(self.split(x), self.before, self.after, extra).flatten(0, 1)

    def split(self, x: Tensor) -> Tensor:
        """`[b, h, n, d]` -> `[b, h, k, w, d]` (a view when n is already whole blocks)."""
        return self.pad(x).unflatten(2, (self.num_blocks, self.block))

    def gather(self, x: Tensor, index: Tensor) -> Tensor:
        """`[b, h, n, d]` and `[k, h, s]` block indices -> `[(b k), h, (s w), d]`: listed blocks per block and head."""
        return _GatherBlocks.apply(self.split(x), index).flatten(0, 1)

    def window_keep(self, keep: Tensor) -> Tensor:
        """`[b, k * w]` per-key keep (from `keep`) -> `[b, k, (s w)]`, False outside the sequence."""
        w = self.block
        keep = F.pad(keep, (self.before * w, self.after * w), value=False)
        return keep.unfold(1, self.window_blocks * w, w)

    def unblock(self, x: Tensor, batch: int) -> Tensor:
        """`[(b k), h, w, d]` -> `[b, h, n, d]`, the padding removed."""
        return rearrange(x, "(b k) h w d -> b h (k w) d", b=batch)[:, :, : self.length]

    def query_positions(self, device: torch.device) -> Tensor:
        """`[k, w]` position of every query."""
        return torch.arange(self.padded, device=device).view(self.num_blocks, self.block)

    def offsets(self, device: torch.device) -> Tensor:
        """`[w, (s w)]` query position minus key position, the same for every block."""
        queries = torch.arange(self.block, device=device) + self.before * self.block
        return queries[:, None] - torch.arange(self.window_blocks * self.block, device=device)


class _LookAround(torch.autograd.Function):
    """`[b, h, k, w, d]` -> `[b, k, h, (s w) + g, d]`: blocks i - before .. i + after side by side, zeros outside,
    then the g `extra` keys `[b, h, g, d]` (global tokens) shared by every block.

    One write per window slot; autograd through `unfold`, padded slices or `cat` would cost several full-size zero
    fills and copies, while the backward here adds the s slices of the gradient into one tensor.
    """

    @staticmethod
    def forward(ctx, blocks: Tensor, before: int, after: int, extra: Tensor | None) -> Tensor:
        ctx.before, ctx.after, ctx.block = before, after, blocks.shape[3]
        b, h, k, w, d = blocks.shape
        window_blocks = before + 1 + after
        out = unwritten(blocks, (b, k, h, window_blocks * w + (0 if extra is None else extra.shape[-2]), d))
        slots = out[:, :, :, : window_blocks * w].unflatten(3, (window_blocks, w))
        source = blocks.transpose(1, 2)
        for shift in range(window_blocks):
            # Slot `shift` of block i holds block i + offset; blocks outside the sequence are zeros.
            offset = shift - before
            lo, hi = min(max(0, -offset), k), max(k - max(0, offset), 0)
            slots[:, lo:hi, :, shift] = source[:, lo + offset : hi + offset]
            slots[:, :lo, :, shift] = 0
            slots[:, hi:, :, shift] = 0
        if extra is not None:
            out[:, :, :, window_blocks * w :] = extra[:, None]
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        before, after, w = ctx.before, ctx.after, ctx.block
        window_blocks = before + 1 + after
        k = grad.shape[1]
        slots = grad[:, :, :, : window_blocks * w].unflatten(3, (window_blocks, w))
        out = slots[:, :, :, before].clone()
        for shift in range(window_blocks):
            offset = shift - before
            lo, hi = min(max(0, -offset), k), max(k - max(0, offset), 0)
            if offset != 0 and lo < hi:
                out[:, lo + offset : hi + offset] += slots[:, lo:hi, :, shift]
        grad_extra = grad[:, :, :, window_blocks * w :].sum(1) if ctx.needs_input_grad[3] else None
        return out.transpose(1, 2), None, None, grad_extra


class _GatherBlocks(torch.autograd.Function):
    """`[b, h, k, w, d]` blocks and `[k, h, s]` block indices -> `[b, k, h, (s w), d]`: for each query block and
    head, the s listed key blocks side by side. The backward scatters with `index_add_` (one pass), not through the
    accumulate `index_put_` autograd gives advanced indexing."""

    @staticmethod
    def forward(ctx, blocks: Tensor, index: Tensor) -> Tensor:
        b, h, k, w, d = blocks.shape
        flat_index = (index + torch.arange(h, device=index.device)[:, None] * k).flatten()  # rows of (h k)
        ctx.save_for_backward(flat_index)
        ctx.shape = blocks.shape
        out = blocks.reshape(b, h * k, w * d).index_select(1, flat_index)
        return out.view(b, *index.shape[:2], index.shape[2] * w, d)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (flat_index,) = ctx.saved_tensors
        b, h, k, w, d = ctx.shape
        out = grad.new_zeros(b, h * k, w * d).index_add_(1, flat_index, grad.reshape(b, -1, w * d))
        return out.view(b, h, k, w, d), None


def window_layout(length: int, window: int, is_causal: bool, min_block: int = 64) -> BlockLayout:
    """Blocks covering a sliding window of `window` positions each side (or behind, when causal).

    Blocks are the window length (at least `min_block`, so tiny windows do not become tiny matmuls, at most the
    sequence); each block looks at as many neighbouring blocks as the window reaches.
    """
    block = min(max(window, min_block), length)
    reach = min(math.ceil(window / block), math.ceil(length / block) - 1)
    return BlockLayout(length, block, before=reach, after=0 if is_causal else reach)


def band_keep(offsets: Tensor, window: int, is_causal: bool) -> Tensor:
    """True where query - key `offsets` lie in the sliding window: |i - j| <= window, or 0 <= i - j <= window."""
    if is_causal:
        return (offsets >= 0) & (offsets <= window)
    return offsets.abs() <= window


def rows_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    keep: Tensor,
    is_causal: bool,
    scale: float,
    dropout_p: float,
) -> Tensor:
    """Exact attention of the queries at `rows` over all keys (global tokens).

    q, k, v: `[b, h, n, d]`; rows: `[g]` long; keep: `[b or 1, n]` bool key mask -> `[b, h, g, d]`. Memory O(g n).
    """
    allowed = keep[:, None, None, :]
    if is_causal:
        allowed = allowed & (torch.arange(k.shape[-2], device=k.device) <= rows[:, None])
    return F.scaled_dot_product_attention(q[:, :, rows], k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale)


def partial_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, scale: float, dropout_p: float):
    """Softmax attention over one part of a query's keys, with the part's log normaliser for `merge_partials`.

    q: `[..., n, d]`, k, v: `[..., m, d]` (same leading dims), keep: bool broadcastable to `[..., n, m]` ->
    (out `[..., n, d]`, lse `[..., n]`). A query with no kept key gets zeros and a log normaliser near the float
    minimum, so the part has no weight in `merge_partials`. Run in float32 or wider: the caller upcasts half
    precision.
    """
    return _PartialSoftmax.apply(q, k, v, keep, scale, dropout_p)


class _PartialSoftmax(torch.autograd.Function):
    """`partial_attention` with a hand-written backward: the scores are formed, masked, normalised and
    exponentiated in place, and the backward takes the log normaliser's gradient in the same pass as the softmax
    one (dS = P * (dP - rowsum(P * dP) + dlse)), so the [n, m] tensors are touched a few times, not a dozen."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor, scale: float, dropout_p: float):
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
        # A finite fill, never -inf: a row with every key masked stays finite, its output is zeroed below.
        scores.masked_fill_(~keep, torch.finfo(scores.dtype).min)
        # In place, one pass each: cheaper than logsumexp followed by exp(scores - lse).
        peak = scores.amax(-1, keepdim=True)
        probs = scores.sub_(peak).exp_()
        total = probs.sum(-1, keepdim=True)
        probs.div_(total)
        lse = (peak + total.log()).squeeze(-1)
        dropped = None
        if dropout_p > 0:
            dropped = torch.empty_like(probs).bernoulli_(1 - dropout_p).div_(1 - dropout_p)
        any_kept = keep.any(-1, keepdim=True)
        # Out of place: under torch.compile, torch 2.11's Dynamo drops the gradient of an output that the forward
        # saved after changing it in place (v's gradient came back zero; 2.14 is right either way)
        out = torch.matmul(probs if dropped is None else probs * dropped, v) * any_kept
        ctx.save_for_backward(q, k, v, probs, dropped, any_kept, out)
        ctx.scale = scale
        return out, lse

    @staticmethod
    def backward(ctx, grad_out: Tensor, grad_lse: Tensor):
        q, k, v, probs, dropped, any_kept, out = ctx.saved_tensors
        grad_out = grad_out * any_kept
        used = probs if dropped is None else probs * dropped
        grad_v = torch.matmul(used.transpose(-1, -2), grad_out)
        grad_probs = torch.matmul(grad_out, v.transpose(-1, -2))
        if dropped is not None:
            grad_probs.mul_(dropped)
        # Softmax backward: rowsum(P * dP); without dropout it equals rowsum(dO * O), far cheaper to form.
        delta = (grad_probs * probs).sum(-1) if dropped is not None else (grad_out * out).sum(-1)
        grad_scores = grad_probs.sub_((delta - grad_lse)[..., None]).mul_(probs)
        grad_q = torch.matmul(grad_scores, k).mul_(ctx.scale)
        grad_k = torch.matmul(grad_scores.transpose(-1, -2), q).mul_(ctx.scale)
        return grad_q, grad_k, grad_v, None, None, None


def merge_partials(outs: Sequence[Tensor], lses: Sequence[Tensor]) -> Tensor:
    """One softmax over the union of disjoint key parts: `outs` `[..., n, d]`, `lses` `[..., n]` -> `[..., n, d]`.

    Each part's output is reweighted by its share exp(lse_part - lse_all) of the single normaliser.
    """
    total = torch.stack(list(lses)).logsumexp(0)
    merged = outs[0] * torch.exp(lses[0] - total)[..., None]
    for out, lse in zip(outs[1:], lses[1:], strict=True):
        merged = merged + out * torch.exp(lse - total)[..., None]
    return merged


def as_sdpa_mask(keep: Tensor, batch: int) -> Tensor:
    """`[b or 1, k, ..., w or 1, m]` bool -> `[(b k), ..., w or 1, m]` for per-block attention."""
    return keep.expand(batch, *keep.shape[1:]).flatten(0, 1)


# The explicit references of the windowed families (`reference=True`): the pattern as a dense `[n, n]` mask, O(n^2)
# memory, one exact softmax per query over the keys it allows.


def position_offsets(n: int, device: torch.device) -> Tensor:
    """`[n, n]` query position minus key position, i - j."""
    positions = torch.arange(n, device=device)
    return positions[:, None] - positions


def allowed_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, mask: Tensor | None, scale: float | None, dropout_p: float
) -> Tensor:
    """Exact softmax attention over the keys `allowed` gives each query, on dense scores.

    q, k, v: `[b, h, n, d]`; allowed: bool broadcastable to `[b, h, n, n]`, True where query i may see key j;
    mask: `[b, n]` key padding mask, True = keep, or None -> `[b, h, n, d]`. A query with no allowed kept key gets
    zeros, as the blocked paths give.
    """
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    # The lowest finite value, not -inf, then zeros: a row with no allowed key stays finite and gets no weight.
    weights = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1) * allowed
    return torch.matmul(F.dropout(weights, dropout_p) if dropout_p > 0 else weights, v)
