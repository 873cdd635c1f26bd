"""FAVOR+: "Rethinking Attention with Performers" (Choromanski et al. 2020), https://arxiv.org/abs/2009.14794

Softmax attention approximated with positive orthogonal random features, `exp(q.k) ~ phi(q).phi(k)`, so the
cost is linear in the sequence length (`kernel="relu"` gives the paper's generalized attention instead).
Features are stabilised per row / per (sample, head) / per key, never across the batch or the future, and
computed in float32. Random features are redrawn every `redraw_interval` optimizer steps from a seed buffer,
so data-parallel replicas and resumed runs draw the same matrices. The projection is block-orthogonal gaussian
(the paper's ORF), iid gaussian, or structured Hadamard blocks (SORF, "Orthogonal Random Features", Yu et al.
2016, https://arxiv.org/abs/1610.09072). Causal decoding carries the FAVOR+ state token to token
(`decode_step`, shared with linear attention through `KernelStepMixin`). `reference=True` computes every mode
through explicit features and `kernel_attention`, the path the tests compare the blocked kernel with.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase
from ._features import PROJECTIONS, random_projection, relu_kernel_features, softmax_kernel_features
from ._fused_linear import Feature, fused_kernel_attention, fused_usable
from ._kernel import KernelStepMixin, kernel_attention
from ._registry import register_attention
from ._seeded import SeedStepMixin
from ._workspace import (
    Workspace,
    exporting,
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

__all__ = ["PerformerAttention", "favor_attention", "favor_features"]

KERNELS = ("softmax", "relu")


def favor_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    projection: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    kernel: Literal["softmax", "relu"] = "softmax",
    chunk_size: int = 128,
    eps: float = 1e-4,
    reference: bool = False,
) -> Tensor:
    """FAVOR+ attention.

    q, k, v: `[b, h, n, d]`; projection: `[r, d]` random features (rows w); mask: `[b, n]` bool key padding
    mask, True = keep -> `[b, h, n, d]` in v's dtype. q and k are scaled by d^-1/4 inside the feature map, so
    `phi(q).phi(k)` estimates `exp(q.k / sqrt(d))`. `eps` is the floor added to every feature (softmax: after
    stabilisation; relu: the generalized-attention kernel epsilon).

    Non-causal on CUDA, both kernels run in the fused Triton kernels (`_fused_linear`: features computed in the
    kernels from q and k as they come, never stored); elsewhere the softmax kernel runs block by block
    (`_BlockedFavor`: features recomputed in backward); `reference=True`, causal mode, the relu kernel on the
    CPU and `torch.export` (whose tracing refuses the blocked kernel's `out=` workspaces) take explicit features
    through `kernel_attention`.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r} is not one of {', '.join(map(repr, KERNELS))}")
    if not reference and not is_causal and fused_usable(q, k, v, projection.shape[0]):
        weight = projection.t()[None]  # [1, d, r]: a view, so backward keeps no copy of the buffer
        feature = Feature.FAVOR if kernel == "softmax" else Feature.RELU
        return fused_kernel_attention(q, k, v, mask, feature, weight, weight, eps)
    out_dtype = v.dtype
    # Feature maps are exponentials of dot products: in bf16 / fp16 they overflow or lose the normaliser, so
    # features and contractions run in float32 with autocast off, and only the output returns to v's dtype.
    with torch.autocast(v.device.type, enabled=False):
        dtype = torch.promote_types(v.dtype, torch.float32)
        q, k, v, projection = q.to(dtype), k.to(dtype), v.to(dtype), projection.to(dtype)
        # the blocked kernel walks keys and queries in the same row blocks: equal lengths only
        blocked = not reference and kernel == "softmax" and not is_causal and k.shape[-2] == q.shape[-2]
        if blocked and not exporting():
            return _BlockedFavor.apply(q, k, v, projection, mask, eps).to(out_dtype)
        phi_q, phi_k, key_log_scale = favor_features(q, k, projection, mask, is_causal, kernel=kernel, eps=eps)
        out = kernel_attention(phi_q, phi_k, v, key_log_scale=key_log_scale, is_causal=is_causal, chunk_size=chunk_size)
    return out.to(out_dtype)


def favor_features(
    q: Tensor,
    k: Tensor,
    projection: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    kernel: Literal["softmax", "relu"] = "softmax",
    eps: float = 1e-4,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The features `kernel_attention` takes, in float32 at least with autocast off.

    q, k: `[b, h, n, d]`; projection: `[r, d]`; mask: `[b, n]` bool, True = keep -> phi_q, phi_k `[b, h, n, r]`
    (padded keys zero) and the key log-scale `[b, h, n]` for the causal softmax kernel (per-key stabiliser,
    -inf for padded keys), else None (the non-causal stabiliser is one constant per sample and head).
    """
    with torch.autocast(q.device.type, enabled=False):
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k, projection = q.to(dtype), k.to(dtype), projection.to(dtype)
        if kernel == "relu":
            phi_k = relu_kernel_features(k, projection, mask=mask, eps=eps)
            return relu_kernel_features(q, projection, eps=eps), phi_k, None
        phi_q, _ = softmax_kernel_features(q, projection, is_query=True, eps=eps)
        phi_k, key_offset = softmax_kernel_features(k, projection, is_query=False, mask=mask, causal=is_causal, eps=eps)
        return phi_q, phi_k, key_offset if is_causal else None


# Rows per block in `_BlockedFavor`: about 32 MiB of features across batch x heads, written into buffers
# reused by every block (a fresh buffer that large is mmapped, and its page faults cost as much as the exp).
# Large blocks keep the op count low: every op is a thread barrier, and on busy cores 1 MiB blocks ran 5x slower.
_BLOCK_BYTES = 2**25


class _BlockedFavor(torch.autograd.Function):
    """Non-causal FAVOR+ (softmax kernel) in row blocks, equal to the `kernel_attention` path.

    Forward: keys block by block into the state `[S | z]^T: [b h, e, r]`, with an online max over kept keys
    (the state is rescaled when the max grows, like online softmax), then queries block by block. The `[n, r]`
    features are never stored: backward recomputes them block by block. The eps floor of the features enters
    the state analytically. Saved: q, k, v, the state, the output, the normaliser and the offsets.
    The state is kept as `[e, r]`: every contraction is then `[e, w] @ [w, r]` or `[w, *] @ [*, r]`; the
    transposed `[r, w] @ [w, e]` ran at half speed on CPU.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, projection: Tensor, mask: Tensor | None, eps: float):
        b, h, n, d = q.shape
        r = projection.shape[0]
        weight_t = (projection * d**-0.25).t()
        block = rows_per_block(n, b * h * r * q.element_size(), _BLOCK_BYTES, q.device)
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
            # exp(w.q - |q|^2 / 2 - max(w.q)): the reference's offset (see `softmax_kernel_features`).
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


@register_attention("performer")
class PerformerAttention(SeedStepMixin, KernelStepMixin, AttentionBase):
    """FAVOR+ multi-head attention with timm's projections; causal mode by chunked prefix sums.

    The non-causal softmax kernel runs through `_BlockedFavor` (blocked, features recomputed in backward);
    `reference=True` is the explicit path through `softmax_kernel_features` and `kernel_attention`, which causal
    mode and the relu kernel always take.

    Buffers (persistent, so resuming restores them): `random_features` `[nb_features, head_dim]` (not named
    `projection*`: `proj` is the prefix of timm's output projection), and `SeedStepMixin`'s `seed` and `step`. Call
    `zoo.attention.on_optimizer_step(model)` after every optimizer step; with `redraw_interval > 0` the features
    are redrawn every `redraw_interval` steps from a generator seeded by (`seed`, redraw index). `projection` picks
    how they are drawn (`PROJECTIONS`):
    `orthogonal` (blocks of orthogonal rows, chi norms), `gaussian` (iid N(0, 1) rows) or `hadamard` (SORF
    blocks `sqrt(p) H D1 H D2 H D3`, p = head dim rounded up to a power of 2); see `_features.random_projection`.

    `decode_step` / `init_state` (from `KernelStepMixin`) decode causally token by token with the current
    features; they equal the causal forward while the features stay fixed (no redraw in between).
    """

    supports_causal = True
    test_options: ClassVar[dict] = {"nb_features": 24, "chunk_size": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        nb_features: int = 256,
        kernel: Literal["softmax", "relu"] = "softmax",
        projection: Literal["orthogonal", "gaussian", "hadamard"] = "orthogonal",
        redraw_interval: int = 0,
        chunk_size: int = 128,
        eps: float = 1e-4,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        check_int("nb_features", nb_features, 1)
        check_int("redraw_interval", redraw_interval, 0)
        check_int("chunk_size", chunk_size, 1)
        if kernel not in KERNELS:
            raise ValueError(f"kernel {kernel!r} is not one of {', '.join(map(repr, KERNELS))}")
        if projection not in PROJECTIONS:
            raise ValueError(f"projection {projection!r} is not one of {', '.join(map(repr, PROJECTIONS))}")
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0):
            raise ValueError(f"eps={eps!r} must be a number >= 0")
        check_bool("reference", reference)
        super().__init__(dim, num_heads, **timm_args)
        self.nb_features = nb_features
        self.kernel = kernel
        self.projection = projection
        # The recurrent state of `decode_step` has one row per random feature.
        self.state_features = nb_features
        self.redraw_interval = redraw_interval
        self.chunk_size = chunk_size
        self.eps = float(eps)
        self.reference = reference
        self.register_seed_and_step(self.factory_kwargs["device"])
        self.register_buffer("random_features", self.draw_features(0).to(dtype=self.factory_kwargs["dtype"]))

    def draw_features(self, index: int) -> Tensor:
        """Redraw number `index` of the random features, `[nb_features, head_dim]`: a pure function of `seed`."""
        return random_projection(
            self.projection,
            self.nb_features,
            self.head_dim,
            generator=self.seeded_generator(index),
            device=self.seed.device,
        )

    @torch.no_grad()
    def on_optimizer_step(self) -> None:
        """Count an optimizer step; redraw the features when `step` reaches a multiple of `redraw_interval`."""
        super().on_optimizer_step()
        if self.redraw_interval and int(self.step) % self.redraw_interval == 0:
            self.random_features.copy_(self.draw_features(int(self.step) // self.redraw_interval))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        return favor_attention(
            q,
            k,
            v,
            self.random_features,
            mask,
            is_causal,
            kernel=self.kernel,
            chunk_size=self.chunk_size,
            eps=self.eps,
            reference=self.reference,
        )

    def step_features(self, q: Tensor, k: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        return favor_features(q, k, self.random_features, keep, True, kernel=self.kernel, eps=self.eps)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, nb_features={self.nb_features}, kernel={self.kernel!r}, "
            f"projection={self.projection!r}, "
            f"redraw_interval={self.redraw_interval}, chunk_size={self.chunk_size}, eps={self.eps}, "
            f"reference={self.reference}"
        )
