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

The kernels are plain `@triton.jit` (no autotuning), so they run on CPU tensors under `TRITON_INTERPRET=1`, which
is how the suite tests them against the torch paths. The op is a `torch.library.custom_op` with its autograd
registered, so `torch.compile` sees one opaque node and no graph break. Reductions over the sequence (the state,
its gradient, hedgehog's map gradients) are split over programs and added with fp32 atomics: the summation order,
and so the last bits, vary from run to run on a GPU.

Chosen automatically for CUDA tensors by the variants (`fused_usable`); `ZOO_FUSED=0` turns it off.

Feature maps (`Feature`), x being a query or key row `[d]`, P the projection `[d, r]` (already scaled):
    ELU       phi = elu(x) + 1                                              (r = d)
    FAVOR     phi = exp(x P - |x|^2 / (2 sqrt(d)) - offset - log(r) / 2) + eps / sqrt(r)
              offset: a query row's max of x P; for keys, the max of k P over the (sample, head)'s kept keys
    RELU      phi = relu(x P) / sqrt(r) + eps
    HEDGEHOG  phi = [softmax(x W), softmax(-x W)], P = [W, -W] per head     (r = 2 f)
Padded keys get phi = 0.

Letter legend: b - batch, h - heads, n - length, d - head dim, e - value dim, r - features, w - rows in a tile.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import os
from collections.abc import Iterator

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
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
    return max(16, triton.next_power_of_2(x))


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
    def _phi(
        x,
        proj,
        rows_ok,
        cols_r,
        r,
        offset,
        hsq_scale,
        floor,
        log_half_r,
        KIND: tl.constexpr,
        IS_KEY: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """Features of a tile: x `[w, D]` fp32 -> (phi `[w, R]`, pre `[w, R]`: x P, or x itself for ELU), zero
        outside `rows_ok` `[w]` and past column r. `offset`: FAVOR's key offset (a scalar; unused for queries)."""
        cols_ok = cols_r < r
        if KIND == 0:
            pre = x
            phi = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
        else:
            pre = _dot(x, proj, PREC)
            if KIND == 1:
                half_sq = tl.sum(x * x, 1) * hsq_scale
                if IS_KEY:
                    shift = half_sq + offset
                else:
                    shift = half_sq + tl.max(tl.where(cols_ok[None, :], pre, float("-inf")), 1)
                phi = tl.exp(pre - (shift + log_half_r)[:, None]) + floor
            elif KIND == 2:
                phi = tl.maximum(pre, 0.0) * tl.exp(-log_half_r) + floor
            else:
                # softmax over the first half of the columns, and over the second
                first = (cols_r < r // 2)[None, :]
                top_a = tl.max(tl.where(first & cols_ok[None, :], pre, float("-inf")), 1)
                top_b = tl.max(tl.where(~first & cols_ok[None, :], pre, float("-inf")), 1)
                e = tl.where(cols_ok[None, :], tl.exp(pre - tl.where(first, top_a[:, None], top_b[:, None])), 0.0)
                sum_a = tl.sum(tl.where(first, e, 0.0), 1)
                sum_b = tl.sum(tl.where(first, 0.0, e), 1)
                phi = e / tl.where(first, sum_a[:, None], sum_b[:, None])
        phi = tl.where(rows_ok[:, None] & cols_ok[None, :], phi, 0.0)
        return phi, pre

    @triton.jit
    def _phi_backward(
        x, proj, phi, pre, grad_phi, cols_r, r, hsq_scale, floor, log_half_r, KIND: tl.constexpr, PREC: tl.constexpr
    ):
        """Through the feature map of a tile: -> (dx `[w, D]`, d pre `[w, R]`). grad_phi must be zero wherever
        `_phi` forced phi to zero (rows not kept, columns past r)."""
        if KIND == 0:
            grad_pre = grad_phi * tl.minimum(phi, 1.0)
            grad_x = grad_pre
        else:
            if KIND == 1:
                # the offsets carry no gradient; d exp(u) = exp(u) = phi - floor
                grad_pre = tl.where(phi > 0, grad_phi * (phi - floor), 0.0)
            elif KIND == 2:
                grad_pre = tl.where(pre > 0, grad_phi * tl.exp(-log_half_r), 0.0)
            else:
                first = (cols_r < r // 2)[None, :]
                weighted = grad_phi * phi
                dot_a = tl.sum(tl.where(first, weighted, 0.0), 1)
                dot_b = tl.sum(tl.where(first, 0.0, weighted), 1)
                grad_pre = weighted - phi * tl.where(first, dot_a[:, None], dot_b[:, None])
            grad_x = _dot(grad_pre, tl.trans(proj), PREC)
            if KIND == 1:
                grad_x = grad_x - (tl.sum(grad_pre, 1) * (2.0 * hsq_scale))[:, None] * x
        return grad_x, grad_pre

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
    def _load_proj(ptr, h, stride_h, stride_d, stride_r, cols_d, cols_r, d, r, scale, KIND: tl.constexpr):
        """The `[D, R]` projection of head h times `scale` (stride_h 0: one shared by every head), fp32, zero
        outside; HEDGEHOG's `[W, -W]` from W `[d, r / 2]`; ELU has none (zeros, never read)."""
        if KIND == 3:
            first = cols_r < r // 2
            cols = tl.where(first, cols_r, cols_r - r // 2)
            sign = tl.where(first, scale, -scale)
        else:
            cols = cols_r
            sign = (cols_r * 0).to(tl.float32) + scale
        ok = (cols_d < d)[:, None] & (cols_r < r)[None, :] & (KIND != 0)
        offsets = h * stride_h + cols_d[:, None] * stride_d + cols[None, :] * stride_r
        return tl.load(ptr + offsets, mask=ok, other=0.0).to(tl.float32) * sign[None, :]

    @triton.jit
    def _kept_rows(keep_ptr, b, rows, n, HAS_MASK: tl.constexpr):
        ok = rows < n
        if HAS_MASK:
            ok = ok & (tl.load(keep_ptr + b.to(tl.int64) * n + rows, mask=ok, other=0) != 0)
        return ok

    @triton.jit
    def _key_max_kernel(
        K, sk_b, sk_h, sk_n, P, sp_h, sp_d, sp_r, KEEP, KEY_MAX,
        heads, n, d, r, tiles, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, HAS_MASK: tl.constexpr,
        PREC: tl.constexpr,
    ):  # fmt: skip
        """FAVOR's key offset: the max of k P over the kept keys of each (sample, head), `[b h]`, by atomic max."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // heads, bh % heads
        cols_d, cols_r = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_R)
        proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, cols_r, d, r, proj_scale, 1)
        best = tl.full([BLOCK_N], float("-inf"), tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            x = _load_rows(K, b, h, sk_b, sk_h, sk_n, rows, cols_d, n, d)
            pre = _dot(x, proj, PREC)
            ok = _kept_rows(KEEP, b, rows, n, HAS_MASK)[:, None] & (cols_r < r)[None, :]
            best = tl.maximum(best, tl.max(tl.where(ok, pre, float("-inf")), 1))
        tl.atomic_max(KEY_MAX + bh, tl.max(best, 0))

    @triton.jit
    def _add_state(S, Z, bh, state, total, cols_r, cols_e, r, e):
        """Atomically add a program's `[R, E]` state (or its gradient) and `[R]` key sum into `[b h, r, e]` and
        `[b h, r]`."""
        ok = (cols_r < r)[:, None] & (cols_e < e)[None, :]
        tl.atomic_add(S + bh.to(tl.int64) * r * e + cols_r[:, None] * e + cols_e[None, :], state, mask=ok)
        tl.atomic_add(Z + bh.to(tl.int64) * r + cols_r, total, mask=cols_r < r)

    @triton.jit
    def _add_proj_grad(DP, h, grad_proj, cols_d, cols_r, d, r):
        """Atomically add a program's `[D, R]` gradient of head h's map into `[h, d, r]`."""
        ok = (cols_d < d)[:, None] & (cols_r < r)[None, :]
        tl.atomic_add(DP + h * d * r + cols_d[:, None] * r + cols_r[None, :], grad_proj, mask=ok)

    @triton.jit
    def _key_offset(KEY_MAX, bh, KIND: tl.constexpr):
        """FAVOR's key offset of this (sample, head); 0 for the other maps, which have none."""
        offset = 0.0
        if KIND == 1:
            offset = tl.load(KEY_MAX + bh)
        return offset

    @triton.jit
    def _state_kernel(
        K, sk_b, sk_h, sk_n, V, sv_b, sv_h, sv_n, P, sp_h, sp_d, sp_r, KEEP, KEY_MAX, S, Z,
        heads, n, d, e, r, tiles, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr,
        KIND: tl.constexpr, HAS_MASK: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """S `[b h, r, e]` += phi(k)^T v and z `[b h, r]` += phi(k)^T 1 over this program's tiles of keys."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // heads, bh % heads
        cols_d, cols_e, cols_r = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_R)
        proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, cols_r, d, r, proj_scale, KIND)
        offset = _key_offset(KEY_MAX, bh, KIND)
        state = tl.zeros([BLOCK_R, BLOCK_E], tl.float32)
        total = tl.zeros([BLOCK_R], tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            x = _load_rows(K, b, h, sk_b, sk_h, sk_n, rows, cols_d, n, d)
            values = _load_rows(V, b, h, sv_b, sv_h, sv_n, rows, cols_e, n, e)
            kept = _kept_rows(KEEP, b, rows, n, HAS_MASK)
            phi, _ = _phi(x, proj, kept, cols_r, r, offset, hsq_scale, floor, log_half_r, KIND, True, PREC)
            state += _dot(tl.trans(phi), values, PREC)
            total += tl.sum(phi, 0)
        _add_state(S, Z, bh, state, total, cols_r, cols_e, r, e)

    @triton.jit
    def _load_state(S, Z, bh, cols_r, cols_e, r, e):
        ok = (cols_r < r)[:, None] & (cols_e < e)[None, :]
        state = tl.load(S + bh.to(tl.int64) * r * e + cols_r[:, None] * e + cols_e[None, :], mask=ok, other=0.0)
        return state, tl.load(Z + bh.to(tl.int64) * r + cols_r, mask=cols_r < r, other=0.0)

    @triton.jit
    def _output_kernel(
        Q, sq_b, sq_h, sq_n, P, sp_h, sp_d, sp_r, S, Z, OUT, so_b, so_h, so_n,
        heads, n, d, e, r, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr,
        KIND: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """O = phi(q) S / max(phi(q) z, eps) for one tile of queries."""
        bh, tile = tl.program_id(0), tl.program_id(1)
        b, h = bh // heads, bh % heads
        cols_d, cols_e, cols_r = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_R)
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, cols_r, d, r, proj_scale, KIND)
        state, total = _load_state(S, Z, bh, cols_r, cols_e, r, e)
        x = _load_rows(Q, b, h, sq_b, sq_h, sq_n, rows, cols_d, n, d)
        phi, _ = _phi(x, proj, rows < n, cols_r, r, 0.0, hsq_scale, floor, log_half_r, KIND, False, PREC)
        den = tl.maximum(tl.sum(phi * total[None, :], 1), 1e-12)
        out = _dot(phi, state, PREC) / den[:, None]
        _store_rows(OUT, out, b, h, so_b, so_h, so_n, rows, cols_e, n, e)

    @triton.jit
    def _query_backward_kernel(
        Q, sq_b, sq_h, sq_n, P, sp_h, sp_d, sp_r, S, Z, OUT, so_b, so_h, so_n, DO, sdo_b, sdo_h, sdo_n,
        DQ, sdq_b, sdq_h, sdq_n, DS, DZ, DP,
        heads, n, d, e, r, tiles, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr,
        KIND: tl.constexpr, LEARNED: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """dq, and dS `[b h, r, e]`, dz `[b h, r]` (and the map's gradient `[h, D, R]`) summed over the queries."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // heads, bh % heads
        cols_d, cols_e, cols_r = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_R)
        proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, cols_r, d, r, proj_scale, KIND)
        grad_state = tl.zeros([BLOCK_R, BLOCK_E], tl.float32)
        grad_total = tl.zeros([BLOCK_R], tl.float32)
        grad_proj = tl.zeros([BLOCK_D, BLOCK_R], tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            state, total = _load_state(S, Z, bh, cols_r, cols_e, r, e)
            x = _load_rows(Q, b, h, sq_b, sq_h, sq_n, rows, cols_d, n, d)
            phi, pre = _phi(x, proj, rows < n, cols_r, r, 0.0, hsq_scale, floor, log_half_r, KIND, False, PREC)
            den = tl.sum(phi * total[None, :], 1)
            safe_den = tl.maximum(den, 1e-12)
            out = _load_rows(OUT, b, h, so_b, so_h, so_n, rows, cols_e, n, e)
            grad_out = _load_rows(DO, b, h, sdo_b, sdo_h, sdo_n, rows, cols_e, n, e)
            # out = num / max(den, eps): d num = g / den, d den = -(g . out) / den (zero where den < eps)
            grad_num = grad_out / safe_den[:, None]
            grad_den = tl.where(den < 1e-12, 0.0, -tl.sum(grad_out * out, 1) / safe_den)
            grad_phi = _dot(grad_num, tl.trans(state), PREC) + grad_den[:, None] * total[None, :]
            grad_phi = tl.where((rows < n)[:, None] & (cols_r < r)[None, :], grad_phi, 0.0)
            grad_state += _dot(tl.trans(phi), grad_num, PREC)
            grad_total += tl.sum(phi * grad_den[:, None], 0)
            grad_x, grad_pre = _phi_backward(x, proj, phi, pre, grad_phi, cols_r, r, hsq_scale, floor, log_half_r,
                                             KIND, PREC)  # fmt: skip
            _store_rows(DQ, grad_x, b, h, sdq_b, sdq_h, sdq_n, rows, cols_d, n, d)
            if LEARNED:
                grad_proj += _dot(tl.trans(x), grad_pre, PREC)
        _add_state(DS, DZ, bh, grad_state, grad_total, cols_r, cols_e, r, e)
        if LEARNED:
            _add_proj_grad(DP, h, grad_proj, cols_d, cols_r, d, r)

    @triton.jit
    def _key_backward_kernel(
        K, sk_b, sk_h, sk_n, V, sv_b, sv_h, sv_n, P, sp_h, sp_d, sp_r, KEEP, KEY_MAX, DS, DZ,
        DK, sdk_b, sdk_h, sdk_n, DV, sdv_b, sdv_h, sdv_n, DP,
        heads, n, d, e, r, tiles, hsq_scale, floor, log_half_r, proj_scale,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr,
        KIND: tl.constexpr, HAS_MASK: tl.constexpr, LEARNED: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """dv = phi(k) dS, dk through dphi(k) = v dS^T + dz (and the map's gradient), over this program's keys."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // heads, bh % heads
        cols_d, cols_e, cols_r = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_R)
        proj = _load_proj(P, h, sp_h, sp_d, sp_r, cols_d, cols_r, d, r, proj_scale, KIND)
        offset = _key_offset(KEY_MAX, bh, KIND)
        grad_proj = tl.zeros([BLOCK_D, BLOCK_R], tl.float32)
        for tile in range(tiles):
            rows = (split * tiles + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
            grad_state, grad_total = _load_state(DS, DZ, bh, cols_r, cols_e, r, e)
            x = _load_rows(K, b, h, sk_b, sk_h, sk_n, rows, cols_d, n, d)
            values = _load_rows(V, b, h, sv_b, sv_h, sv_n, rows, cols_e, n, e)
            kept = _kept_rows(KEEP, b, rows, n, HAS_MASK)
            phi, pre = _phi(x, proj, kept, cols_r, r, offset, hsq_scale, floor, log_half_r, KIND, True, PREC)
            _store_rows(DV, _dot(phi, grad_state, PREC), b, h, sdv_b, sdv_h, sdv_n, rows, cols_e,
                        n, e)  # fmt: skip
            grad_phi = _dot(values, tl.trans(grad_state), PREC) + grad_total[None, :]
            grad_phi = tl.where(kept[:, None] & (cols_r < r)[None, :], grad_phi, 0.0)
            grad_x, grad_pre = _phi_backward(x, proj, phi, pre, grad_phi, cols_r, r, hsq_scale, floor, log_half_r,
                                             KIND, PREC)  # fmt: skip
            _store_rows(DK, grad_x, b, h, sdk_b, sdk_h, sdk_n, rows, cols_d, n, d)
            if LEARNED:
                grad_proj += _dot(tl.trans(x), grad_pre, PREC)
        if LEARNED:
            _add_proj_grad(DP, h, grad_proj, cols_d, cols_r, d, r)


# Triton chose, when the kernels were defined, between compiling them and interpreting them
_INTERPRETED = triton is not None and not isinstance(_state_kernel, triton.runtime.JITFunction)


def _programs(device: torch.device) -> int:
    """Programs to keep the device busy: four per multiprocessor on a GPU; a few in the interpreter."""
    if device.type != "cuda":
        return 4
    return 4 * _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_DOT_PRECISIONS = ("tf32", "bf16")


def _config_override(kind: int) -> tuple[int, int, str | None] | None:
    """`ZOO_FUSED_CONFIG`: `rows:warps[:dot]` for every feature map, or per map, `elu=64:4,favor=32:8:bf16` (the
    names of `Feature`, lower case): tile rows, warps and, for half-precision inputs, the products' precision (tf32,
    the default, or bf16 operands with fp32 sums), for a sweep (`zoo_bench.kernel_configs`)."""
    text = os.environ.get("ZOO_FUSED_CONFIG", "")
    for entry in filter(None, text.split(",")):
        name, _, config = entry.rpartition("=")
        if name in ("", Feature(kind).name.lower()):
            parts = config.split(":")
            try:
                rows, warps = int(parts[0]), int(parts[1])
            except (ValueError, IndexError):
                rows = None
            dot = parts[2] if len(parts) == 3 else None
            if rows is None or len(parts) > 3 or dot not in (None, *_DOT_PRECISIONS):
                raise ValueError(
                    f"ZOO_FUSED_CONFIG entry {entry!r} is not rows:warps[:dot] (dot one of "
                    f"{', '.join(_DOT_PRECISIONS)}), e.g. 64:4 or favor=32:8:bf16"
                )
            return rows, warps, dot
    return None


class _Plan:
    """Block sizes, split counts and the constants of one call."""

    def __init__(self, q: Tensor, v: Tensor, features: int, kind: int, eps: float) -> None:
        b, h, n, d = q.shape
        self.h, self.n, self.d, self.e, self.r = h, n, d, v.shape[-1], features
        self.block_d, self.block_e, self.block_r = _pow2(d), _pow2(self.e), _pow2(features)
        # The `[w, r]` feature tile and the `[r, e]` state share the registers with the accumulators.
        self.block_n = 64 if self.block_r <= 128 else 32
        self.warps = 4 if self.block_r * self.block_e <= 64 * 64 else 8
        # tf32 where the inputs are half precision anyway; exact fp32 products for fp32 inputs
        self.prec = "ieee" if q.dtype == torch.float32 else "tf32"
        override = _config_override(kind)
        if override:
            self.block_n, self.warps, dot = override
            if dot and self.prec != "ieee":
                self.prec = dot
        n_tiles = triton.cdiv(n, self.block_n)
        splits = max(1, min(n_tiles, _programs(q.device) // (b * h)))
        self.tiles = triton.cdiv(n_tiles, splits)
        self.splits = triton.cdiv(n_tiles, self.tiles)
        self.n_tiles = n_tiles
        self.kind = kind
        self.hsq_scale = 0.5 * d**-0.5
        # FAVOR and RELU project x d^-1/4 (so that phi(q).phi(k) estimates exp(q.k / sqrt(d)))
        self.proj_scale = d**-0.25 if kind in (Feature.FAVOR, Feature.RELU) else 1.0
        self.log_half_r = 0.5 * math.log(features)
        self.floor = eps / math.sqrt(features) if kind == Feature.FAVOR else eps

    def blocks(self) -> dict:
        return {
            "BLOCK_N": self.block_n,
            "BLOCK_D": self.block_d,
            "BLOCK_E": self.block_e,
            "BLOCK_R": self.block_r,
            "PREC": self.prec,
            "num_warps": self.warps,
            # 256 features: three pipeline stages of fp32 tiles ask for 250 KB of shared memory (an H200 has 227)
            **({"num_stages": 1} if self.block_r >= 256 else {}),
        }

    def constants(self) -> tuple:
        return self.h, self.n, self.d, self.e, self.r

    def scalars(self) -> tuple:
        return self.hsq_scale, self.floor, self.log_half_r, self.proj_scale


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
    grid = (b * h, plan.splits)
    if key_max is None:
        key_max = k.new_full((b * h,), float("-inf"), dtype=torch.float32)
        if plan.kind == Feature.FAVOR:
            _key_max_kernel[grid](
                k, *_strides(k), *pk, keep_t, key_max, h, n, d, plan.r, plan.tiles, plan.proj_scale,
                BLOCK_N=plan.block_n, BLOCK_D=plan.block_d, BLOCK_R=plan.block_r, HAS_MASK=keep is not None,
                PREC=plan.prec, num_warps=plan.warps,
            )  # fmt: skip
        # no kept key at all: any finite offset (their features are zero)
        key_max = torch.nan_to_num(key_max, neginf=0.0)
    _state_kernel[grid](
        k, *_strides(k), v, *_strides(v), *pk, keep_t, key_max, state, total, *plan.constants(), plan.tiles,
        *plan.scalars(), KIND=plan.kind, HAS_MASK=keep is not None, **plan.blocks(),
    )  # fmt: skip
    return state, total, key_max


def _forward(q, k, v, keep, proj_q, proj_k, kind: int, eps: float):
    b, h, n, d = q.shape
    plan = _Plan(q, v, _features(proj_q, q, kind), kind, eps)
    state, total, key_max = _state(k, v, keep, proj_k, plan)
    out = q.new_empty(b, n, h, plan.e).permute(0, 2, 1, 3)  # [b, h, n, e] laid out as [b, n, h, e] for proj
    _output_kernel[(b * h, plan.n_tiles)](
        q, *_strides(q), *_proj_args(proj_q, q), state, total, out, *_strides(out), *plan.constants(),
        *plan.scalars(), KIND=kind, **plan.blocks(),
    )  # fmt: skip
    return out, state, total, key_max


def _heads(packed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`[b, n, 3, h, d]` -> its q, k and v parts as `[b, h, n, d]` views."""
    return tuple(packed[:, :, i].permute(0, 2, 1, 3) for i in range(3))


def _backward(grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind: int, eps: float):
    b, h, n, d = q.shape
    plan = _Plan(q, v, _features(proj_q, q, kind), kind, eps)
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
    keep_t = _keep_arg(keep, q)
    grid = (b * h, plan.splits)
    grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    _query_backward_kernel[grid](
        q, *_strides(q), *_proj_args(proj_q, q), state, total, out, *_strides(out), grad_out, *_strides(grad_out),
        grad_q, *_strides(grad_q), grad_state, grad_total, grad_proj_q if learned else state,
        *plan.constants(), plan.tiles, *plan.scalars(), KIND=kind, LEARNED=learned, **plan.blocks(),
    )  # fmt: skip
    _key_backward_kernel[grid](
        k, *_strides(k), v, *_strides(v), *_proj_args(proj_k, q), keep_t, key_max, grad_state, grad_total,
        grad_k, *_strides(grad_k), grad_v, *_strides(grad_v), grad_proj_k if learned else state,
        *plan.constants(), plan.tiles, *plan.scalars(), KIND=kind, HAS_MASK=keep is not None, LEARNED=learned,
        **plan.blocks(),
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


def _setup_context(ctx, inputs, output):
    q, k, v, keep, proj_q, proj_k, kind, eps = inputs
    out, state, total, key_max = output
    ctx.mark_non_differentiable(state, total, key_max)
    if not saves_state(q.shape[-2], state.shape[1], state.shape[2]):
        state = total = None
    ctx.save_for_backward(q, k, v, keep, proj_q, proj_k, out, state, total, key_max)
    ctx.kind, ctx.eps = kind, eps


def _op_backward(ctx, grad_out, *_unused):
    q, k, v, keep, proj_q, proj_k, out, state, total, key_max = ctx.saved_tensors
    grad_qkv, grad_proj_q, grad_proj_k = _fused_backward_op(
        grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, ctx.kind, ctx.eps
    )
    grad_q, grad_k, grad_v = _heads(grad_qkv)
    learned = ctx.kind == Feature.HEDGEHOG
    return (
        grad_q,
        grad_k,
        grad_v,
        None,
        grad_proj_q.to(proj_q.dtype) if learned else None,
        grad_proj_k.to(proj_k.dtype) if learned else None,
        None,
        None,
    )


_fused_op.register_autograd(_op_backward, setup_context=_setup_context)


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
    out, *_ = _fused_op(q, k, v, keep, proj_q, proj_k, int(feature), float(eps))
    return out
