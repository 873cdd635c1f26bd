"""Fused GPU kernels (Triton) for non-causal kernelised attention: `phi(q) (phi(k)^T v) / (phi(q) . sum phi(k))`.

One op for the linear family's non-causal mode (`linear`'s elu + 1, `performer`'s FAVOR+ softmax and relu
kernels, `hedgehog`'s learned softmax features), in the shape of fla-org's flash-bidirectional-linear-attention
(read for the algorithm only): two forward kernels, the state `S = phi(K)^T V` with the key sum `z = phi(K)^T 1`,
then `O = phi(Q) S / (phi(Q) z)`, and two backward kernels, one over the queries (`dQ`, and `dS`, `dz` by
reduction), one over the keys (`dK`, `dV`). The feature map is computed inside every kernel, from q or k as they
come out of the qkv projection (bf16 or fp32, strided views, no copy), in fp32 registers: the `[b, h, n, r]`
features never reach memory, in forward or backward. Saved for backward: q, k, v, the output (written in the
`[b, n, h, d]` layout that `proj` takes as a view, so the two share it), FAVOR's per-head key offset, and the
`[r, e]` state with the key sum where they are no larger than SDPA's log-sum-exp (`saves_state`; else the
backward recomputes them from k and v): never more than SDPA keeps.

FAVOR's and RELU's features past 64 are held 64 at a time (HEDGEHOG's, when `ZOO_FUSED_CONFIG` asks, by halves,
one softmax each): the state kernel and the gradient sums take one chunk a program, the query and key kernels loop
over the chunks, and FAVOR's query stabiliser (the max over all features) is carried across chunks as online
softmax carries its max. Whole, with triton's three pipeline stages, 256 random features ask for 326 KB of shared
memory per program in the query backward on triton 3.8 (an H100 or H200 has 227 KB); in chunks, 88 KB
(`zoo_bench.kernel_resources` compiles the kernels for sm_90 without a GPU, as a launch specialises them;
`tests/tools/test_kernel_resources.py` holds the largest within the limit).

The kernels are plain `@triton.jit` (no autotuning), so they run on CPU tensors under `TRITON_INTERPRET=1`, which
is how the suite tests them against the torch paths. The op is a `torch.library.custom_op` with its autograd
registered, so `torch.compile` sees one opaque node and no graph break; eagerly an autograd function calls the
same Python bodies without the dispatcher's wrappers (`_EagerFusedAttention`). Reductions over the sequence (the
state, its gradient, hedgehog's map gradients) are split over programs and added with fp32 atomics: the summation
order, and so the last bits, vary from run to run on a GPU.

Chosen automatically for CUDA tensors by the variants (`fused_usable`); `ZOO_FUSED=0` turns it off.

Feature maps (`Feature`), x being a query or key row `[d]`, P the projection `[d, r]` (already scaled):
    ELU       phi = elu(x) + 1                                              (r = d)
    FAVOR     phi = exp(x P - |x|^2 / (2 sqrt(d)) - offset - log(r) / 2) + eps / sqrt(r)
              offset: a query row's max of x P; for keys, the max of k P over the (sample, head)'s kept keys
    RELU      phi = relu(x P) / sqrt(r) + eps
    HEDGEHOG  phi = [softmax(x W), softmax(-x W)], P = [W, -W] per head     (r = 2 f)
Padded keys get phi = 0.

Letter legend: b - batch, h - heads, n - length, d - head dim, e - value dim, r - features, c - features in a chunk,
w - rows in a tile.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import os
import typing
from collections.abc import Iterator

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
    from triton.runtime.errors import OutOfResources
except ImportError:  # pragma: no cover - triton ships with torch's Linux wheels
    triton = None

__all__ = ["Feature", "force_fused", "fused_kernel_attention", "fused_usable"]

# The normaliser's floor, as the torch paths' (`_kernel.DENOMINATOR_EPS`).
_DENOMINATOR_EPS = 1e-12
# Registers hold the `[r, e]` state tile and a `[w, r]` feature tile: past this product the fused path is not taken.
_MAX_STATE_TILE = 256 * 128


class Feature(enum.IntEnum):
    """The feature map the kernels compute (the `KIND` constexpr)."""

    ELU = 0
    FAVOR = 1
    RELU = 2
    HEDGEHOG = 3


def _pow2(x: int) -> int:
    """The power of two at or above x, at least 16 (`tl.dot`'s smallest side); in Python, as triton's
    `next_power_of_2` is a jitted function whose every call from Python goes through a launcher."""
    return max(16, 1 << (x - 1).bit_length())


_FORCED = False


@contextlib.contextmanager
def force_fused() -> Iterator[None]:
    """Within the block the variants take the fused kernels on any device: on CPU tensors they run in Triton's
    interpreter (`TRITON_INTERPRET=1` set before triton is imported), which is how the suite tests them."""
    global _FORCED
    previous, _FORCED = _FORCED, True
    try:
        yield
    finally:
        _FORCED = previous


def fused_usable(q: Tensor, k: Tensor, v: Tensor, features: int) -> bool:
    """Whether `fused_kernel_attention` takes these `[b, h, n, d]` tensors on its own: CUDA (or `force_fused`),
    triton importable, `ZOO_FUSED` not 0, self-attention shapes (queries and keys of one length, value dim = head
    dim) and a state tile `[features, d]` that fits the kernels' registers."""
    return (
        triton is not None
        and (q.is_cuda or _FORCED)
        and os.environ.get("ZOO_FUSED", "1") != "0"
        and q.shape == k.shape == v.shape
        and _pow2(features) * _pow2(v.shape[-1]) <= _MAX_STATE_TILE
    )


if triton is not None:
    # Triton's interpreter multiplies bf16 tiles as raw 16-bit integers (numpy has no bf16): there, bf16 operands
    # are rounded to bf16 and multiplied in fp32, the same products
    _BF16_IN_FP32 = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

    @triton.jit
    def _dot(a, b, PREC: tl.constexpr):
        """a @ b summed in fp32: "ieee" (fp32 inputs), "tf32", or "bf16" operands."""
        if PREC == "bf16":
            if _BF16_IN_FP32:
                return tl.dot(
                    a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), input_precision="ieee"
                )
            else:
                return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        else:
            return tl.dot(a, b, input_precision=PREC)

    @triton.jit
    def _chunk(c, cols_c, stride, width, r):
        """Chunk c of the features: their indices `[C]` (rows of S, columns of P) and which of them exist."""
        feats = c * stride + cols_c
        return feats, (cols_c < width) & (feats < r)

    @triton.jit
    def _pre(x, proj, KIND: tl.constexpr, PREC: tl.constexpr):
        """A tile's pre-activations `[w, C]`: x P, or x itself for ELU (whose features are x's columns)."""
        if KIND == 0:
            return x
        else:
            return _dot(x, proj, PREC)

    @triton.jit
    def _row_max(pre, feats_ok):
        """FAVOR's query stabiliser over one chunk: each row's max of x P over the chunk's features, `[w]`."""
        return tl.max(tl.where(feats_ok[None, :], pre, float("-inf")), 1)

    @triton.jit
    def _phi(x, pre, rows_ok, feats, feats_ok, r, offset, hsq_scale, floor, log_half_r, KIND: tl.constexpr):
        """A chunk of a tile's features from its pre-activations `[w, C]`, zero outside `rows_ok` `[w]` and
        `feats_ok` `[C]`. offset: FAVOR's stabiliser, the key offset (a scalar) or the query rows' max of x P over
        all features `[w]`. A HEDGEHOG chunk holds whole halves (its softmaxes)."""
        if KIND == 0:
            phi = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
        elif KIND == 1:
            phi = tl.exp(pre - (tl.sum(x * x, 1) * hsq_scale + offset + log_half_r)[:, None]) + floor
        elif KIND == 2:
            phi = tl.maximum(pre, 0.0) * tl.exp(-log_half_r) + floor
        else:
            # softmax over the first half of the features, and over the second
            first = (feats < r // 2)[None, :]
            ok = feats_ok[None, :]
            top_a = tl.max(tl.where(first & ok, pre, float("-inf")), 1)
            top_b = tl.max(tl.where(~first & ok, pre, float("-inf")), 1)
            e = tl.where(ok, tl.exp(pre - tl.where(first, top_a[:, None], top_b[:, None])), 0.0)
            sum_a = tl.sum(tl.where(first, e, 0.0), 1)
            sum_b = tl.sum(tl.where(first, 0.0, e), 1)
            # a real half's sum is at least 1 (its max term); the floor keeps a chunk's absent half at 0 / 1
            phi = e / tl.maximum(tl.where(first, sum_a[:, None], sum_b[:, None]), 1.0)
        return tl.where(rows_ok[:, None] & feats_ok[None, :], phi, 0.0)

    @triton.jit
    def _pre_grad(phi, pre, grad_phi, feats, r, floor, log_half_r, KIND: tl.constexpr):
        """Through the feature map of a chunk: d phi `[w, C]` -> d pre `[w, C]`. grad_phi must be zero wherever
        `_phi` forced phi to zero (rows not kept, features past r)."""
        if KIND == 0:
            grad_pre = grad_phi * tl.minimum(phi, 1.0)
        elif KIND == 1:
            # the offsets carry no gradient; d exp(u) = exp(u) = phi - floor
            grad_pre = tl.where(phi > 0, grad_phi * (phi - floor), 0.0)
        elif KIND == 2:
            grad_pre = tl.where(pre > 0, grad_phi * tl.exp(-log_half_r), 0.0)
        else:
            first = (feats < r // 2)[None, :]
            weighted = grad_phi * phi
            dot_a = tl.sum(tl.where(first, weighted, 0.0), 1)
            dot_b = tl.sum(tl.where(first, 0.0, weighted), 1)
            grad_pre = weighted - phi * tl.where(first, dot_a[:, None], dot_b[:, None])
        return grad_pre

    @triton.jit
    def _feature_grad(left, state, shift, rows_ok, feats_ok, PREC: tl.constexpr):
        """d phi `[w, C]` of a chunk: `left S^T + shift` (queries: dnum S^T + dden z; keys: v dS^T + dz), zero
        outside `rows_ok` `[w]` and `feats_ok` `[C]`, as `_pre_grad` needs it."""
        grad_phi = _dot(left, tl.trans(state), PREC) + shift
        return tl.where(rows_ok[:, None] & feats_ok[None, :], grad_phi, 0.0)

    @triton.jit
    def _x_grad(x, proj, grad_pre, hsq_scale, KIND: tl.constexpr, PREC: tl.constexpr):
        """One chunk's share of dx `[w, D]` from its d pre: the chunks' shares add up to dx."""
        if KIND == 0:
            grad_x = grad_pre
        else:
            grad_x = _dot(grad_pre, tl.trans(proj), PREC)
            if KIND == 1:
                grad_x = grad_x - (tl.sum(grad_pre, 1) * (2.0 * hsq_scale))[:, None] * x
        return grad_x

    @triton.jit
    def _load_rows(ptr, b, h, stride_b, stride_h, stride_n, rows, cols, n, width):
        """A `[w, C]` tile of a `[b, h, n, width]` tensor (last stride 1) in fp32, zero outside."""
        base = ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
        ok = (rows < n)[:, None] & (cols < width)[None, :]
        return tl.load(base + rows[:, None].to(tl.int64) * stride_n + cols[None, :], mask=ok, other=0.0).to(tl.float32)

    @triton.jit
    def _store_rows(ptr, value, b, h, stride_b, stride_h, stride_n, rows, cols, n, width):
        base = ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
        ok = (rows < n)[:, None] & (cols < width)[None, :]
        tl.store(base + rows[:, None].to(tl.int64) * stride_n + cols[None, :], value.to(ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _load_proj(ptr, h, stride_h, stride_d, stride_r, cols_d, feats, feats_ok, d, r, scale, KIND: tl.constexpr):
        """The `[D, C]` columns `feats` of head h's projection times `scale` (stride_h 0: one shared by every head),
        fp32, zero outside; HEDGEHOG's `[W, -W]` from W `[d, r / 2]`; ELU has none (zeros, never read)."""
        if KIND == 3:
            first = feats < r // 2
            cols = tl.where(first, feats, feats - r // 2)
            sign = tl.where(first, scale, -scale)
        else:
            cols = feats
            sign = (feats * 0).to(tl.float32) + scale
        ok = (cols_d < d)[:, None] & feats_ok[None, :] & (KIND != 0)
        offsets = h * stride_h + cols_d[:, None] * stride_d + cols[None, :] * stride_r
        return tl.load(ptr + offsets, mask=ok, other=0.0).to(tl.float32) * sign[None, :]

    @triton.jit
    def _kept_rows(keep_ptr, b, rows, n, HAS_MASK: tl.constexpr):
        ok = rows < n
        if HAS_MASK:
            ok = ok & (tl.load(keep_ptr + b.to(tl.int64) * n + rows, mask=ok, other=0) != 0)
        return ok

    @triton.jit
    def _load_state(S, Z, bh, feats, feats_ok, cols_e, r, e):
        """Rows `feats` of the `[b h, r, e]` state (or its gradient) and of the `[b h, r]` key sum: `[C, E]`, `[C]`."""
        ok = feats_ok[:, None] & (cols_e < e)[None, :]
        state = tl.load(S + bh.to(tl.int64) * r * e + feats[:, None] * e + cols_e[None, :], mask=ok, other=0.0)
        return state, tl.load(Z + bh.to(tl.int64) * r + feats, mask=feats_ok, other=0.0)

    @triton.jit
    def _add_state(S, Z, bh, state, total, feats, feats_ok, cols_e, r, e):
        """Atomically add a program's `[C, E]` state (or its gradient) and `[C]` key sum into rows `feats` of
        `[b h, r, e]` and `[b h, r]`."""
        ok = feats_ok[:, None] & (cols_e < e)[None, :]
        tl.atomic_add(S + bh.to(tl.int64) * r * e + feats[:, None] * e + cols_e[None, :], state, mask=ok)
        tl.atomic_add(Z + bh.to(tl.int64) * r + feats, total, mask=feats_ok)

    @triton.jit
    def _add_proj_grad(DP, h, grad_proj, cols_d, feats, feats_ok, d, r):
        """Atomically add a program's `[D, C]` gradient of head h's map into columns `feats` of `[h, d, r]`."""
        ok = (cols_d < d)[:, None] & feats_ok[None, :]
        tl.atomic_add(DP + h * d * r + cols_d[:, None] * r + feats[None, :], grad_proj, mask=ok)

    @triton.jit
    def _key_offset(KEY_MAX, bh, KIND: tl.constexpr):
        """FAVOR's key offset of this (sample, head); 0 for the other maps, which have none."""
        offset = 0.0
        if KIND == 1:
            offset = tl.load(KEY_MAX + bh)
        return offset

    @triton.jit
    def _key_max_kernel(
        K, sk_b, sk_h, sk_n, P, sp_h, sp_d, sp_r, KEEP, KEY_MAX,
        heads, n, d, r, chunk_stride, chunk_width, tiles, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr, HAS_MASK: tl.constexpr,
        PREC: tl.constexpr,
    ):  # fmt: skip
        """FAVOR's key offset: the max of k P over the kept keys of each (sample, head), `[b h]`, by atomic max;
        one chunk of the features a program."""
        bh, split, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        b, h = bh // heads, bh % heads
        cols_d = tl.arange(0, BLOCK_D)
        feats, feats_ok = _chunk(chunk, tl.arange(0, BLOCK_C), chunk_stride, chunk_width, r)
        proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, feats, feats_ok, d, r, proj_scale, 1)
        best = tl.full([BLOCK_N], float("-inf"), tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            x = _load_rows(K, b, h, sk_b, sk_h, sk_n, rows, cols_d, n, d)
            pre = _dot(x, proj, PREC)
            ok = _kept_rows(KEEP, b, rows, n, HAS_MASK)[:, None] & feats_ok[None, :]
            best = tl.maximum(best, tl.max(tl.where(ok, pre, float("-inf")), 1))
        tl.atomic_max(KEY_MAX + bh, tl.max(best, 0))

    @triton.jit
    def _state_kernel(
        K, sk_b, sk_h, sk_n, V, sv_b, sv_h, sv_n, P, sp_h, sp_d, sp_r, KEEP, KEY_MAX, S, Z,
        heads, n, d, e, r, chunk_stride, chunk_width, tiles, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
        CHUNKS: tl.constexpr, KIND: tl.constexpr, HAS_MASK: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """S `[b h, r, e]` += phi(k)^T v and z `[b h, r]` += phi(k)^T 1 over this program's tiles of keys, for
        its chunk of the features."""
        bh, split, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        b, h = bh // heads, bh % heads
        cols_d, cols_e = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E)
        feats, feats_ok = _chunk(chunk, tl.arange(0, BLOCK_C), chunk_stride, chunk_width, r)
        proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, feats, feats_ok, d, r, proj_scale, KIND)
        offset = _key_offset(KEY_MAX, bh, KIND)
        state = tl.zeros([BLOCK_C, BLOCK_E], tl.float32)
        total = tl.zeros([BLOCK_C], tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            x = _load_rows(K, b, h, sk_b, sk_h, sk_n, rows, cols_d, n, d)
            values = _load_rows(V, b, h, sv_b, sv_h, sv_n, rows, cols_e, n, e)
            kept = _kept_rows(KEEP, b, rows, n, HAS_MASK)
            pre = _pre(x, proj, KIND, PREC)
            phi = _phi(x, pre, kept, feats, feats_ok, r, offset, hsq_scale, floor, log_half_r, KIND)
            state += _dot(tl.trans(phi), values, PREC)
            total += tl.sum(phi, 0)
        _add_state(S, Z, bh, state, total, feats, feats_ok, cols_e, r, e)

    @triton.jit
    def _query_sums(
        x, rows_ok, P, h, sp_h, sp_d, sp_r, S, Z, bh, cols_d, cols_c, cols_e,
        d, e, r, chunk_stride, chunk_width, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, CHUNKS: tl.constexpr, KIND: tl.constexpr,
        WITH_NUM: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """A tile of queries x `[w, D]` against the state, chunk by chunk: the numerator phi(q) S `[w, E]` (zero
        unless WITH_NUM), the normaliser phi(q) z `[w]` and FAVOR's stabiliser, each row's max of x P `[w]`.
        FAVOR's stabiliser is the max over all chunks, so its sums are rescaled as the max grows (online softmax's
        way) and its feature floor is added at the end: `phi S = exp(-|x|^2 / 2 sqrt(d) - log(r) / 2)
        sum_c exp(x P_c - max) S_c + floor sum_c S_c`."""
        num = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
        den = tl.zeros([BLOCK_N], tl.float32)
        top = tl.full([BLOCK_N], float("-inf"), tl.float32)
        floor_num = tl.zeros([BLOCK_E], tl.float32)
        floor_den = tl.sum(tl.zeros([BLOCK_E], tl.float32), 0)
        for chunk in range(CHUNKS):
            feats, feats_ok = _chunk(chunk, cols_c, chunk_stride, chunk_width, r)
            proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, feats, feats_ok, d, r, proj_scale, KIND)
            state, total = _load_state(S, Z, bh, feats, feats_ok, cols_e, r, e)
            pre = _pre(x, proj, KIND, PREC)
            if KIND == 1:
                new_top = tl.maximum(top, _row_max(pre, feats_ok))
                rescale = tl.exp(top - new_top)
                p = tl.where(feats_ok[None, :], tl.exp(pre - new_top[:, None]), 0.0)
                if WITH_NUM:
                    num = num * rescale[:, None] + _dot(p, state, PREC)
                den = den * rescale + tl.sum(p * total[None, :], 1)
                floor_num += tl.sum(state, 0)
                floor_den += tl.sum(total, 0)
                top = new_top
            else:
                phi = _phi(x, pre, rows_ok, feats, feats_ok, r, 0.0, hsq_scale, floor, log_half_r, KIND)
                if WITH_NUM:
                    num += _dot(phi, state, PREC)
                den += tl.sum(phi * total[None, :], 1)
        if KIND == 1:
            scale = tl.exp(-(tl.sum(x * x, 1) * hsq_scale + log_half_r))
            num = num * scale[:, None] + floor * floor_num[None, :]
            den = den * scale + floor * floor_den
        return num, den, top

    @triton.jit
    def _output_kernel(
        Q, sq_b, sq_h, sq_n, P, sp_h, sp_d, sp_r, S, Z, OUT, so_b, so_h, so_n,
        heads, n, d, e, r, chunk_stride, chunk_width, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
        CHUNKS: tl.constexpr, KIND: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """O = phi(q) S / max(phi(q) z, eps) for one tile of queries."""
        bh, tile = tl.program_id(0), tl.program_id(1)
        b, h = bh // heads, bh % heads
        cols_d, cols_e, cols_c = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_C)
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        x = _load_rows(Q, b, h, sq_b, sq_h, sq_n, rows, cols_d, n, d)
        num, den, _ = _query_sums(x, rows < n, P, h, sp_h, sp_d, sp_r, S, Z, bh, cols_d, cols_c, cols_e, d, e, r,
                                  chunk_stride, chunk_width, hsq_scale, floor, log_half_r, proj_scale, BLOCK_N,
                                  BLOCK_E, CHUNKS, KIND, True, PREC)  # fmt: skip
        _store_rows(OUT, num / tl.maximum(den, 1e-12)[:, None], b, h, so_b, so_h, so_n, rows, cols_e, n, e)

    @triton.jit
    def _query_backward_kernel(
        Q, sq_b, sq_h, sq_n, P, sp_h, sp_d, sp_r, S, Z, OUT, so_b, so_h, so_n, DO, sdo_b, sdo_h, sdo_n,
        DQ, sdq_b, sdq_h, sdq_n, DS, DZ, DP, ROW_DEN, ROW_GRAD_DEN, ROW_TOP,
        heads, n, d, e, r, chunk_stride, chunk_width, tiles, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
        CHUNKS: tl.constexpr, KIND: tl.constexpr, LEARNED: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """dq over this program's tiles of queries. With one chunk, also dS `[b h, r, e]`, dz `[b h, r]` (and the
        map's gradient `[h, D, R]`) summed over them; with several, each row's normaliser, its gradient and FAVOR's
        stabiliser `[b h, n]` for `_query_state_grad_kernel`, which sums those chunk by chunk."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // heads, bh % heads
        cols_d, cols_e, cols_c = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_C)
        grad_state = tl.zeros([BLOCK_C, BLOCK_E], tl.float32)
        grad_total = tl.zeros([BLOCK_C], tl.float32)
        grad_proj = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            rows_ok = rows < n
            x = _load_rows(Q, b, h, sq_b, sq_h, sq_n, rows, cols_d, n, d)
            if CHUNKS == 1:
                # the features once, for the normaliser and every gradient
                feats, feats_ok = _chunk(0, cols_c, chunk_stride, chunk_width, r)
                proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, feats, feats_ok, d, r, proj_scale, KIND)
                state, total = _load_state(S, Z, bh, feats, feats_ok, cols_e, r, e)
                pre = _pre(x, proj, KIND, PREC)
                top = _row_max(pre, feats_ok)
                phi = _phi(x, pre, rows_ok, feats, feats_ok, r, top, hsq_scale, floor, log_half_r, KIND)
                den = tl.sum(phi * total[None, :], 1)
            else:
                _, den, top = _query_sums(x, rows_ok, P, h, sp_h, sp_d, sp_r, S, Z, bh, cols_d, cols_c, cols_e,
                                          d, e, r, chunk_stride, chunk_width, hsq_scale, floor, log_half_r,
                                          proj_scale, BLOCK_N, BLOCK_E, CHUNKS, KIND, False, PREC)  # fmt: skip
            safe_den = tl.maximum(den, 1e-12)
            out = _load_rows(OUT, b, h, so_b, so_h, so_n, rows, cols_e, n, e)
            grad_out = _load_rows(DO, b, h, sdo_b, sdo_h, sdo_n, rows, cols_e, n, e)
            # out = num / max(den, eps): d num = g / den, d den = -(g . out) / den (zero where den < eps)
            grad_num = grad_out / safe_den[:, None]
            grad_den = tl.where(den < 1e-12, 0.0, -tl.sum(grad_out * out, 1) / safe_den)
            grad_x = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
            for chunk in range(CHUNKS):
                if CHUNKS > 1:
                    feats, feats_ok = _chunk(chunk, cols_c, chunk_stride, chunk_width, r)
                    proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, feats, feats_ok, d, r, proj_scale, KIND)
                    state, total = _load_state(S, Z, bh, feats, feats_ok, cols_e, r, e)
                    pre = _pre(x, proj, KIND, PREC)
                    phi = _phi(x, pre, rows_ok, feats, feats_ok, r, top, hsq_scale, floor, log_half_r, KIND)
                grad_phi = _feature_grad(grad_num, state, grad_den[:, None] * total[None, :], rows_ok, feats_ok, PREC)
                grad_pre = _pre_grad(phi, pre, grad_phi, feats, r, floor, log_half_r, KIND)
                grad_x += _x_grad(x, proj, grad_pre, hsq_scale, KIND, PREC)
                if CHUNKS == 1:
                    grad_state += _dot(tl.trans(phi), grad_num, PREC)
                    grad_total += tl.sum(phi * grad_den[:, None], 0)
                    if LEARNED:
                        grad_proj += _dot(tl.trans(x), grad_pre, PREC)
            _store_rows(DQ, grad_x, b, h, sdq_b, sdq_h, sdq_n, rows, cols_d, n, d)
            if CHUNKS > 1:
                at = bh.to(tl.int64) * n + rows
                tl.store(ROW_DEN + at, safe_den, mask=rows_ok)
                tl.store(ROW_GRAD_DEN + at, grad_den, mask=rows_ok)
                tl.store(ROW_TOP + at, top, mask=rows_ok)
        if CHUNKS == 1:
            feats, feats_ok = _chunk(0, cols_c, chunk_stride, chunk_width, r)
            _add_state(DS, DZ, bh, grad_state, grad_total, feats, feats_ok, cols_e, r, e)
            if LEARNED:
                _add_proj_grad(DP, h, grad_proj, cols_d, feats, feats_ok, d, r)

    @triton.jit
    def _chunk_program(
        P, sp_h, sp_d, sp_r, S, Z, heads, d, e, r, chunk_stride, chunk_width, proj_scale,
        BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, KIND: tl.constexpr,
    ):  # fmt: skip
        """A program of (sample x head, split of the rows, chunk of the features): its indices, and its chunk's
        columns of the map `[D, C]` and rows of S (or dS) `[C, E]` and z (or dz) `[C]`."""
        bh, split, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        cols_d, cols_e = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E)
        feats, feats_ok = _chunk(chunk, tl.arange(0, BLOCK_C), chunk_stride, chunk_width, r)
        proj = _load_proj(P, bh % heads, sp_h, sp_d, sp_r, cols_d, feats, feats_ok, d, r, proj_scale, KIND)
        state, total = _load_state(S, Z, bh, feats, feats_ok, cols_e, r, e)
        return bh, split, feats, feats_ok, cols_d, cols_e, proj, state, total

    @triton.jit
    def _query_state_grad_kernel(
        Q, sq_b, sq_h, sq_n, P, sp_h, sp_d, sp_r, S, Z, DO, sdo_b, sdo_h, sdo_n, DS, DZ, DP,
        ROW_DEN, ROW_GRAD_DEN, ROW_TOP,
        heads, n, d, e, r, chunk_stride, chunk_width, tiles, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
        CHUNKS: tl.constexpr, KIND: tl.constexpr, LEARNED: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """Several chunks: dS, dz (and the map's gradient) of one chunk of the features over this program's tiles
        of queries, from the rows' normalisers, their gradients and stabilisers that `_query_backward_kernel`
        wrote."""
        bh, split, feats, feats_ok, cols_d, cols_e, proj, state, total = _chunk_program(
            P, sp_h, sp_d, sp_r, S, Z, heads, d, e, r, chunk_stride, chunk_width, proj_scale, BLOCK_D, BLOCK_E,
            BLOCK_C, KIND,
        )  # fmt: skip
        b, h = bh // heads, bh % heads
        grad_state = tl.zeros([BLOCK_C, BLOCK_E], tl.float32)
        grad_total = tl.zeros([BLOCK_C], tl.float32)
        grad_proj = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            rows_ok = rows < n
            at = bh.to(tl.int64) * n + rows
            safe_den = tl.load(ROW_DEN + at, mask=rows_ok, other=1.0)
            grad_den = tl.load(ROW_GRAD_DEN + at, mask=rows_ok, other=0.0)
            top = tl.load(ROW_TOP + at, mask=rows_ok, other=0.0)
            x = _load_rows(Q, b, h, sq_b, sq_h, sq_n, rows, cols_d, n, d)
            grad_num = _load_rows(DO, b, h, sdo_b, sdo_h, sdo_n, rows, cols_e, n, e) / safe_den[:, None]
            pre = _pre(x, proj, KIND, PREC)
            phi = _phi(x, pre, rows_ok, feats, feats_ok, r, top, hsq_scale, floor, log_half_r, KIND)
            grad_state += _dot(tl.trans(phi), grad_num, PREC)
            grad_total += tl.sum(phi * grad_den[:, None], 0)
            if LEARNED:
                grad_phi = _feature_grad(grad_num, state, grad_den[:, None] * total[None, :], rows_ok, feats_ok, PREC)
                grad_proj += _dot(tl.trans(x), _pre_grad(phi, pre, grad_phi, feats, r, floor, log_half_r, KIND), PREC)
        _add_state(DS, DZ, bh, grad_state, grad_total, feats, feats_ok, cols_e, r, e)
        if LEARNED:
            _add_proj_grad(DP, h, grad_proj, cols_d, feats, feats_ok, d, r)

    @triton.jit
    def _key_backward_kernel(
        K, sk_b, sk_h, sk_n, V, sv_b, sv_h, sv_n, P, sp_h, sp_d, sp_r, KEEP, KEY_MAX, DS, DZ,
        DK, sdk_b, sdk_h, sdk_n, DV, sdv_b, sdv_h, sdv_n, DP,
        heads, n, d, e, r, chunk_stride, chunk_width, tiles, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
        CHUNKS: tl.constexpr, KIND: tl.constexpr, HAS_MASK: tl.constexpr, LEARNED: tl.constexpr,
        PREC: tl.constexpr,
    ):  # fmt: skip
        """dv = phi(k) dS, dk through dphi(k) = v dS^T + dz over this program's keys, chunk by chunk (and, with
        one chunk, the map's gradient; with several, `_key_map_grad_kernel` sums it)."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // heads, bh % heads
        cols_d, cols_e, cols_c = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_C)
        offset = _key_offset(KEY_MAX, bh, KIND)
        grad_proj = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            x = _load_rows(K, b, h, sk_b, sk_h, sk_n, rows, cols_d, n, d)
            values = _load_rows(V, b, h, sv_b, sv_h, sv_n, rows, cols_e, n, e)
            kept = _kept_rows(KEEP, b, rows, n, HAS_MASK)
            grad_v = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
            grad_x = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
            for chunk in range(CHUNKS):
                feats, feats_ok = _chunk(chunk, cols_c, chunk_stride, chunk_width, r)
                proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, feats, feats_ok, d, r, proj_scale, KIND)
                grad_state, grad_total = _load_state(DS, DZ, bh, feats, feats_ok, cols_e, r, e)
                pre = _pre(x, proj, KIND, PREC)
                phi = _phi(x, pre, kept, feats, feats_ok, r, offset, hsq_scale, floor, log_half_r, KIND)
                grad_v += _dot(phi, grad_state, PREC)
                grad_phi = _feature_grad(values, grad_state, grad_total[None, :], kept, feats_ok, PREC)
                grad_pre = _pre_grad(phi, pre, grad_phi, feats, r, floor, log_half_r, KIND)
                grad_x += _x_grad(x, proj, grad_pre, hsq_scale, KIND, PREC)
                if LEARNED and CHUNKS == 1:
                    grad_proj += _dot(tl.trans(x), grad_pre, PREC)
            _store_rows(DV, grad_v, b, h, sdv_b, sdv_h, sdv_n, rows, cols_e, n, e)
            _store_rows(DK, grad_x, b, h, sdk_b, sdk_h, sdk_n, rows, cols_d, n, d)
        if LEARNED and CHUNKS == 1:
            feats, feats_ok = _chunk(0, cols_c, chunk_stride, chunk_width, r)
            _add_proj_grad(DP, h, grad_proj, cols_d, feats, feats_ok, d, r)

    @triton.jit
    def _key_map_grad_kernel(
        K, sk_b, sk_h, sk_n, V, sv_b, sv_h, sv_n, P, sp_h, sp_d, sp_r, KEEP, DS, DZ, DP,
        heads, n, d, e, r, chunk_stride, chunk_width, tiles, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
        KIND: tl.constexpr, HAS_MASK: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """Several chunks of a learned map: the keys' share of its gradient `[h, D, R]`, one chunk a program."""
        bh, split, feats, feats_ok, cols_d, cols_e, proj, grad_state, grad_total = _chunk_program(
            P, sp_h, sp_d, sp_r, DS, DZ, heads, d, e, r, chunk_stride, chunk_width, proj_scale, BLOCK_D, BLOCK_E,
            BLOCK_C, KIND,
        )  # fmt: skip
        b, h = bh // heads, bh % heads
        grad_proj = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            x = _load_rows(K, b, h, sk_b, sk_h, sk_n, rows, cols_d, n, d)
            values = _load_rows(V, b, h, sv_b, sv_h, sv_n, rows, cols_e, n, e)
            kept = _kept_rows(KEEP, b, rows, n, HAS_MASK)
            pre = _pre(x, proj, KIND, PREC)
            phi = _phi(x, pre, kept, feats, feats_ok, r, 0.0, hsq_scale, floor, log_half_r, KIND)
            grad_phi = _feature_grad(values, grad_state, grad_total[None, :], kept, feats_ok, PREC)
            grad_proj += _dot(tl.trans(x), _pre_grad(phi, pre, grad_phi, feats, r, floor, log_half_r, KIND), PREC)
        _add_proj_grad(DP, h, grad_proj, cols_d, feats, feats_ok, d, r)


# Triton chose, when the kernels were defined, between compiling them and interpreting them
_INTERPRETED = triton is not None and not isinstance(_state_kernel, triton.runtime.JITFunction)


def _interpreter_loop_bounds() -> None:
    """Triton 3.6's interpreter (torch 2.11's) takes a scalar argument used as a loop bound (`range(tiles)`) as
    `int()` of a one-element array, which numpy 2.4 refuses ("only 0-dimensional arrays can be converted"); later
    interpreters squeeze it first. Every interpreted kernel call re-patches triton's tensor class, so the squeeze is
    added where it does that, the same on an interpreter that already has it."""
    from triton.runtime import interpreter

    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None:  # an interpreter laid out otherwise: left as it is
        return

    def patch_with_squeeze(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_with_squeeze


if _INTERPRETED:
    _interpreter_loop_bounds()


def _programs(device: torch.device) -> int:
    """Programs to keep the device busy: four per multiprocessor on a GPU; a few in the interpreter."""
    if device.type != "cuda":
        return 4
    return 4 * _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_DOT_PRECISIONS = ("tf32", "bf16")
# Feature columns a FAVOR or RELU kernel holds at once past 64 features: whole, 256 random features need one pipeline
# stage to fit sm_90 (`zoo_bench.kernel_resources`), and 64 at a time were faster on an H200. HEDGEHOG's 2 x 64 stay
# whole, as the H200 timed them, unless `ZOO_FUSED_CONFIG` asks for halves (on sm_90 under triton 3.8 its backward
# then needs 86 KB of shared memory and spills nothing, against 173 KB and 48 - 120 bytes of stack whole: untimed).
_CHUNK = 64


class _Config(typing.NamedTuple):
    """A `ZOO_FUSED_CONFIG` entry: tile rows, warps, the products' precision (None: the default) and feature
    columns per chunk (None: the default; 0: all at once)."""

    rows: int
    warps: int
    dot: str | None = None
    chunk: int | None = None


def _config_override(kind: int) -> _Config | None:
    """`ZOO_FUSED_CONFIG`: `rows:warps[:dot[:chunk]]` for every feature map, or per map, `elu=64:4,favor=32:8:bf16`
    (the names of `Feature`, lower case): tile rows, warps, for half-precision inputs the products' precision (tf32,
    or bf16 operands with fp32 sums; empty for `_default_precision`'s), and the feature columns a kernel holds at
    once (a power of two from 16, or 0 for all; HEDGEHOG's chunks are its two halves whatever the number), for a
    sweep (`zoo_bench.kernel_configs`)."""
    text = os.environ.get("ZOO_FUSED_CONFIG", "")
    for entry in filter(None, text.split(",")):
        name, _, config = entry.rpartition("=")
        if name in ("", Feature(kind).name.lower()):
            return _parse_config(entry, config)
    return None


def _parse_config(entry: str, config: str) -> _Config:
    parts = config.split(":")
    rows = warps = chunk = None
    with contextlib.suppress(ValueError, IndexError):
        rows, warps = int(parts[0]), int(parts[1])
        chunk = int(parts[3]) if len(parts) > 3 else None
    dot = (parts[2] or None) if len(parts) > 2 else None
    chunk_ok = len(parts) < 4 or (chunk is not None and (chunk == 0 or (chunk >= 16 and chunk & (chunk - 1) == 0)))
    if warps is None or len(parts) > 4 or dot not in (None, *_DOT_PRECISIONS) or not chunk_ok:
        raise ValueError(
            f"ZOO_FUSED_CONFIG entry {entry!r} is not rows:warps[:dot[:chunk]] (dot one of "
            f"{', '.join(_DOT_PRECISIONS)} or empty, chunk 0 or a power of two from 16), e.g. 64:4, favor=32:8:bf16 "
            "or favor=64:4::64"
        )
    return _Config(rows, warps, dot, chunk)


def _default_precision(dtype: torch.dtype) -> str:
    """The products' operands: exact fp32 for fp32 inputs; bf16 (fp32 sums) for bf16 inputs, as FlashAttention
    multiplies its bf16 probabilities (on an H200, one ViT-S layer at 1024 px, forward + backward: linear 3.93 ms
    against 4.81 in tf32, hedgehog 7.05 against 7.63, performer 9.23 against 10.45 at its fastest tf32 tiles;
    `benchmarks/nvidia-h200/chunked/kernel_profile.md`); tf32 for fp16 inputs, whose 10-bit mantissa bf16 would cut."""
    if dtype == torch.float32:
        return "ieee"
    return "bf16" if dtype == torch.bfloat16 else "tf32"


# What a plan gives up, level by level, when a kernel asks for more shared memory than the GPU has (`_fitted`):
# pipelining (one stage: each loaded tile buffered once), then the features whole (64 columns at a time, hedgehog
# by halves), then half the rows of a tile, twice. An A100 (163 KB) fits every map at level 0 (hedgehog's query
# backward: 161 KB); on sm_86 / sm_89 (99 KB) hedgehog's backward needs level 1.
_SHRINK_LEVELS = 4


class _Plan:
    """Block sizes, split counts, feature chunks and the constants of one call; `level` (0 to `_SHRINK_LEVELS`)
    shrinks what the kernels hold, for GPUs with less shared memory."""

    def __init__(self, q: Tensor, v: Tensor, features: int, kind: int, eps: float, level: int = 0) -> None:
        self._build(tuple(q.shape), v.shape[-1], q.dtype, q.device, features, kind, eps, level)

    def _build(self, shape: tuple, e: int, dtype: torch.dtype, device: torch.device, features: int, kind: int,
               eps: float, level: int) -> None:  # fmt: skip
        b, h, n, d = shape
        self.h, self.n, self.d, self.e, self.r = h, n, d, e, features
        self.block_d, self.block_e = _pow2(d), _pow2(self.e)
        override = _config_override(kind) or _Config(0, 0)
        default_chunk = _CHUNK if kind in (Feature.FAVOR, Feature.RELU) else 0
        self._chunk(kind, default_chunk if override.chunk is None else override.chunk)
        # The `[w, c]` feature tile and the `[c, e]` state chunk share the registers and shared memory with the
        # accumulators: at 128 features whole (hedgehog's 2 x 64), 64 rows ask for 201 KB of shared memory and 848
        # bytes of stack a thread in the query backward, 32 rows 173 KB and 48 (sm_90, triton 3.8)
        self.block_n = 64 if self.block_c <= 64 else 32
        # Chunked kernels carry x, dx and dv across the chunks: 8 warps halve each thread's share (ptxas on sm_90,
        # 256 features: 24 and 0 bytes of stack in the query and key backward, against 240 and 224 at 4)
        self.warps = 4 if self.block_c * self.block_e <= 64 * 64 and self.chunks == 1 else 8
        self.prec = _default_precision(dtype)
        if override.rows:
            self.block_n, self.warps = override.rows, override.warps
            if override.dot and self.prec != "ieee":
                self.prec = override.dot
        # 256 features at once: three pipeline stages ask for 326 KB of shared memory (an H200 has 227; one: 104 KB)
        self.stages = 1 if self.block_c >= 256 or level >= 1 else None
        if level >= 2 and self.chunks == 1 and self.block_c > 32:
            self._chunk(kind, min(_CHUNK, self.block_c // 2))
        if level >= 3:
            self.block_n = max(16, self.block_n >> (level - 2))
        n_tiles = _ceil_div(n, self.block_n)
        splits = max(1, min(n_tiles, _programs(device) // (b * h)))
        self.tiles = _ceil_div(n_tiles, splits)
        self.splits = _ceil_div(n_tiles, self.tiles)
        self.n_tiles = n_tiles
        self.kind = kind
        self.hsq_scale = 0.5 * d**-0.5
        # FAVOR and RELU project x d^-1/4 (so that phi(q).phi(k) estimates exp(q.k / sqrt(d)))
        self.proj_scale = d**-0.25 if kind in (Feature.FAVOR, Feature.RELU) else 1.0
        self.log_half_r = 0.5 * math.log(features)
        self.floor = eps / math.sqrt(features) if kind == Feature.FAVOR else eps

    def _chunk(self, kind: int, chunk: int) -> None:
        """Feature chunks of `chunk` columns (`block_c` wide, `stride` apart, `width` of them real) where the features
        are wider; HEDGEHOG's two halves (each one softmax); ELU's features (x's columns) whole."""
        block_r = _pow2(self.r)
        self.chunks, self.block_c, self.chunk_stride, self.chunk_width = 1, block_r, block_r, block_r
        if kind == Feature.ELU or chunk == 0 or chunk >= block_r:
            return
        if kind == Feature.HEDGEHOG:
            half = self.r // 2
            self.chunks, self.block_c, self.chunk_stride, self.chunk_width = 2, _pow2(half), half, half
        else:
            self.chunks, self.block_c = _ceil_div(self.r, chunk), chunk
            self.chunk_stride = self.chunk_width = chunk

    def blocks(self) -> dict:
        return {
            "BLOCK_N": self.block_n,
            "BLOCK_D": self.block_d,
            "BLOCK_E": self.block_e,
            "BLOCK_C": self.block_c,
            "PREC": self.prec,
            "num_warps": self.warps,
            **({"num_stages": self.stages} if self.stages else {}),
        }

    def constants(self) -> tuple:
        return self.h, self.n, self.d, self.e, self.r, self.chunk_stride, self.chunk_width

    def scalars(self) -> tuple:
        return self.hsq_scale, self.floor, self.log_half_r, self.proj_scale


def _ceil_div(a: int, b: int) -> int:
    # triton.cdiv is a jitted function: from Python each call goes through its launcher's argument handling
    return -(-a // b)


@functools.lru_cache(maxsize=256)
def _cached_plan(shape: tuple, e: int, dtype: torch.dtype, device: torch.device, features: int, kind: int,
                 eps: float, level: int, config: str) -> _Plan:  # fmt: skip
    """The `_Plan` of one call's shapes and `ZOO_FUSED_CONFIG` (`config`, so that a new setting takes effect): built
    once, as a layer asks for it twice a step and building one costs the host more than launching a kernel."""
    del config
    plan = _Plan.__new__(_Plan)
    plan._build(shape, e, dtype, device, features, kind, eps, level)
    return plan


def _plan(q: Tensor, v: Tensor, features: int, kind: int, eps: float, level: int) -> _Plan:
    config = os.environ.get("ZOO_FUSED_CONFIG", "")
    return _cached_plan(tuple(q.shape), v.shape[-1], q.dtype, q.device, features, kind, eps, level, config)


def _strides(x: Tensor) -> tuple[int, int, int]:
    if x.stride(-1) != 1:
        raise ValueError(f"the fused kernels read rows with unit stride; got strides {x.stride()}")
    return x.stride(0), x.stride(1), x.stride(2)


def _proj_args(proj: Tensor | None, like: Tensor) -> tuple:
    """A `[hp, d, r]` projection (hp = 1: shared) as (tensor, stride_h, stride_d, stride_r)."""
    if proj is None:
        return like, 0, 0, 0
    return proj, (proj.stride(0) if proj.shape[0] > 1 else 0), proj.stride(1), proj.stride(2)


def _keep_arg(keep: Tensor | None, like: Tensor) -> Tensor:
    return like if keep is None else keep.contiguous().view(torch.uint8)


def _features(proj: Tensor | None, like: Tensor, kind: int) -> int:
    """r: the head dim for ELU; the projection's width, twice it for HEDGEHOG ([W, -W])."""
    if proj is None:
        return like.shape[-1]
    return proj.shape[-1] * (2 if kind == Feature.HEDGEHOG else 1)


def _state(k, v, keep, proj_k, plan: _Plan, key_max: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The keys' side: state `[b h, r, e]`, key sum `[b h, r]` (fp32) and FAVOR's key offset `[b h]` (computed
    unless given)."""
    b, h, n, d = k.shape
    state = k.new_zeros(b * h, plan.r, plan.e, dtype=torch.float32)
    total = k.new_zeros(b * h, plan.r, dtype=torch.float32)
    keep_t, pk = _keep_arg(keep, k), _proj_args(proj_k, k)
    grid = (b * h, plan.splits, plan.chunks)
    if key_max is None:
        key_max = k.new_full((b * h,), float("-inf"), dtype=torch.float32)
        if plan.kind == Feature.FAVOR:
            _key_max_kernel[grid](
                k, *_strides(k), *pk, keep_t, key_max, h, n, d, plan.r, plan.chunk_stride, plan.chunk_width,
                plan.tiles, plan.proj_scale, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d, BLOCK_C=plan.block_c,
                HAS_MASK=keep is not None, PREC=plan.prec, num_warps=plan.warps,
            )  # fmt: skip
        # no kept key at all: any finite offset (their features are zero)
        key_max = torch.nan_to_num(key_max, neginf=0.0)
    _state_kernel[grid](
        k, *_strides(k), v, *_strides(v), *pk, keep_t, key_max, state, total, *plan.constants(), plan.tiles,
        *plan.scalars(), CHUNKS=plan.chunks, KIND=plan.kind, HAS_MASK=keep is not None, **plan.blocks(),
    )  # fmt: skip
    return state, total, key_max


# (device, feature map, features, head dim, value dim, dtype) -> the shrink level whose kernels fit that GPU
_FITTED: dict[tuple, int] = {}


def _fitted(run, q: Tensor, v: Tensor, features: int, kind: int, eps: float):
    """`run(plan)` with the first plan, from the level that fitted last time, whose kernels the GPU can launch:
    triton refuses a kernel that asks for more shared memory than the device has before it runs, and the
    buffers `run` fills are its own, so a refused attempt leaves nothing behind."""
    key = (q.device, kind, features, q.shape[-1], v.shape[-1], q.dtype)
    level = _FITTED.get(key, 0)
    while True:
        try:
            result = run(_plan(q, v, features, kind, eps, level))
        except OutOfResources as error:
            if level == _SHRINK_LEVELS:
                raise RuntimeError(
                    f"the fused linear-attention kernels do not fit this GPU's shared memory even at their smallest "
                    f"({error}); ZOO_FUSED=0 runs the torch path"
                ) from error
            level += 1
            continue
        _FITTED[key] = level
        return result


def _forward(q, k, v, keep, proj_q, proj_k, kind: int, eps: float):
    def run(plan: _Plan):
        return _forward_with(plan, q, k, v, keep, proj_q, proj_k, kind)

    return _fitted(run, q, v, _features(proj_q, q, kind), kind, eps)


def _forward_with(plan: _Plan, q, k, v, keep, proj_q, proj_k, kind: int):
    b, h, n, d = q.shape
    state, total, key_max = _state(k, v, keep, proj_k, plan)
    out = q.new_empty(b, n, h, plan.e).permute(0, 2, 1, 3)  # [b, h, n, e] laid out as [b, n, h, e] for proj
    _output_kernel[(b * h, plan.n_tiles)](
        q, *_strides(q), *_proj_args(proj_q, q), state, total, out, *_strides(out), *plan.constants(),
        *plan.scalars(), CHUNKS=plan.chunks, KIND=kind, **plan.blocks(),
    )  # fmt: skip
    return out, state, total, key_max


def _heads(packed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`[b, n, 3, h, d]` -> its q, k and v parts as `[b, h, n, d]` views."""
    return tuple(packed[:, :, i].permute(0, 2, 1, 3) for i in range(3))


def _backward(grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind: int, eps: float):
    def run(plan: _Plan):
        return _backward_with(plan, grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind)

    return _fitted(run, q, v, _features(proj_q, q, kind), kind, eps)


def _backward_with(plan: _Plan, grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind: int):
    b, h, n, d = q.shape
    if state is None:
        state, total, _ = _state(k, v, keep, proj_k, plan, key_max)
    # one buffer laid out like the qkv projection's output: `SplitHeads` hands it on as qkv's gradient, no copy
    grad_qkv = q.new_empty(b, n, 3, h, d)
    grad_q, grad_k, grad_v = _heads(grad_qkv)
    grad_state, grad_total = torch.zeros_like(state), torch.zeros_like(total)
    learned = kind == Feature.HEDGEHOG
    # the gradient of [W, -W] `[h, d, 2 f]`, folded into W's below
    grad_proj_q = torch.zeros((h, d, plan.r) if learned else (0,), device=q.device, dtype=torch.float32)
    grad_proj_k = torch.zeros_like(grad_proj_q)
    keep_t, pq, pk = _keep_arg(keep, q), _proj_args(proj_q, q), _proj_args(proj_k, q)
    # several chunks: each query row's normaliser, its gradient and FAVOR's stabiliser `[b h, n]`, for the
    # kernel that sums dS chunk by chunk
    rows = (state,) * 3
    if plan.chunks > 1:
        rows = q.new_empty(3, b * h, n, dtype=torch.float32).unbind(0)
    grid = (b * h, plan.splits)
    grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    blocks = {"CHUNKS": plan.chunks, "KIND": kind, "LEARNED": learned, **plan.blocks()}
    _query_backward_kernel[grid](
        q, *_strides(q), *pq, state, total, out, *_strides(out), grad_out, *_strides(grad_out),
        grad_q, *_strides(grad_q), grad_state, grad_total, grad_proj_q if learned else state, *rows,
        *plan.constants(), plan.tiles, *plan.scalars(), **blocks,
    )  # fmt: skip
    if plan.chunks > 1:
        _query_state_grad_kernel[(*grid, plan.chunks)](
            q, *_strides(q), *pq, state, total, grad_out, *_strides(grad_out), grad_state, grad_total,
            grad_proj_q if learned else state, *rows, *plan.constants(), plan.tiles, *plan.scalars(), **blocks,
        )  # fmt: skip
    _key_backward_kernel[grid](
        k, *_strides(k), v, *_strides(v), *pk, keep_t, key_max, grad_state, grad_total,
        grad_k, *_strides(grad_k), grad_v, *_strides(grad_v), grad_proj_k if learned else state,
        *plan.constants(), plan.tiles, *plan.scalars(), HAS_MASK=keep is not None, **blocks,
    )  # fmt: skip
    if learned and plan.chunks > 1:
        _key_map_grad_kernel[(*grid, plan.chunks)](
            k, *_strides(k), v, *_strides(v), *pk, keep_t, grad_state, grad_total, grad_proj_k,
            *plan.constants(), plan.tiles, *plan.scalars(), KIND=kind, HAS_MASK=keep is not None, **plan.blocks(),
        )  # fmt: skip
    if learned:
        f = plan.r // 2
        grad_proj_q, grad_proj_k = (g[..., :f] - g[..., f:] for g in (grad_proj_q, grad_proj_k))
    return grad_qkv, grad_proj_q, grad_proj_k


@torch.library.custom_op("zoo::fused_kernel_attention", mutates_args=())
def _fused_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    proj_q: Tensor | None,
    proj_k: Tensor | None,
    kind: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _forward(q, k, v, keep, proj_q, proj_k, kind, eps)


@_fused_op.register_fake
def _(q, k, v, keep, proj_q, proj_k, kind, eps):
    b, h, n, d = q.shape
    features = _features(proj_q, q, kind)
    out = q.new_empty(b, n, h, v.shape[-1]).permute(0, 2, 1, 3)
    f32 = {"dtype": torch.float32}
    return (
        out,
        q.new_empty(b * h, features, v.shape[-1], **f32),
        q.new_empty(b * h, features, **f32),
        q.new_empty(b * h, **f32),
    )


@torch.library.custom_op("zoo::fused_kernel_attention_backward", mutates_args=())
def _fused_backward_op(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    proj_q: Tensor | None,
    proj_k: Tensor | None,
    out: Tensor,
    state: Tensor | None,
    total: Tensor | None,
    key_max: Tensor,
    kind: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    return _backward(grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind, eps)


@_fused_backward_op.register_fake
def _(grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind, eps):
    b, h, n, d = q.shape
    shape = proj_q.shape if kind == Feature.HEDGEHOG else (0,)
    f32 = {"dtype": torch.float32}
    return q.new_empty(b, n, 3, h, d), q.new_empty(shape, **f32), q.new_empty(shape, **f32)


def saves_state(n: int, features: int, value_dim: int) -> bool:
    """Whether backward keeps the forward's state and key sum (`features x (value_dim + 1)` floats per sample and
    head) or recomputes them from k and v: kept only when no larger than the n floats per sample and head (the
    log-sum-exp) that SDPA keeps, so the layer never saves more than SDPA's."""
    return features * (value_dim + 1) <= n


def _saved(ctx, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind: int, eps: float) -> None:
    if not saves_state(q.shape[-2], state.shape[1], state.shape[2]):
        state = total = None
    ctx.save_for_backward(q, k, v, keep, proj_q, proj_k, out, state, total, key_max)
    ctx.kind, ctx.eps = kind, eps


def _input_grads(ctx, grad_out, backward) -> tuple:
    """The op's inputs' gradients from the tensors `_saved` kept, through `backward` (`_backward` itself, or the
    custom op around it)."""
    q, k, v, keep, proj_q, proj_k, out, state, total, key_max = ctx.saved_tensors
    grad_qkv, grad_proj_q, grad_proj_k = backward(
        grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, ctx.kind, ctx.eps
    )
    learned = ctx.kind == Feature.HEDGEHOG
    grad_maps = (grad_proj_q.to(proj_q.dtype), grad_proj_k.to(proj_k.dtype)) if learned else (None, None)
    return (*_heads(grad_qkv), None, *grad_maps, None, None)


def _setup_context(ctx, inputs, output):
    q, k, v, keep, proj_q, proj_k, kind, eps = inputs
    out, state, total, key_max = output
    ctx.mark_non_differentiable(state, total, key_max)
    _saved(ctx, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind, eps)


def _op_backward(ctx, grad_out, *_unused):
    return _input_grads(ctx, grad_out, _fused_backward_op)


_fused_op.register_autograd(_op_backward, setup_context=_setup_context)


class _EagerFusedAttention(torch.autograd.Function):
    """The op's autograd outside `torch.compile`, calling the Python bodies of the custom ops straight away: the
    dispatcher's custom-op and autograd wrappers cost about as much host time as the rest of the layer (0.3 ms of
    0.6 a step on this project's CPU, kernels stubbed), which a small batch on a GPU waits for. Under compile the
    custom op stays, one opaque node (Dynamo cannot trace an autograd function that takes one tensor twice, as
    performer's projections are)."""

    @staticmethod
    def forward(ctx, q, k, v, keep, proj_q, proj_k, kind: int, eps: float):
        out, state, total, key_max = _forward(q, k, v, keep, proj_q, proj_k, kind, eps)
        _saved(ctx, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind, eps)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return _input_grads(ctx, grad_out, _backward)


def fused_kernel_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    feature: Feature,
    proj_q: Tensor | None = None,
    proj_k: Tensor | None = None,
    eps: float = 0.0,
) -> Tensor:
    """Non-causal `phi(q) (phi(k)^T v) / max(phi(q) . sum phi(k), eps)` through the fused kernels.

    q, k, v: `[b, h, n, d]` (any float dtype, last stride 1; typically views of the qkv projection); mask: `[b, n]`
    bool key padding mask, True = keep; proj_q, proj_k: `[hp, d, r]` (hp = 1 shared, or h): FAVOR's and RELU's
    random features (the same tensor twice, unscaled: x is projected as x d^-1/4), HEDGEHOG's maps W `[h, d, f]`
    (r = 2 f; differentiable), None for ELU; eps: FAVOR's feature floor times sqrt(r) (as
    `softmax_kernel_features`), RELU's floor.
    -> `[b, h, n, d]` in v's dtype, laid out as `[b, n, h, d]`. Features and sums in fp32.
    """
    if not q.is_cuda and not _INTERPRETED:
        raise RuntimeError(
            "the fused kernels run on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 before zoo "
            "is imported"
        )
    keep = None if mask is None else mask.to(torch.bool)
    if torch.compiler.is_compiling():
        out, *_ = _fused_op(q, k, v, keep, proj_q, proj_k, int(feature), float(eps))
        return out
    return _EagerFusedAttention.apply(q, k, v, keep, proj_q, proj_k, int(feature), float(eps))
