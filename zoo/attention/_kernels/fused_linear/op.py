"""The fused op as torch sees it: a `torch.library.custom_op` with its fake kernel and autograd (one opaque node
under `torch.compile` and `torch.export`), an eager autograd function around the same bodies, and the entry point
the variants call (`fused_usable`, then `fused_kernel_attention`).

Letter legend: b - batch, h - heads, n - length, d - head dim, e - value dim, r - features.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from ..._features import Feature
from .plan import pow2

try:
    import triton
except ImportError:  # pragma: no cover - triton ships with torch's Linux wheels
    triton = None
if triton is not None:
    from . import launch
    from .interpreter import INTERPRETED
else:  # pragma: no cover
    launch, INTERPRETED = None, False

__all__ = ["FUSED_ENV", "force_fused", "fused_kernel_attention", "fused_usable", "saves_state"]

FUSED_ENV = "ZOO_FUSED"
# Registers hold the `[r, e]` state tile and a `[w, r]` feature tile: past this product the fused path is not taken.
_MAX_STATE_TILE = 256 * 128
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
        and os.environ.get(FUSED_ENV, "1") != "0"
        and q.shape == k.shape == v.shape
        and pow2(features) * pow2(v.shape[-1]) <= _MAX_STATE_TILE
    )


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
    """The forward through `launch.forward`: the output `[b, h, n, e]`, the state `[b h, r, e]`, the key sum
    `[b h, r]` and FAVOR's key offsets `[b h]`."""
    return launch.forward(q, k, v, keep, proj_q, proj_k, kind, eps)


@_fused_op.register_fake
def _(q, k, v, keep, proj_q, proj_k, kind, eps):
    b, h, n, d = q.shape
    features = launch.features_of(proj_q, q, kind)
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
    return launch.backward(grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind, eps)


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
    """The op's inputs' gradients from the tensors `_saved` kept, through `backward` (`launch.backward` itself, or the
    custom op around it)."""
    q, k, v, keep, proj_q, proj_k, out, state, total, key_max = ctx.saved_tensors
    grad_qkv, grad_proj_q, grad_proj_k = backward(
        grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, ctx.kind, ctx.eps
    )
    learned = ctx.kind == Feature.HEDGEHOG
    grad_maps = (grad_proj_q.to(proj_q.dtype), grad_proj_k.to(proj_k.dtype)) if learned else (None, None)
    return (*launch.heads(grad_qkv), None, *grad_maps, None, None)


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
    dispatcher's custom-op and autograd wrappers cost about as much host time as the rest of the layer, which a small
    batch on a GPU waits for. Under compile the
    custom op stays, one opaque node (Dynamo cannot trace an autograd function that takes one tensor twice, as
    performer's projections are)."""

    @staticmethod
    def forward(ctx, q, k, v, keep, proj_q, proj_k, kind: int, eps: float):
        out, state, total, key_max = launch.forward(q, k, v, keep, proj_q, proj_k, kind, eps)
        _saved(ctx, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind, eps)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return _input_grads(ctx, grad_out, launch.backward)


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
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "the fused kernels run on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 before zoo "
            "is imported"
        )
    keep = None if mask is None else mask.to(torch.bool)
    if torch.compiler.is_compiling():
        out, *_ = _fused_op(q, k, v, keep, proj_q, proj_k, int(feature), float(eps))
        return out
    return _EagerFusedAttention.apply(q, k, v, keep, proj_q, proj_k, int(feature), float(eps))
