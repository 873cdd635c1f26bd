"""Flash parts: the CPU kernel the windowed families share (local, dilated, longformer, bigbird, banded_conv).

A pattern is cut into regular parts, each a batch of equal query groups against equal key groups with no mask (or a
small one), which the CPU flash-attention kernel runs without forming the scores in memory; a causal flag lets it
skip the upper triangle of a part. The parts' outputs are merged through their log normalisers into one softmax
over the union of their keys, and the backward calls the kernel's backward once per part with the merged output
and normaliser, which gives each part's share of the exact gradients (the softmax's row sums are those of the whole
row). See `Part` and `parts_attention`; `band_parts` cuts a sliding window into parts.

Letter legend: b - batch, h - heads, n - length, d - head dim, g - extra (global) keys, m - key length.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .._workspace import unwritten

__all__ = [
    "FLASH_KEY_TILE",
    "FLASH_MIN_BLOCK",
    "FLASH_OP_SCHEMAS",
    "PIECE_BYTES",
    "Part",
    "additive",
    "band_parts",
    "flash_ops_problem",
    "on_kept_prefixes",
    "parts_apply",
    "parts_attention",
    "prefix_lengths",
    "use_flash_parts",
]

# The private ATen operators the parts call (SDPA's CPU flash kernel and its backward), with the schemas this code
# was written against. They are no public API: a torch whose operators differ, or lack them, turns the parts off
# (`flash_ops_problem`), and the windowed variants take their masked F.scaled_dot_product_attention path.
_FLASH_FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
_FLASH_BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"
FLASH_OP_SCHEMAS = {
    _FLASH_FORWARD: (
        "aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, "
        "float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) "
        "-> (Tensor output, Tensor logsumexp)"
    ),
    _FLASH_BACKWARD: (
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, Tensor key, "
        "Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor? attn_mask=None, "
        "float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)"
    ),
}


@functools.cache
def flash_ops_problem() -> str | None:
    """Why the running torch cannot run the flash parts (an operator of `FLASH_OP_SCHEMAS` missing, or with
    another schema), or None when it can."""
    for name, expected in FLASH_OP_SCHEMAS.items():
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            return f"torch {torch.__version__} has no aten::{name}"
        actual = str(packet.default._schema)
        if actual != expected:
            return f"torch {torch.__version__} changed aten::{name} to {actual!r}, expected {expected!r}"
    return None


@functools.cache
def _warn_flash_ops_off(problem: str) -> None:
    # once per process: the first windowed forward that would have taken the parts
    warnings.warn(
        f"the CPU flash-parts path of the windowed attentions is off: {problem}; they run their masked "
        "F.scaled_dot_product_attention path instead (same results, slower on CPU)",
        RuntimeWarning,
        stacklevel=3,
    )


@functools.cache
def _flash_op(name: str) -> torch._ops.OpOverload:
    return getattr(torch.ops.aten, name).default


# Blocks shorter than this are left to the masked path: the kernel's tiles would be too small to pay off.
FLASH_MIN_BLOCK = 64
# The kernel skips the masked half of a causal part only in whole key tiles of this length (torch 2.14 CPU: a
# causal part shorter than a tile costs as much as a full one). Below it a mask is as fast as a flip and spares the
# flip's copies of q, k, v and their gradients.
FLASH_KEY_TILE = 512


def use_flash_parts(q: Tensor, mask: Tensor | None, dropout_p: float, block: int) -> bool:
    """Whether the flash-parts path applies: CPU, float32 / float64, no key padding mask, no dropout, and
    blocks of `block` >= `FLASH_MIN_BLOCK` positions, in eager mode (under `torch.compile` the masked path, which
    every device runs and which traces into one graph; the parts' Python loops over strided views do not), on a
    torch whose private operators match `FLASH_OP_SCHEMAS` (else a RuntimeWarning, once, and the masked path)."""
    applies = (
        q.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and q.dtype in (torch.float32, torch.float64)
        and mask is None
        and dropout_p == 0
        and block >= FLASH_MIN_BLOCK
    )
    if applies and flash_ops_problem() is not None:
        _warn_flash_ops_off(flash_ops_problem())
        return False
    return applies


def parts_apply(q: Tensor, mask: Tensor | None, dropout_p: float, block: int) -> bool:
    """`choose_path`'s `kernel` predicate for a pattern that depends only on positions: the parts run on the whole
    batch (`use_flash_parts`), or, under a right-padding mask, on each sample's kept prefix (`prefix_lengths`)."""
    return use_flash_parts(q, mask, dropout_p, block) or prefix_lengths(q, mask, dropout_p) is not None


def prefix_lengths(q: Tensor, mask: Tensor | None, dropout_p: float) -> list[int] | None:
    """Each sample's kept length when `mask: [b, n]` (True = keep) keeps a prefix of every row (right padding, as
    `PadCollate` pads) and the flash path would apply without it (CPU, float32 / float64, no dropout); else None.

    A windowed pattern that depends only on positions then runs unmasked on each sample's prefix
    (`on_kept_prefixes`) instead of leaving the flash kernel for the masked path, which is far slower.
    """
    if mask is None or mask.dim() != 2 or not use_flash_parts(q, None, dropout_p, FLASH_MIN_BLOCK):
        return None
    lengths = mask.sum(-1)
    if not torch.equal(mask, torch.arange(mask.shape[-1], device=mask.device) < lengths[:, None]):
        return None
    return lengths.tolist()


def on_kept_prefixes(
    attend: Callable[[Tensor, Tensor, Tensor], Tensor], q: Tensor, k: Tensor, v: Tensor, lengths: Sequence[int]
) -> Tensor:
    """`attend(q, k, v)` without a mask on each sample's first `lengths[i]` positions; q, k, v `[b, h, n, d]` ->
    `[b, h, n, d]`, the rows of padded queries zero. Samples of one length run as one batch.

    Exact at every kept query for a pattern that depends only on positions: its keys are the same but the padded
    ones, which the mask gives no weight.
    """
    n = q.shape[-2]
    if set(lengths) == {n}:
        # nothing padded (an all-True mask): the whole batch, without gathering or padding copies
        return attend(q, k, v)
    order, pieces = [], []
    for length in sorted(set(lengths)):
        rows = [i for i, kept in enumerate(lengths) if kept == length]
        index = torch.tensor(rows, device=q.device)
        if length:
            group = (q, k, v) if len(rows) == len(lengths) else (x.index_select(0, index) for x in (q, k, v))
            piece = attend(*(x[:, :, :length] for x in group))
        else:
            piece = q.new_zeros(len(rows), q.shape[1], 0, v.shape[-1])
        pieces.append(F.pad(piece, (0, 0, 0, n - length)))
        order += rows
    out = torch.cat(pieces)
    return out if order == sorted(order) else out[torch.argsort(torch.tensor(order, device=q.device))]


@dataclass(frozen=True, eq=False)
class Part:
    """`count` query groups of `length` positions each, group i starting at `start + i * stride`, against the
    `key_length` keys starting at `key_start + i * key_stride` of the key `source`:

    - "self": the sequence's own keys and values (overlapping key groups are fine);
    - "extra": the extra keys every group shares (`key_stride` 0), e.g. global tokens;
    - "gather": for group i and head j, the `key_length // block` blocks `index[i, j]` of `block` keys each.

    `causal` keeps key t <= query t inside a group (the kernel's top-left diagonal); `flip` reverses the
    positions of both queries and keys inside each group first, so `causal` then keeps key t >= query t.
    `mask`: an additive float mask broadcastable to `[count, h, length, key_length]`, 0 or a large negative
    number (never -inf), or None.
    """

    start: int
    count: int
    length: int
    key_start: int
    key_length: int
    stride: int = 0
    key_stride: int = 0
    source: str = "self"
    causal: bool = False
    flip: bool = False
    mask: Tensor | None = None
    index: Tensor | None = None
    block: int = 0


def _offset(x: Tensor, batch: tuple[int, ...], start: int) -> int:
    return (
        x.storage_offset()
        + sum(i * s for i, s in zip(batch, x.stride(), strict=False))
        + start * x.stride(len(batch) + 1)
    )


def _group_view(x: Tensor, batch: tuple[int, ...], start: int, count: int, length: int, stride: int) -> Tensor:
    """`x` `[..., h, n, d]` (unit stride in d) -> the `[count, h, length, d]` view of batch element `batch` (an
    index into the leading dims), group i starting at position `start + i * stride`."""
    sh, sn, sd = x.stride()[-3:]
    return x.as_strided((count, x.shape[-3], length, x.shape[-1]), (stride * sn, sh, sn, sd), _offset(x, batch, start))


def _lse_view(x: Tensor, batch: tuple[int, ...], start: int, count: int, length: int, stride: int) -> Tensor:
    """`x` `[..., h, n]` -> the `[count, h, length]` view, as `_group_view`."""
    sh, sn = x.stride()[-2:]
    return x.as_strided((count, x.shape[-2], length), (stride * sn, sh, sn), _offset(x, batch, start))


def _empty_like_layout(x: Tensor, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None) -> Tensor:
    """An empty tensor of `shape` (default x's) whose dims are laid out in memory in the order of x's strides
    (x need not be dense: a q sliced out of a fused qkv projection gives `[b, n, h, d]` order)."""
    shape = tuple(x.shape if shape is None else shape)
    order = sorted(range(len(shape)), key=lambda i: (-x.stride(i), i))
    out = unwritten(x, [shape[i] for i in order], dtype=dtype)
    return out.permute([order.index(i) for i in range(len(shape))])


def _add_key_grad(grad: Tensor, part: Part, batch: tuple[int, ...], update: Tensor) -> None:
    """Add the `[count, h, key_length, d]` gradient of a "self" part's keys into `grad` `[..., h, n, d]`."""
    if part.key_stride == 0:
        _group_view(grad, batch, part.key_start, 1, part.key_length, 0).add_(update.sum(0, keepdim=True))
        return
    # Overlapping key groups: add slices no longer than the stride, each a non-overlapping view.
    for lo in range(0, part.key_length, part.key_stride):
        hi = min(lo + part.key_stride, part.key_length)
        _group_view(grad, batch, part.key_start + lo, part.count, hi - lo, part.key_stride).add_(update[:, :, lo:hi])


def _gather_rows(part: Part, h: int, blocks: int) -> Tensor:
    """Rows (head, block) of `_block_rows` that a "gather" part reads, group by group."""
    return (part.index + torch.arange(h, device=part.index.device)[:, None] * blocks).flatten()


def _block_rows(x: Tensor, batch: tuple[int, ...], block: int) -> Tensor:
    """Batch element `batch` of `[..., h, n, d]` as contiguous rows `[(h blocks), block * d]` of its whole blocks:
    a copy made once per pass, from which every "gather" piece reads its blocks with one `index_select`."""
    blocks = x.shape[-2] // block
    return x[batch][:, : blocks * block].reshape(x.shape[-3] * blocks, block * x.shape[-1])


def _gathered(rows: Tensor, part: Part, h: int, d: int) -> Tensor:
    """`[count, h, key_length, d]`: for group i and head j, the blocks `part.index[i, j]` out of `_block_rows`."""
    picked = rows.index_select(0, _gather_rows(part, h, rows.shape[0] // h))
    return picked.view(part.count, h, part.key_length, d)


def _add_gathered_grads(grad_rows: dict, rows: tuple[Tensor, ...], part: Part, updates: tuple[Tensor, ...]) -> None:
    """The backward of `_gathered`: add a "gather" piece's key and value gradients `[count, h, key_length, d]`
    into the rows they were read from, buffers shaped like `rows` (k's and v's `_block_rows`) kept in
    `grad_rows` per block length until `_add_block_rows` writes them back once per batch element."""
    if part.block not in grad_rows:
        grad_rows[part.block] = tuple(torch.zeros_like(x) for x in rows)
    h = updates[0].shape[1]
    index = _gather_rows(part, h, rows[0].shape[0] // h)
    for buffer, update in zip(grad_rows[part.block], updates, strict=True):
        buffer.index_add_(0, index, update.reshape(index.shape[0], -1))


def _add_block_rows(grad: Tensor, batch: tuple[int, ...], block: int, rows: Tensor) -> None:
    """Add gradient rows `[(h blocks), block * d]` (as `_block_rows`) into `grad`'s batch element `batch`."""
    h, d = grad.shape[-3], grad.shape[-1]
    grad[batch][:, : rows.shape[0] // h * block].add_(rows.view(h, -1, d))


# Kernel calls are cut to at most this many bytes of queries: the kernel's outputs and gradients are fresh
# tensors per call, and glibc serves blocks this small from memory it reuses, where larger ones are mapped anew
# each time and pay a page fault per page, which at long lengths shows up as time spent zero-filling.
PIECE_BYTES = 8 << 20


def _pieces(parts: Sequence[Part], q: Tensor) -> list[Part]:
    """`parts` with each cut into runs of groups small enough for `PIECE_BYTES`; a single long group without a
    causal diagonal (global keys against every query) is cut into runs of queries instead."""
    pieces = []
    row_bytes = q.shape[-3] * q.shape[-1] * q.element_size()
    for part in parts:
        if part.count == 1 and not part.causal and part.length * row_bytes > PIECE_BYTES:
            pieces.extend(_row_pieces(part, max(1, PIECE_BYTES // row_bytes)))
            continue
        size = max(1, PIECE_BYTES // (part.length * row_bytes))
        for first in range(0, part.count, size):
            count = min(size, part.count - first)
            mask = part.mask
            if mask is not None and mask.dim() == 4 and mask.shape[0] == part.count > 1:
                mask = mask[first : first + count]
            pieces.append(
                dataclasses.replace(
                    part,
                    start=part.start + first * part.stride,
                    key_start=part.key_start + first * part.key_stride,
                    count=count,
                    mask=mask,
                    index=None if part.index is None else part.index[first : first + count],
                )
            )
    return pieces


def _row_pieces(part: Part, rows: int) -> list[Part]:
    """A one-group part cut into runs of `rows` queries, each against the same keys."""
    pieces = []
    for first in range(0, part.length, rows):
        length = min(rows, part.length - first)
        mask = part.mask
        if mask is not None and mask.shape[-2] == part.length > 1:
            mask = mask[..., first : first + length, :]
        pieces.append(dataclasses.replace(part, start=part.start + first, length=length, mask=mask))
    return pieces


def _flipped(x: Tensor, flip: bool) -> Tensor:
    return x.flip(2) if flip else x


def _query_view(x: Tensor, batch: tuple[int, ...], part: Part) -> Tensor:
    """A part's queries (or their output, or its gradient) in `x` `[..., h, n, d]`, flipped as the part says."""
    return _flipped(_group_view(x, batch, part.start, part.count, part.length, part.stride), part.flip)


def _batches(x: Tensor) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(size) for size in x.shape[:-3])))


class _FlashParts(torch.autograd.Function):
    """`parts_attention` with the hand-written backward described at the top of this section."""

    @staticmethod
    def forward(ctx, q, k, v, k_extra, v_extra, dense, parts, offsets, scale):
        # Output, normaliser and gradients follow q's memory order: for q sliced out of a fused projection,
        # `[b, n, h, d]`, so `b h n d -> b n (h d)` after attention is a view.
        out = _empty_like_layout(q).zero_()
        lse = _empty_like_layout(q[..., 0], dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
        lse.fill_(-math.inf)
        results = []
        for batch in _batches(q):
            rows = {}
            for part in _pieces(parts, q):
                keys, values = _part_keys(part, batch, k, v, k_extra, v_extra, rows)
                queries = _group_view(q, batch, part.start, part.count, part.length, part.stride)
                part_out, part_lse = _flash_op(_FLASH_FORWARD)(
                    _flipped(queries, part.flip),
                    _flipped(keys, part.flip),
                    _flipped(values, part.flip),
                    0.0,
                    part.causal,
                    attn_mask=part.mask,
                    scale=scale,
                )
                part_out, part_lse = _flipped(part_out, part.flip), part_lse.flip(-1) if part.flip else part_lse
                total = _lse_view(lse, batch, part.start, part.count, part.length, part.stride)
                torch.logaddexp(total, part_lse, out=total)
                results.append((batch, part, part_out, part_lse))
        if dense is not None:
            torch.logaddexp(lse, torch.logsumexp(dense, -1), out=lse)
        for batch, part, part_out, part_lse in results:
            total = _lse_view(lse, batch, part.start, part.count, part.length, part.stride)
            share = torch.exp(part_lse - total).unsqueeze(-1).to(part_out.dtype)
            _group_view(out, batch, part.start, part.count, part.length, part.stride).addcmul_(part_out, share)
        if dense is not None:
            share = torch.exp(dense - lse.unsqueeze(-1)).to(out.dtype)
            for i, (rows, keys) in enumerate(_dense_ranges(offsets, q.shape[-2])):
                out[..., rows, :].addcmul_(v[..., keys, :], share[..., rows, i, None])
        ctx.save_for_backward(q, k, v, k_extra, v_extra, dense, out, lse)
        ctx.parts, ctx.offsets, ctx.scale = parts, offsets, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, k_extra, v_extra, dense, out, lse = ctx.saved_tensors
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        grad_q, grad_k, grad_v = (_empty_like_layout(x).zero_() for x in (q, k, v))
        grad_k_extra = None if k_extra is None else torch.zeros_like(k_extra)
        grad_v_extra = None if v_extra is None else torch.zeros_like(v_extra)
        for batch in _batches(q):
            rows, grad_rows = {}, {}
            for part in _pieces(ctx.parts, q):
                keys, values = _part_keys(part, batch, k, v, k_extra, v_extra, rows)
                total = _lse_view(lse, batch, part.start, part.count, part.length, part.stride)
                gq, gk, gv = _flash_op(_FLASH_BACKWARD)(
                    _query_view(grad_out, batch, part),
                    _query_view(q, batch, part),
                    _flipped(keys, part.flip),
                    _flipped(values, part.flip),
                    _query_view(out, batch, part),
                    total.flip(-1) if part.flip else total,
                    0.0,
                    part.causal,
                    attn_mask=part.mask,
                    scale=ctx.scale,
                )
                gq, gk, gv = (_flipped(g, part.flip) for g in (gq, gk, gv))
                _group_view(grad_q, batch, part.start, part.count, part.length, part.stride).add_(gq)
                if part.source == "self":
                    _add_key_grad(grad_k, part, batch, gk)
                    _add_key_grad(grad_v, part, batch, gv)
                elif part.source == "extra":
                    keys = slice(part.key_start, part.key_start + part.key_length)
                    grad_k_extra[batch][:, keys].add_(gk.sum(0))
                    grad_v_extra[batch][:, keys].add_(gv.sum(0))
                else:
                    _add_gathered_grads(grad_rows, rows[part.block], part, (gk, gv))
            for block, (rows_k, rows_v) in grad_rows.items():
                _add_block_rows(grad_k, batch, block, rows_k)
                _add_block_rows(grad_v, batch, block, rows_v)
        grad_dense = None
        if dense is not None:
            # The dense part's softmax backward, by hand: dE = P * (dP - rowsum(dO * O)).
            probs = torch.exp(dense - lse.unsqueeze(-1)).to(out.dtype)
            grad_dense = torch.zeros_like(probs)
            for i, (rows, keys) in enumerate(_dense_ranges(ctx.offsets, q.shape[-2])):
                grad_dense[..., rows, i] = (grad_out[..., rows, :] * v[..., keys, :]).sum(-1)
                grad_v[..., keys, :].addcmul_(grad_out[..., rows, :], probs[..., rows, i, None])
            grad_dense.sub_((grad_out * out).sum(-1, keepdim=True)).mul_(probs)
        return grad_q, grad_k, grad_v, grad_k_extra, grad_v_extra, grad_dense, None, None, None


def _part_keys(
    part: Part, batch, k: Tensor, v: Tensor, k_extra: Tensor | None, v_extra: Tensor | None, rows: dict
) -> tuple[Tensor, Tensor]:
    """A piece's keys and values `[count, h, key_length, d]`; `rows` caches `_block_rows` of k and v per block
    length for the pieces of one batch element."""
    if part.source == "self":
        return tuple(
            _group_view(x, batch, part.key_start, part.count, part.key_length, part.key_stride) for x in (k, v)
        )
    if part.source == "extra":
        return tuple(
            x[batch][None, :, part.key_start : part.key_start + part.key_length].expand(part.count, -1, -1, -1)
            for x in (k_extra, v_extra)
        )
    if part.block not in rows:
        rows[part.block] = tuple(_block_rows(x, batch, part.block) for x in (k, v))
    return tuple(_gathered(x, part, k.shape[-3], k.shape[-1]) for x in rows[part.block])


def parts_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    parts: Sequence[Part],
    scale: float,
    k_extra: Tensor | None = None,
    v_extra: Tensor | None = None,
    dense: Tensor | None = None,
    offsets: Sequence[int] = (),
) -> Tensor:
    """One softmax per query over the union of the keys its `parts` give it, on the CPU flash kernel.

    q, k, v: `[..., h, n, d]`; k_extra, v_extra: `[..., h, g, d]` keys of "extra" parts -> `[..., h, n, d]` in
    q's memory order (one kernel call per part and batch element). `dense`: `[..., h, n, m]` logits, already
    scaled, of query i against the keys i + `offsets[j]` (plain tensors, for a few keys per query whose logits
    are not dot products; a large negative value where that key is missing), or None. Queries in no part get
    zeros. The parts of one query must hold disjoint keys, and every query in a part at least one unmasked key.
    """
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    return _FlashParts.apply(q, k, v, k_extra, v_extra, dense, tuple(parts), tuple(offsets), scale)


def _dense_ranges(offsets: Sequence[int], n: int) -> list[tuple[slice, slice]]:
    """For each offset o: the queries i with i + o inside the sequence, and their keys i + o."""
    ranges = []
    for o in offsets:
        lo, hi = max(0, -o), min(n, n - o)
        ranges.append((slice(lo, max(lo, hi)), slice(lo + o, max(lo, hi) + o)))
    return ranges


def additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """Bool `allowed` -> an additive mask: 0 where allowed, a large negative (finite) number elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, -1e30)


def band_parts(
    length: int, window: int, is_causal: bool, device: torch.device, dtype: torch.dtype, shift: int = 0
) -> list[Part]:
    """The parts of a sliding window of `window` positions each side (causal: behind) over `length` positions:
    query i sees keys j with |i - j| <= window (causal: 0 <= i - j <= window). With `shift`, the queries are
    the positions `shift .. shift + length` of a longer sequence, their keys still `0 .. length`.

    Blocks of `window` positions: each block against itself (full, or its lower triangle when causal), against
    the next block (keys up to the query's own offset: a causal part) and against the previous block (keys from
    the query's own offset: a one-block mask, or a flipped causal part for windows the kernel can skip tiles
    of). A shorter last block gets its own parts; its part against the previous block is masked.
    """
    w = min(window, length)
    full, tail = divmod(length, w)
    parts = [Part(0, full, w, 0, w, w, w, causal=is_causal)]
    if tail:
        parts.append(Part(full * w, 1, tail, full * w, tail, causal=is_causal))
    if not is_causal and full > 1:
        parts.append(Part(0, full - 1, w, w, w, w, w, causal=True))
    if not is_causal and tail:
        parts.append(Part((full - 1) * w, 1, w, full * w, tail, causal=True))
    # Key v of the previous block is in the window of query u when v >= u.
    upper = additive(torch.arange(w, device=device) >= torch.arange(w, device=device)[:, None], dtype)
    if full > 1 and w > FLASH_KEY_TILE:
        parts.append(Part(w, full - 1, w, 0, w, w, w, causal=True, flip=True))
    elif full > 1:
        parts.append(Part(w, full - 1, w, 0, w, w, w, mask=upper))
    if tail:
        parts.append(Part(full * w, 1, tail, (full - 1) * w, w, mask=upper[:tail]))
    return [dataclasses.replace(part, start=part.start + shift) for part in parts] if shift else parts
