"""FAVOR+: "Rethinking Attention with Performers" (Choromanski et al. 2020), https://arxiv.org/abs/2009.14794

Softmax attention approximated with positive orthogonal random features (the paper's Lemma 1): with `r` random
directions `w_1..w_r` (the rows of `projection`) and q, k scaled by d^-1/4,

    exp(q.k) ~ phi(q).phi(k),    phi(x) = exp(-|x|^2 / 2) / sqrt(r) [exp(w_1.x), ..., exp(w_r.x)]
    out_i = phi(q_i)^T S / phi(q_i)^T z,    S = sum_j phi(k_j) v_j^T,    z = sum_j phi(k_j)

so the cost is linear in the sequence length (`kernel="relu"` gives the paper's generalized attention,
`phi(x) = relu(W x) / sqrt(r)`, instead). Features are stabilised per row / per (sample, head) / per key, never
across the batch or the future, computed in float32, with a floor `eps` (`softmax_kernel_features`). Random
features are redrawn every `redraw_interval` optimizer steps from a seed buffer, so data-parallel replicas and
resumed runs draw the same matrices. The projection is block-orthogonal gaussian (the paper's ORF), iid gaussian,
or structured Hadamard blocks (SORF, "Orthogonal Random Features", Yu et al. 2016,
https://arxiv.org/abs/1610.09072), drawn by `_features.random_projection`.

`favor_attention_reference` computes it as written; `favor_attention` takes one of the paths
`_paths.choose_path` picks, each held to that reference by the tests:

- fused: non-causal on CUDA, both kernels in the fused Triton kernels (`_kernels.fused_linear`), features never
  stored;
- kernel: the non-causal softmax kernel on the CPU, row-blocked with its hand-written backward
  (`_kernels.blocked_linear`);
- torch: causal mode, the relu kernel on the CPU, and `torch.export`: explicit features through
  `_kernel.kernel_attention`.

Causal decoding carries the FAVOR+ state token to token (`decode_step`, shared with linear attention through
`KernelStepMixin`).

Letter legend: b - batch, h - heads, n - query length, m - key length, d - head dim, r - random features.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase
from ._features import PROJECTIONS, Feature, random_projection
from ._kernel import KernelStepMixin, kernel_attention, kernel_attention_reference
from ._kernels.blocked_linear import blocked_favor_attention
from ._kernels.fused_linear import fused_kernel_attention, fused_usable
from ._paths import Path, choose_path
from ._registry import register_attention
from ._seeded import SeedStepMixin

__all__ = [
    "PerformerAttention",
    "favor_attention",
    "favor_attention_reference",
    "favor_features",
    "relu_kernel_features",
    "softmax_kernel_features",
]

KERNELS = ("softmax", "relu")


def _project(x: Tensor, projection: Tensor, normalize: bool) -> Tensor:
    """`x: [b, h, n, d]`, `projection: [r, d]` -> `w.x: [b, h, n, r]`, with x scaled by d^-1/4 if `normalize`."""
    weight = projection.to(x.dtype)
    if normalize:
        # Scaling the small [r, d] matrix instead of x: q.k then carries 1/sqrt(d), as in softmax attention.
        weight = weight * x.shape[-1] ** -0.25
    return torch.matmul(x, weight.t())


def softmax_kernel_features(
    x: Tensor,
    projection: Tensor,
    *,
    is_query: bool,
    mask: Tensor | None = None,
    causal: bool = False,
    normalize: bool = True,
    eps: float = 1e-4,
) -> tuple[Tensor, Tensor]:
    """FAVOR+ positive random features of the softmax kernel, stabilised.

    x: `[b, h, n, d]`; projection: `[r, d]` (rows w); mask: `[b, n]` bool, True = keep, keys only.
    Returns `phi: [b, h, n, r]` and `log_offset`: `[b, h, n]` for queries and for causal keys, `[b, h, 1]` for
    non-causal keys, such that the exact features are

        exp(w.x - |x|^2 / 2) / sqrt(r) = exp(log_offset) * (phi - eps / sqrt(r))

    i.e. `phi = (exp(w.x - |x|^2/2 - log_offset) + eps) / sqrt(r)` (x scaled by d^-1/4 first if `normalize`).
    As in the paper's code (google-research/performer) and performer-pytorch, the offset is a max of w.x alone,
    so exp(-|x|^2 / 2) stays inside: eps weighs more for rows of large norm, which shrinks their estimate
    towards uniform attention, closer to exact attention on post-LayerNorm tokens than an offset that includes
    |x|^2 / 2. `log_offset` carries no gradient.

    The offset keeps the exponent <= -|x|^2 / 2 <= 0, so no dtype overflows (features run in float32: they
    underflow only past |x|^2 / 2 > 87, where the estimate is eps-uniform, as the reference's), and never mixes
    samples or future positions:
    queries: the max over features of each row (it cancels between numerator and denominator, but for eps);
    keys, non-causal: one scalar per (sample, head), the max over features and over kept keys only;
    keys, causal: the max over features of each key, to be passed to `kernel_attention` as `key_log_scale`.
    Padded keys get zero features and, when causal, offset -inf (they cannot raise a running max).
    """
    if is_query and mask is not None:
        raise ValueError("a key padding mask applies to keys; pass mask=None for queries")
    nb_features = projection.shape[0]
    scale = x.shape[-1] ** -0.5 if normalize else 1.0
    dash = _project(x, projection, normalize)
    with torch.no_grad():
        row_max = dash.amax(-1, keepdim=True)
    # Dividing by sqrt(r) inside the exponent costs nothing: it joins the offset.
    log_ratio = 0.5 * math.log(nb_features)
    if is_query or causal:
        log_offset = row_max
    else:
        with torch.no_grad():
            kept_max = row_max if mask is None else row_max.masked_fill(~mask[:, None, :, None], float("-inf"))
            log_offset = kept_max.amax(-2, keepdim=True)
    shift = log_offset + log_ratio
    if mask is not None:
        # Padded keys: shift +inf, so exp gives exactly zero.
        shift = shift.expand_as(row_max).masked_fill(~mask[:, None, :, None], float("inf"))
    # |x|^2 / 2 of the normalised data, with its gradient.
    exponent = dash.sub_(x.square().sum(-1, keepdim=True) * (scale / 2) + shift)
    floor = eps / math.sqrt(nb_features)
    if mask is not None:
        # The eps floor only for kept keys: padded keys' features stay exactly zero.
        floor = mask[:, None, :, None].to(dash.dtype) * floor
        if causal:
            log_offset = log_offset.masked_fill(~mask[:, None, :, None], float("-inf"))
    phi = torch.exp(exponent) + floor
    return phi, log_offset.squeeze(-1)


def relu_kernel_features(
    x: Tensor,
    projection: Tensor,
    *,
    mask: Tensor | None = None,
    normalize: bool = True,
    eps: float = 1e-3,
) -> Tensor:
    """Generalized-attention features `relu(w.x) / sqrt(r) + eps` (Performer's ReLU kernel).

    x: `[b, h, n, d]`; projection: `[r, d]`; mask: `[b, n]` bool, True = keep (padded keys get zero features)
    -> `[b, h, n, r]`. Non-negative and bounded by |w||x|, so no stabiliser is needed.
    """
    phi = F.relu(_project(x, projection, normalize)) * projection.shape[0] ** -0.5 + eps
    if mask is not None:
        phi = phi * mask[:, None, :, None].to(phi.dtype)
    return phi


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


def favor_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    projection: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    kernel: Literal["softmax", "relu"] = "softmax",
    eps: float = 1e-4,
) -> Tensor:
    """FAVOR+ as the paper's equation reads, the `[n, m]` weights `phi(q_i).phi(k_j)` formed (O(n m) memory): the
    oracle every fast path is tested against.

    q, k, v: `[b, h, n, d]`; projection: `[r, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`
    in v's dtype, in float32 at least with autocast off. Causally each key carries its own stabiliser, which
    `kernel_attention_reference` folds back in (`favor_features`).
    """
    out_dtype = v.dtype
    with torch.autocast(v.device.type, enabled=False):
        dtype = torch.promote_types(v.dtype, torch.float32)
        q, k, v, projection = q.to(dtype), k.to(dtype), v.to(dtype), projection.to(dtype)
        phi_q, phi_k, key_log_scale = favor_features(q, k, projection, mask, is_causal, kernel=kernel, eps=eps)
        out = kernel_attention_reference(phi_q, phi_k, v, key_log_scale=key_log_scale, is_causal=is_causal)
    return out.to(out_dtype)


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
    """FAVOR+ attention on the path `_paths.choose_path` picks (see the module docstring); `reference=True` takes
    `favor_attention_reference`.

    q, k, v: `[b, h, n, d]`; projection: `[r, d]` random features (rows w); mask: `[b, n]` bool key padding
    mask, True = keep -> `[b, h, n, d]` in v's dtype. q and k are scaled by d^-1/4 inside the feature map, so
    `phi(q).phi(k)` estimates `exp(q.k / sqrt(d))`. `eps` is the floor added to every feature (softmax: after
    stabilisation; relu: the generalized-attention kernel epsilon). Causal: chunks of `chunk_size`.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r} is not one of {', '.join(map(repr, KERNELS))}")
    path = choose_path(
        q,
        reference=reference,
        fused=lambda: not is_causal and fused_usable(q, k, v, projection.shape[0]),
        # the blocked kernel walks keys and queries in the same row blocks: equal lengths only
        kernel=lambda: kernel == "softmax" and not is_causal and k.shape[-2] == q.shape[-2],
    )
    if path is Path.REFERENCE:
        return favor_attention_reference(q, k, v, projection, mask, is_causal, kernel=kernel, eps=eps)
    if path is Path.FUSED:
        weight = projection.t()[None]  # [1, d, r]: a view, so backward keeps no copy of the buffer
        feature = Feature.FAVOR if kernel == "softmax" else Feature.RELU
        return fused_kernel_attention(q, k, v, mask, feature, weight, weight, eps)
    if path is Path.KERNEL:
        return blocked_favor_attention(q, k, v, projection, mask, eps)
    out_dtype = v.dtype
    # Feature maps are exponentials of dot products: in bf16 / fp16 they overflow or lose the normaliser, so
    # features and contractions run in float32 with autocast off, and only the output returns to v's dtype.
    with torch.autocast(v.device.type, enabled=False):
        dtype = torch.promote_types(v.dtype, torch.float32)
        q, k, v, projection = q.to(dtype), k.to(dtype), v.to(dtype), projection.to(dtype)
        phi_q, phi_k, key_log_scale = favor_features(q, k, projection, mask, is_causal, kernel=kernel, eps=eps)
        out = kernel_attention(phi_q, phi_k, v, key_log_scale=key_log_scale, is_causal=is_causal, chunk_size=chunk_size)
    return out.to(out_dtype)


@register_attention("performer")
class PerformerAttention(SeedStepMixin, KernelStepMixin, AttentionBase):
    """FAVOR+ multi-head attention with timm's projections; causal mode by chunked prefix sums.

    Paths as `favor_attention`'s; `reference=True` computes every mode through `favor_attention_reference`.

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
