"""The fused linear-family kernels themselves (Triton): the feature maps in registers, the state, the output and
the two backward passes. Launched by `launch`, sized by `plan`; see the package docstring for the algorithm.

Every kernel takes the feature map as the `KIND` constexpr, one of the named constants below (the values of
`_features.Feature`), so triton compiles one specialisation a map and the branches on it cost nothing.

Letter legend (tile shapes): w - rows in a tile (BLOCK_N), D - head dim (BLOCK_D), E - value dim (BLOCK_E),
C - features in a chunk (BLOCK_C), R - all features.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from ..._features import Feature
from ..._kernel import DENOMINATOR_EPS

# The kernels keep their leading underscore: it is their name on the GPU, in profiles and in the benchmarks' tables.
__all__ = ["ELU", "FAVOR", "HEDGEHOG", "RELU"]

# The feature maps, as the kernels compare `KIND` with them (globals a jitted function reads must be constexprs).
ELU = tl.constexpr(int(Feature.ELU))
FAVOR = tl.constexpr(int(Feature.FAVOR))
RELU = tl.constexpr(int(Feature.RELU))
HEDGEHOG = tl.constexpr(int(Feature.HEDGEHOG))
# The normaliser's floor, the torch paths' own.
_EPS = tl.constexpr(DENOMINATOR_EPS)

# Triton's interpreter multiplies bf16 tiles as raw 16-bit integers (numpy has no bf16): there, bf16 operands
# are rounded to bf16 and multiplied in fp32, the same products
_BF16_IN_FP32 = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    """a @ b summed in fp32: "ieee" (fp32 inputs), "tf32", or "bf16" operands."""
    if PREC == "bf16":
        if _BF16_IN_FP32:
            return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), input_precision="ieee")
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
    if KIND == ELU:
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
    if KIND == ELU:
        phi = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    elif KIND == FAVOR:
        phi = tl.exp(pre - (tl.sum(x * x, 1) * hsq_scale + offset + log_half_r)[:, None]) + floor
    elif KIND == RELU:
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
    if KIND == ELU:
        grad_pre = grad_phi * tl.minimum(phi, 1.0)
    elif KIND == FAVOR:
        # the offsets carry no gradient; d exp(u) = exp(u) = phi - floor
        grad_pre = tl.where(phi > 0, grad_phi * (phi - floor), 0.0)
    elif KIND == RELU:
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
    if KIND == ELU:
        grad_x = grad_pre
    else:
        grad_x = _dot(grad_pre, tl.trans(proj), PREC)
        if KIND == FAVOR:
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
    if KIND == HEDGEHOG:
        first = feats < r // 2
        cols = tl.where(first, feats, feats - r // 2)
        sign = tl.where(first, scale, -scale)
    else:
        cols = feats
        sign = (feats * 0).to(tl.float32) + scale
    ok = (cols_d < d)[:, None] & feats_ok[None, :] & (KIND != ELU)
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
    if KIND == FAVOR:
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
    proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, feats, feats_ok, d, r, proj_scale, FAVOR)
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
        if KIND == FAVOR:
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
    if KIND == FAVOR:
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
    _store_rows(OUT, num / tl.maximum(den, _EPS)[:, None], b, h, so_b, so_h, so_n, rows, cols_e, n, e)


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
        safe_den = tl.maximum(den, _EPS)
        out = _load_rows(OUT, b, h, so_b, so_h, so_n, rows, cols_e, n, e)
        grad_out = _load_rows(DO, b, h, sdo_b, sdo_h, sdo_n, rows, cols_e, n, e)
        # out = num / max(den, eps): d num = g / den, d den = -(g . out) / den (zero where den < eps)
        grad_num = grad_out / safe_den[:, None]
        grad_den = tl.where(den < _EPS, 0.0, -tl.sum(grad_out * out, 1) / safe_den)
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
