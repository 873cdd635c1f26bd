"""The CPU fast paths of the linear family's non-causal mode: row-blocked kernels with hand-written backwards,
for `linear` (elu + 1 features, `BlockedLinear`) and `performer` (FAVOR+ softmax features, `BlockedFavor`).

Both compute what the torch path computes (explicit features through `_kernel.kernel_attention`) without ever
storing the `[b, h, n, r]` features: keys block by block into the state `[S | z]`, then queries block by block,
the features recomputed in backward. Every block reuses the same workspaces (`_workspace`): a fresh buffer per
block costs page faults as dear as the arithmetic on it. The output is written straight into a `[b, n, h, d]`
buffer, so the head merge before `proj` is a view, and the three input gradients into one `[b, n, 3, h, d]`
buffer, which `SplitHeads` hands on as the qkv gradient. They walk keys and queries in the same row blocks:
self-attention lengths only. `_paths.choose_path` never picks them under `torch.export`, whose tracing refuses
their `out=` writes.

Letter legend: b - batch, h - heads, n - length, w - rows in a block, d - head dim (value dim), r - features,
e - value dim + 1 (values with a ones column, whose output is the normaliser).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._workspace import (
    Workspace,
    first_order_only,
    keep_in_rows,
    normalise_backward_into,
    normalise_into,
    num_rows,
    row_blocks,
    rows_per_block,
    unwritten,
    with_ones_into,
)

__all__ = ["FAVOR_BLOCK_BYTES", "LINEAR_BLOCK_BYTES", "blocked_favor_attention", "blocked_linear_attention"]


def blocked_linear_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Non-causal linear attention (elu + 1 features) through `BlockedLinear`, in float32 at least.

    q, k: `[b, h, n, r]`, v: `[b, h, n, d]`; mask: `[b, n]` bool, True = keep -> `[b, h, n, d]` in v's dtype.
    """
    out_dtype = v.dtype
    with torch.autocast(v.device.type, enabled=False):
        dtype = torch.promote_types(torch.promote_types(q.dtype, v.dtype), torch.float32)
        return BlockedLinear.apply(q.to(dtype), k.to(dtype), v.to(dtype), mask).to(out_dtype)


def blocked_favor_attention(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, mask: Tensor | None, eps: float):
    """Non-causal FAVOR+ (softmax kernel) through `BlockedFavor`, in float32 at least with autocast off.

    q, k, v: `[b, h, n, d]`; projection: `[r, d]`; mask: `[b, n]` bool, True = keep; eps: the features' floor
    -> `[b, h, n, d]` in v's dtype.
    """
    out_dtype = v.dtype
    with torch.autocast(v.device.type, enabled=False):
        dtype = torch.promote_types(v.dtype, torch.float32)
        q, k, v, projection = q.to(dtype), k.to(dtype), v.to(dtype), projection.to(dtype)
        return BlockedFavor.apply(q, k, v, projection, mask, eps).to(out_dtype)


# Rows per block in `BlockedLinear`: 4 MiB of `[b, h, w, d]` features, a block that stays in the CPU's caches.
LINEAR_BLOCK_BYTES = 2**22


def _elu_features(x: Tensor, workspace: Workspace, scratch: Workspace, keep: Tensor | None = None) -> Tensor:
    """`linear.elu_feature_map` of a block `x: [b, h, w, d]` in place in `workspace` (contiguous), using `scratch`;
    zero where `keep` `[b, 1, w]` is False."""
    # elu(x) + 1 = exp(min(x, 0)) + max(x, 0): vectorised passes, faster on CPU than aten's elu. x (a strided view of
    # qkv) is read from memory once; the other passes run on the cached copy.
    phi = workspace.view(*x.shape).copy_(x)
    below = torch.clamp_max(phi, 0.0, out=scratch.view(*x.shape)).exp_()
    phi.clamp_min_(0.0).add_(below)
    if keep is not None:
        phi.mul_(keep[..., None])
    return phi


def _workspaces(q: Tensor, block: int, value_dim: int) -> tuple[Workspace, Workspace]:
    """The features' workspace (`[b, h, block, r]`) and the values' (`[b, h, block, d + 1]`), which also serves
    `_elu_features` as scratch before each block's values are written."""
    b, h, _, r = q.shape
    return Workspace(q, b * h * block * r), Workspace(q, b * h * block * max(r, value_dim + 1))


class BlockedLinear(torch.autograd.Function):
    """Non-causal linear attention in row blocks, equal to `kernel_attention` on `elu + 1` features.

    Forward: keys block by block into the state `[S | z]^T = [v | 1]^T phi_k: [b h, e, d]` (e = d + 1; kept as
    `[e, d]`, the layout whose contractions run fastest on CPU), then queries block by block, the output
    written straight into a `[b, n, h, d]` buffer, so the head merge before `proj` is a view. Backward
    recomputes the features (elu' = min(phi, 1)) and writes the three gradients into one `[b, n, 3, h, d]`
    buffer, which `SplitHeads` hands on as the qkv gradient. Saved: q, k, v, the state, output and normaliser.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None):
        b, h, n, r = q.shape
        d = v.shape[-1]
        block = rows_per_block(n, b * h * max(r, d + 1) * q.element_size(), LINEAR_BLOCK_BYTES, q.device)
        features_ws, values_ws = _workspaces(q, block, d)
        keep = None if mask is None else mask[:, None, :]
        state = q.new_zeros(b * h, d + 1, r)
        for rows in row_blocks(n, block):
            phi = _elu_features(k[:, :, rows], features_ws, values_ws, keep_in_rows(keep, rows)).flatten(0, 1)
            values = with_ones_into(v[:, :, rows], values_ws).flatten(0, 1)
            state.baddbmm_(values.transpose(1, 2), phi)
        out = unwritten(q, (b, n, h, d)).permute(0, 2, 1, 3)  # [b, h, n, d] laid out as [b, n, h, d] for proj
        den = unwritten(q, (b, h, n))
        for rows in row_blocks(n, block):
            w = num_rows(rows)
            phi = _elu_features(q[:, :, rows], features_ws, values_ws).flatten(0, 1)
            numden = torch.bmm(phi, state.transpose(1, 2), out=values_ws.view(b * h, w, d + 1)).unflatten(0, (b, h))
            normalise_into(numden, out[:, :, rows], den[:, :, rows])
        ctx.save_for_backward(q, k, v, mask, state, out, den)
        ctx.block = block
        return out

    @staticmethod
    @first_order_only
    def backward(ctx, grad_out: Tensor):
        q, k, v, mask, state, out, den = ctx.saved_tensors
        block = ctx.block
        b, h, n, r = q.shape
        d = v.shape[-1]
        keep = None if mask is None else mask[:, None, :]
        features_ws, values_ws = _workspaces(q, block, d)
        grad_features_ws = Workspace(q, b * h * block * max(r, d))
        if r == d:
            # One buffer laid out like the qkv projection's output, so `SplitHeads` hands it on without a copy.
            grad_qkv = unwritten(q, (b, n, 3, h, d))
            grad_q, grad_k, grad_v = (grad_qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
        else:
            grad_q, grad_k, grad_v = (unwritten(x, x.shape) for x in (q, k, v))
        grad_state = torch.zeros_like(state)
        for rows in row_blocks(n, block):
            w = num_rows(rows)
            phi = _elu_features(q[:, :, rows], features_ws, values_ws).flatten(0, 1)
            grad_numden = normalise_backward_into(grad_out[:, :, rows], out[:, :, rows], den[:, :, rows], values_ws)
            grad_state.baddbmm_(grad_numden.transpose(1, 2), phi)
            # Through phi = elu + 1: its derivative is 1 above zero and exp(x) = phi below, i.e. min(phi, 1).
            grad_phi = torch.bmm(grad_numden, state, out=grad_features_ws.view(b * h, w, r))
            grad_q[:, :, rows] = grad_phi.mul_(phi.clamp_max_(1.0)).view(b, h, w, r)
        grad_state_v = grad_state[:, :d].transpose(1, 2)
        for rows in row_blocks(n, block):
            w = num_rows(rows)
            # Padded keys have phi = 0, so min(phi, 1) = 0 gives them no gradient either.
            phi = _elu_features(k[:, :, rows], features_ws, values_ws, keep_in_rows(keep, rows)).flatten(0, 1)
            grad_v[:, :, rows] = torch.bmm(phi, grad_state_v, out=grad_features_ws.view(b * h, w, d)).view(b, h, w, d)
            values = with_ones_into(v[:, :, rows], values_ws).flatten(0, 1)
            grad_phi = torch.bmm(values, grad_state, out=grad_features_ws.view(b * h, w, r))
            grad_k[:, :, rows] = grad_phi.mul_(phi.clamp_max_(1.0)).view(b, h, w, r)
        return grad_q, grad_k, grad_v, None


# Rows per block in `BlockedFavor`: about 32 MiB of features across batch x heads. Large blocks keep the op count
# low: every op is a thread barrier, which costs most on busy cores.
FAVOR_BLOCK_BYTES = 2**25


class BlockedFavor(torch.autograd.Function):
    """Non-causal FAVOR+ (softmax kernel) in row blocks, equal to the `kernel_attention` path.

    Forward: keys block by block into the state `[S | z]^T: [b h, e, r]`, with an online max over kept keys
    (the state is rescaled when the max grows, like online softmax), then queries block by block. The `[n, r]`
    features are never stored: backward recomputes them block by block. The eps floor of the features enters
    the state analytically. Saved: q, k, v, the state, the output, the normaliser and the offsets.
    The state is kept as `[e, r]`: every contraction is then `[e, w] @ [w, r]` or `[w, *] @ [*, r]`; the
    transposed `[r, w] @ [w, e]` runs slower on CPU.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, projection: Tensor, mask: Tensor | None, eps: float):
        b, h, n, d = q.shape
        r = projection.shape[0]
        weight_t = (projection * d**-0.25).t()
        block = rows_per_block(n, b * h * r * q.element_size(), FAVOR_BLOCK_BYTES, q.device)
        features_ws, values_ws = Workspace(q, b * h * block * r), Workspace(q, b * h * block * (d + 1))
        floor = eps / math.sqrt(r)
        keep = None if mask is None else mask[:, None, :]
        half_sq = _half_square(k)
        state = q.new_zeros(b * h, d + 1, r)
        running_max = q.new_full((b, h), torch.finfo(q.dtype).min)
        for rows in row_blocks(n, block):
            features = torch.matmul(k[:, :, rows], weight_t, out=features_ws.view(b, h, num_rows(rows), r))
            new_max = _key_max(features, keep_in_rows(keep, rows), running_max)
            _exp_key_features(features, half_sq[..., rows], keep_in_rows(keep, rows), new_max)
            # Online max: rescale the state to the new running max, then add this block (relative to it).
            state.mul_(torch.exp(running_max - new_max).view(-1, 1, 1))
            values = with_ones_into(v[:, :, rows], values_ws).flatten(0, 1)
            state.baddbmm_(values.transpose(1, 2), features.flatten(0, 1))
            running_max = new_max
        # The keys' floor: every kept key adds floor * [v_j | 1] to every feature of the state.
        kept = v.sum(-2) if keep is None else (v * keep[..., None]).sum(-2)
        count = torch.full((b, h, 1), n, dtype=v.dtype, device=v.device) if keep is None else keep.sum(-1, True).to(v)
        state.add_(torch.cat([kept, count.expand(b, h, 1)], -1).view(-1, d + 1, 1), alpha=floor)
        # The queries' floor adds floor * sum_r state[:, r] to every output row.
        state_floor = state.sum(-1).mul_(floor).unsqueeze(1)
        out = unwritten(q, (b, n, h, d)).permute(0, 2, 1, 3)  # [b, h, n, d] laid out as [b, n, h, d] for proj
        den = unwritten(q, (b, h, n))
        query_offset = unwritten(q, (b, h, n, 1))
        for rows in row_blocks(n, block):
            features = torch.matmul(q[:, :, rows], weight_t, out=features_ws.view(b, h, num_rows(rows), r))
            # exp(w.q - |q|^2 / 2 - max(w.q)): the torch path's offset (see `performer.softmax_kernel_features`).
            offset = torch.add(features.amax(-1, keepdim=True), 0.5 * math.log(r), out=query_offset[:, :, rows])
            offset.add_(_half_square(q[:, :, rows]).unsqueeze(-1))
            features.sub_(offset).exp_()
            numden = values_ws.view(b * h, num_rows(rows), d + 1)
            torch.baddbmm(state_floor, features.flatten(0, 1), state.transpose(1, 2), out=numden)
            numden = numden.unflatten(0, (b, h))
            normalise_into(numden, out[:, :, rows], den[:, :, rows])
        ctx.save_for_backward(q, k, v, weight_t, mask, state, running_max, out, den, half_sq, query_offset)
        ctx.floor, ctx.block = floor, block
        return out

    @staticmethod
    @first_order_only
    def backward(ctx, grad_out: Tensor):
        q, k, v, weight_t, mask, state, running_max, out, den, half_sq, query_offset = ctx.saved_tensors
        floor, block = ctx.floor, ctx.block
        b, h, n, d = q.shape
        r = weight_t.shape[1]
        weight = weight_t.t()
        keep = None if mask is None else mask[:, None, :]
        features_ws, grad_features_ws = Workspace(q, b * h * block * r), Workspace(q, b * h * block * r)
        values_ws, grad_rows_ws = Workspace(q, b * h * block * (d + 1)), Workspace(q, b * h * block * d)
        # One buffer laid out like the qkv projection's output, so `SplitHeads` hands it on without a copy.
        grad_qkv = unwritten(q, (b, n, 3, h, d))
        grad_q, grad_k, grad_v = (grad_qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
        grad_state = torch.zeros_like(state)
        grad_sum = q.new_zeros(b * h, d + 1, 1)
        for rows in row_blocks(n, block):
            w = num_rows(rows)
            features = torch.matmul(q[:, :, rows], weight_t, out=features_ws.view(b, h, w, r))
            features = features.sub_(query_offset[:, :, rows]).exp_().flatten(0, 1)
            grad_numden = normalise_backward_into(grad_out[:, :, rows], out[:, :, rows], den[:, :, rows], values_ws)
            grad_state.baddbmm_(grad_numden.transpose(1, 2), features)
            grad_sum.add_(grad_numden.sum(1).unsqueeze(-1))
            # Through exp (the row max is a constant) and the projection.
            grad_features = torch.bmm(grad_numden, state, out=grad_features_ws.view(b * h, w, r)).mul_(features)
            grad_rows = torch.mm(grad_features.view(-1, r), weight, out=grad_rows_ws.view(b * h * w, d))
            grad_q[:, :, rows] = _add_half_square_grad(grad_rows.view(b, h, w, d), grad_features, q[:, :, rows])
        # The queries' floor: every output row added floor * sum_r state[:, r].
        grad_state.add_(grad_sum, alpha=floor)
        grad_state_v = grad_state[:, :d].transpose(1, 2)
        # The keys' floor: every kept key added floor * v_j to every feature of the state.
        grad_v_floor = grad_state[:, :d].sum(-1).mul_(floor).view(b, h, 1, d)
        for rows in row_blocks(n, block):
            w, keep_rows, k_rows = num_rows(rows), keep_in_rows(keep, rows), k[:, :, rows]
            features = torch.matmul(k_rows, weight_t, out=features_ws.view(b, h, w, r))
            features = _exp_key_features(features, half_sq[..., rows], keep_rows, running_max).flatten(0, 1)
            floor_v = grad_v_floor if keep_rows is None else grad_v_floor * keep_rows[..., None]
            grad_rows = grad_rows_ws.view(b * h, w, d)
            torch.baddbmm(floor_v.flatten(0, 1), features, grad_state_v, out=grad_rows)
            grad_v[:, :, rows] = grad_rows.view(b, h, w, d)
            values = with_ones_into(v[:, :, rows], values_ws).flatten(0, 1)
            grad_features = torch.bmm(values, grad_state, out=grad_features_ws.view(b * h, w, r)).mul_(features)
            grad_rows = torch.mm(grad_features.view(-1, r), weight, out=grad_rows_ws.view(b * h * w, d))
            grad_k[:, :, rows] = _add_half_square_grad(grad_rows.view(b, h, w, d), grad_features, k_rows)
        return grad_q, grad_k, grad_v, None, None, None


def _half_square(x: Tensor) -> Tensor:
    """`|x|^2 / 2` of the normalised queries or keys (x d^-1/4), `[b, h, n]`."""
    # vector_norm reduces in one pass; square().sum() would first write a [b, h, n, d] tensor.
    return torch.linalg.vector_norm(x, dim=-1).square_().mul_(0.5 * x.shape[-1] ** -0.5)


def _add_half_square_grad(grad_rows: Tensor, grad_features: Tensor, x: Tensor) -> Tensor:
    """The exponent is w.x - |x|^2 / 2 (x scaled by d^-1/4), its gradient in x w - x / sqrt(d): to the `[b, h, w, d]`
    gradient through w, add the one through |x|^2 / 2, from the `[(b h), w, r]` gradient of the features."""
    b, h, w, d = grad_rows.shape
    return grad_rows.addcmul_(grad_features.sum(-1).view(b, h, w, 1), x, value=-(d**-0.5))


def _key_max(features: Tensor, keep: Tensor | None, running_max: Tensor) -> Tensor:
    """The running max `[b, h]` updated with this block's kept w.k (the reference's offset)."""
    key_max = features.amax(-1)
    if keep is not None:
        key_max.masked_fill_(~keep, torch.finfo(key_max.dtype).min)
    return torch.maximum(running_max, key_max.amax(-1))


def _exp_key_features(features: Tensor, half_sq: Tensor, keep: Tensor | None, offset: Tensor) -> Tensor:
    """In place, `features = w.k`: `exp(w.k - |k|^2 / 2 - offset) / sqrt(r)`, exactly zero for padded keys."""
    shift = half_sq + (offset[..., None] + 0.5 * math.log(features.shape[-1]))
    if keep is not None:
        shift.masked_fill_(~keep, float("inf"))
    return features.sub_(shift[..., None]).exp_()
