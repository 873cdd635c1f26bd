"""FAVOR+: "Rethinking Attention with Performers" (Choromanski et al. 2020), https://arxiv.org/abs/2009.14794

Softmax attention approximated with positive orthogonal random features, `exp(q.k) ~ phi(q).phi(k)`, so the
cost is linear in the sequence length (`kernel="relu"` gives the paper's generalized attention instead).
Features are stabilised per row / per (sample, head) / per key, never across the batch or the future, and
computed in float32. Random features are redrawn every `redraw_interval` optimizer steps from a seed buffer,
so data-parallel replicas and resumed runs draw the same matrices.
"""
from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from torch import Tensor

from ._common import AttentionBase
from ._features import gaussian_orthogonal_random_matrix, relu_kernel_features, softmax_kernel_features
from ._kernel import DENOMINATOR_EPS, kernel_attention
from ._registry import register_attention

__all__ = ["PerformerAttention", "favor_attention"]

KERNELS = ("softmax", "relu")


def favor_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    projection: Tensor,
    mask: Optional[Tensor] = None,
    is_causal: bool = False,
    *,
    kernel: Literal["softmax", "relu"] = "softmax",
    chunk_size: int = 128,
    eps: float = 1e-4,
    fused: bool = True,
) -> Tensor:
    """FAVOR+ attention.

    q, k, v: `[b, h, n, d]`; projection: `[r, d]` random features (rows w); mask: `[b, n]` bool key padding
    mask, True = keep -> `[b, h, n, d]` in v's dtype. q and k are scaled by d^-1/4 inside the feature map, so
    `phi(q).phi(k)` estimates `exp(q.k / sqrt(d))`. `eps` is the floor added to every feature (softmax: after
    stabilisation; relu: the generalized-attention kernel epsilon).

    `fused=True` computes the non-causal softmax kernel block by block (`_FusedFavor`: features never stored,
    recomputed in backward); otherwise, and for causal or relu, features go through `kernel_attention`.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r} is not one of {', '.join(map(repr, KERNELS))}")
    out_dtype = v.dtype
    # Feature maps are exponentials of dot products: in bf16 / fp16 they overflow or lose the normaliser, so
    # features and contractions run in float32 with autocast off, and only the output returns to v's dtype.
    with torch.autocast(v.device.type, enabled=False):
        dtype = torch.promote_types(v.dtype, torch.float32)
        q, k, v, projection = q.to(dtype), k.to(dtype), v.to(dtype), projection.to(dtype)
        if fused and kernel == "softmax" and not is_causal:
            return _FusedFavor.apply(q, k, v, projection, mask, eps).to(out_dtype)
        key_log_scale = None
        if kernel == "softmax":
            phi_q, _ = softmax_kernel_features(q, projection, is_query=True, eps=eps)
            phi_k, key_offset = softmax_kernel_features(
                k, projection, is_query=False, mask=mask, causal=is_causal, eps=eps
            )
            if is_causal:
                key_log_scale = key_offset
        else:
            phi_q = relu_kernel_features(q, projection, eps=eps)
            phi_k = relu_kernel_features(k, projection, mask=mask, eps=eps)
        out = kernel_attention(
            phi_q, phi_k, v, key_log_scale=key_log_scale, is_causal=is_causal, chunk_size=chunk_size
        )
    return out.to(out_dtype)


# Rows per block in `_FusedFavor`: about 16 MiB of features across batch x heads. Smaller blocks stay in L2
# but multiply the small ops, each a thread barrier; measured on 2 busy cores, 1 MiB blocks ran 5x slower.
_BLOCK_BYTES = 2**24


class _FusedFavor(torch.autograd.Function):
    """Non-causal FAVOR+ (softmax kernel) in row blocks, equal to the `kernel_attention` path.

    Forward: keys block by block into the state `[S | z]^T: [b, h, e, r]`, with an online max over kept keys
    (the state is rescaled when the max grows, like online softmax), then queries block by block. The `[n, r]`
    features are never stored: backward recomputes them block by block. The eps floor of the features enters
    the state analytically. Saved: q, k, v, the state, the output, the normaliser and the offsets.
    The state is kept as `[e, r]`: every contraction is then `[e, w] @ [w, r]` or `[w, *] @ [*, r]`; the
    transposed `[r, w] @ [w, e]` ran at half speed on CPU.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, projection: Tensor, mask: Optional[Tensor], eps: float):
        b, h, n, d = q.shape
        r = projection.shape[0]
        weight = projection * d**-0.25
        block = max(16, _BLOCK_BYTES // (b * h * r * q.element_size()))
        floor = eps / math.sqrt(r)
        keep = None if mask is None else mask[:, None, :]
        half_sq = _half_square(k)
        state = q.new_zeros(b * h, d + 1, r)
        running_max = q.new_full((b, h), torch.finfo(q.dtype).min)
        for rows in _blocks(n, block):
            features, new_max = _key_features(
                k[:, :, rows], weight, half_sq[..., rows], _rows(keep, rows), running_max
            )
            # Online max: rescale the state to the new running max, then add this block (relative to it).
            state.mul_(torch.exp(running_max - new_max).view(-1, 1, 1))
            state.baddbmm_(_with_ones(v[:, :, rows]).flatten(0, 1).transpose(1, 2), features.flatten(0, 1))
            running_max = new_max
        # The keys' floor: every kept key adds floor * [v_j | 1] to every feature of the state.
        kept_v1 = _with_ones(v) if keep is None else _with_ones(v) * keep[..., None]
        state.add_(kept_v1.sum(-2).view(-1, d + 1, 1), alpha=floor)
        # The queries' floor adds floor * sum_r state[:, r] to every output row.
        state_floor = state.sum(-1).mul_(floor).unsqueeze(1)
        out = q.new_empty(b, n, h, d).permute(0, 2, 1, 3)  # [b, h, n, d] laid out as [b, n, h, d] for proj
        den = q.new_empty(b, h, n)
        query_offset = q.new_empty(b, h, n, 1)
        for rows in _blocks(n, block):
            features = _query_features(q[:, :, rows], weight, query_offset[:, :, rows])
            numden = torch.baddbmm(state_floor, features.flatten(0, 1), state.transpose(1, 2)).unflatten(0, (b, h))
            den[:, :, rows] = numden[..., -1]
            torch.div(numden[..., :-1], numden[..., -1:].clamp_min(DENOMINATOR_EPS), out=out[:, :, rows])
        ctx.save_for_backward(q, k, v, weight, mask, state, running_max, out, den, half_sq, query_offset)
        ctx.floor, ctx.block = floor, block
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, weight, mask, state, running_max, out, den, half_sq, query_offset = ctx.saved_tensors
        floor, block = ctx.floor, ctx.block
        b, h, n, d = q.shape
        keep = None if mask is None else mask[:, None, :]
        grad_q, grad_k, grad_v = (q.new_empty(b, n, h, d).permute(0, 2, 1, 3) for _ in range(3))
        grad_state = torch.zeros_like(state)
        grad_sum = q.new_zeros(b * h, d + 1, 1)
        for rows in _blocks(n, block):
            features = _query_features(q[:, :, rows], weight, query_offset[:, :, rows], recompute=True)
            # out = num / clamp_min(den): grad_num = g / den, grad_den = -(g . out) / den (zero where den < eps).
            den_rows = den[:, :, rows, None]
            grad_den = (grad_out[:, :, rows] * out[:, :, rows]).sum(-1, keepdim=True).neg_()
            grad_den.masked_fill_(den_rows < DENOMINATOR_EPS, 0.0)
            grad_numden = torch.cat([grad_out[:, :, rows], grad_den], -1).div_(den_rows.clamp_min(DENOMINATOR_EPS))
            grad_numden = grad_numden.flatten(0, 1)
            grad_state.baddbmm_(grad_numden.transpose(1, 2), features.flatten(0, 1))
            grad_sum.add_(grad_numden.sum(1).unsqueeze(-1))
            # Through exp (the row max is a constant) and the projection.
            grad_features = torch.bmm(grad_numden, state).mul_(features.flatten(0, 1))
            grad_q[:, :, rows] = (grad_features @ weight).unflatten(0, (b, h))
        # The queries' floor: every output row added floor * sum_r state[:, r].
        grad_state.add_(grad_sum, alpha=floor)
        grad_state_v = grad_state[:, :d].transpose(1, 2)
        # The keys' floor: every kept key added floor * v_j to every feature of the state.
        grad_v_floor = grad_state[:, :d].sum(-1).mul_(floor).view(b, h, 1, d)
        for rows in _blocks(n, block):
            k_rows, keep_rows = k[:, :, rows], _rows(keep, rows)
            features = _key_features_at(k_rows, weight, half_sq[..., rows], keep_rows, running_max).flatten(0, 1)
            floor_v = grad_v_floor if keep_rows is None else grad_v_floor * keep_rows[..., None]
            grad_v[:, :, rows] = torch.baddbmm(floor_v.flatten(0, 1), features, grad_state_v).unflatten(0, (b, h))
            grad_features = torch.bmm(_with_ones(v[:, :, rows]).flatten(0, 1), grad_state).mul_(features)
            # The exponent is w.k - |k|^2 / 2 (k scaled by d^-1/4): its gradient in k is w - k / sqrt(d).
            grad_k_rows = (grad_features @ weight).unflatten(0, (b, h))
            grad_k_rows.sub_(grad_features.sum(-1).mul_(d**-0.5).view(b, h, -1, 1) * k_rows)
            grad_k[:, :, rows] = grad_k_rows
        return grad_q, grad_k, grad_v, None, None, None


def _blocks(n: int, block: int) -> list[slice]:
    return [slice(start, min(start + block, n)) for start in range(0, n, block)]


def _rows(keep: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    return None if keep is None else keep[..., rows]


def _half_square(k: Tensor) -> Tensor:
    """`|k|^2 / 2` of the normalised keys (k d^-1/4), `[b, h, n]`."""
    return k.square().sum(-1).mul_(0.5 * k.shape[-1] ** -0.5)


def _query_features(q: Tensor, weight: Tensor, offset: Tensor, recompute: bool = False) -> Tensor:
    """`exp(w.q - max_r w.q) / sqrt(r)`, `[b, h, w, r]`, without the eps floor (`weight` already scaled).

    `offset: [b, h, w, 1]` receives `max_r w.q + log sqrt(r)`, or with `recompute` supplies it (backward).
    """
    features = q @ weight.t()
    if not recompute:
        torch.add(features.amax(-1, keepdim=True), 0.5 * math.log(weight.shape[0]), out=offset)
    return features.sub_(offset).exp_()


def _key_features(
    k: Tensor, weight: Tensor, half_sq: Tensor, keep: Optional[Tensor], running_max: Tensor
) -> tuple[Tensor, Tensor]:
    """Key features relative to the running max over kept keys, without the eps floor.

    k: `[b, h, w, d]`, half_sq: `[b, h, w]`, keep: `[b, 1, w]` or None, running_max: `[b, h]` -> features
    `[b, h, w, r]` (padded keys exactly zero) and the new running max `[b, h]`: the max of `running_max` and of
    this block's kept exponents `w.k - |k|^2 / 2`.
    """
    features = k @ weight.t()
    key_max = features.amax(-1).sub_(half_sq)
    if keep is not None:
        key_max.masked_fill_(~keep, torch.finfo(key_max.dtype).min)
    new_max = torch.maximum(running_max, key_max.amax(-1))
    return _exp_shifted(features, half_sq, keep, new_max), new_max


def _key_features_at(k: Tensor, weight: Tensor, half_sq: Tensor, keep: Optional[Tensor], offset: Tensor) -> Tensor:
    """`_key_features` with a known offset `[b, h]` (backward: the final running max)."""
    return _exp_shifted(k @ weight.t(), half_sq, keep, offset)


def _exp_shifted(features: Tensor, half_sq: Tensor, keep: Optional[Tensor], offset: Tensor) -> Tensor:
    """In place: `exp(w.k - |k|^2 / 2 - offset) / sqrt(r)`, zero for padded keys."""
    shift = half_sq + (offset[..., None] + 0.5 * math.log(features.shape[-1]))
    if keep is not None:
        # Padded keys: shift +inf, so exp gives exactly zero.
        shift.masked_fill_(~keep, float("inf"))
    return features.sub_(shift[..., None]).exp_()


def _with_ones(v: Tensor) -> Tensor:
    """`[b, h, w, d]` -> `[b, h, w, e]`: values with a ones column, whose output is the normaliser."""
    return torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)


def _positive_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


@register_attention("performer")
class PerformerAttention(AttentionBase):
    """FAVOR+ multi-head attention with timm's projections; causal mode by chunked prefix sums.

    Buffers (persistent, so resuming restores them): `random_features` `[nb_features, head_dim]` (not named
    `projection*`: `proj` is the prefix of timm's output projection), `seed` (drawn once
    from torch's global RNG at construction), `step` (optimizer steps seen). Call `zoo.attention.
    on_optimizer_step(model)` after every optimizer step; with `redraw_interval > 0` the features are redrawn
    every `redraw_interval` steps from a generator seeded by (`seed`, redraw index).
    """

    supports_causal = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        nb_features: int = 256,
        kernel: Literal["softmax", "relu"] = "softmax",
        redraw_interval: int = 0,
        chunk_size: int = 128,
        eps: float = 1e-4,
        fused: bool = True,
        **timm_args,
    ) -> None:
        _positive_int("nb_features", nb_features, 1)
        _positive_int("redraw_interval", redraw_interval, 0)
        _positive_int("chunk_size", chunk_size, 1)
        if kernel not in KERNELS:
            raise ValueError(f"kernel {kernel!r} is not one of {', '.join(map(repr, KERNELS))}")
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0):
            raise ValueError(f"eps={eps!r} must be a number >= 0")
        if not isinstance(fused, bool):
            raise ValueError(f"fused={fused!r} must be True or False")
        super().__init__(dim, num_heads, **timm_args)
        self.nb_features = nb_features
        self.kernel = kernel
        self.redraw_interval = redraw_interval
        self.chunk_size = chunk_size
        self.eps = float(eps)
        self.fused = fused
        device = timm_args.get("device")
        self.register_buffer("seed", torch.randint(0, 2**62, (), dtype=torch.int64).to(device))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=device))
        self.register_buffer("random_features", self.draw_features(0).to(dtype=timm_args.get("dtype")))

    def draw_features(self, index: int) -> Tensor:
        """Redraw number `index` of the random features, `[nb_features, head_dim]`: a pure function of `seed`."""
        # Golden-ratio stride: distinct, well-spread generator seeds for (seed, index), identical on every replica.
        generator = torch.Generator().manual_seed((int(self.seed) + index * 0x9E3779B97F4A7C15) % 2**64)
        return gaussian_orthogonal_random_matrix(
            self.nb_features, self.head_dim, scaling="chi", generator=generator, device=self.seed.device
        )

    @torch.no_grad()
    def on_optimizer_step(self) -> None:
        """Count an optimizer step; redraw the features when `step` reaches a multiple of `redraw_interval`."""
        self.step += 1
        if self.redraw_interval and int(self.step) % self.redraw_interval == 0:
            self.random_features.copy_(self.draw_features(int(self.step) // self.redraw_interval))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool) -> Tensor:
        return favor_attention(
            q, k, v, self.random_features, mask, is_causal,
            kernel=self.kernel, chunk_size=self.chunk_size, eps=self.eps, fused=self.fused,
        )

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, nb_features={self.nb_features}, kernel={self.kernel!r}, "
            f"redraw_interval={self.redraw_interval}, chunk_size={self.chunk_size}, eps={self.eps}, fused={self.fused}"
        )
