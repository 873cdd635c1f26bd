"""Launching the fused kernels: one call's forward (the state, then the output) and backward (queries, then keys),
each retried at a smaller plan when the GPU refuses a kernel for its shared memory (`fitted`).

Letter legend: b - batch, h - heads, n - length, d - head dim, e - value dim, r - features.
"""

from __future__ import annotations

import torch
from torch import Tensor
from triton.runtime.errors import OutOfResources

from ..._features import Feature
from .kernels import (
    _key_backward_kernel,
    _key_map_grad_kernel,
    _key_max_kernel,
    _output_kernel,
    _query_backward_kernel,
    _query_state_grad_kernel,
    _state_kernel,
)
from .plan import SHRINK_LEVELS, Plan, plan_for

__all__ = [
    "FITTED",
    "OutOfResources",
    "backward",
    "backward_with",
    "features_of",
    "forward",
    "forward_with",
    "heads",
    "key_state",
]


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


def features_of(proj: Tensor | None, like: Tensor, kind: int) -> int:
    """r: the head dim for ELU; the projection's width, twice it for HEDGEHOG ([W, -W])."""
    if proj is None:
        return like.shape[-1]
    return proj.shape[-1] * (2 if kind == Feature.HEDGEHOG else 1)


def key_state(k, v, keep, proj_k, plan: Plan, key_max: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
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
FITTED: dict[tuple, int] = {}


def fitted(run, q: Tensor, v: Tensor, features: int, kind: int, eps: float):
    """`run(plan)` with the first plan, from the level that fitted last time, whose kernels the GPU can launch:
    triton refuses a kernel that asks for more shared memory than the device has before it runs, and the
    buffers `run` fills are its own, so a refused attempt leaves nothing behind."""
    key = (q.device, kind, features, q.shape[-1], v.shape[-1], q.dtype)
    level = FITTED.get(key, 0)
    while True:
        try:
            result = run(plan_for(q, v, features, kind, eps, level))
        except OutOfResources as error:
            if level == SHRINK_LEVELS:
                raise RuntimeError(
                    f"the fused linear-attention kernels do not fit this GPU's shared memory even at their smallest "
                    f"({error}); ZOO_FUSED=0 runs the torch path"
                ) from error
            level += 1
            continue
        FITTED[key] = level
        return result


def forward(q, k, v, keep, proj_q, proj_k, kind: int, eps: float):
    """The op's forward, at the first plan the GPU launches: q, k, v `[b, h, n, d]`, keep `[b, n]` bool or None,
    proj_q, proj_k `[hp, d, r]` or None -> out `[b, h, n, e]`, state `[b h, r, e]`, key sum `[b h, r]`, key offset
    `[b h]`."""

    def run(plan: Plan):
        return forward_with(plan, q, k, v, keep, proj_q, proj_k, kind)

    return fitted(run, q, v, features_of(proj_q, q, kind), kind, eps)


def forward_with(plan: Plan, q, k, v, keep, proj_q, proj_k, kind: int):
    b, h, n, d = q.shape
    state, total, key_max = key_state(k, v, keep, proj_k, plan)
    out = q.new_empty(b, n, h, plan.e).permute(0, 2, 1, 3)  # [b, h, n, e] laid out as [b, n, h, e] for proj
    _output_kernel[(b * h, plan.n_tiles)](
        q, *_strides(q), *_proj_args(proj_q, q), state, total, out, *_strides(out), *plan.constants(),
        *plan.scalars(), CHUNKS=plan.chunks, KIND=kind, **plan.blocks(),
    )  # fmt: skip
    return out, state, total, key_max


def heads(packed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`[b, n, 3, h, d]` -> its q, k and v parts as `[b, h, n, d]` views."""
    return tuple(packed[:, :, i].permute(0, 2, 1, 3) for i in range(3))


def backward(grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind: int, eps: float):
    """The op's backward, at the first plan the GPU launches: the forward's tensors (state and key sum None where
    `op.saves_state` dropped them) -> the qkv gradient `[b, n, 3, h, d]` and the maps' `[h, d, f]` (HEDGEHOG; else
    empty)."""

    def run(plan: Plan):
        return backward_with(plan, grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind)

    return fitted(run, q, v, features_of(proj_q, q, kind), kind, eps)


def backward_with(plan: Plan, grad_out, q, k, v, keep, proj_q, proj_k, out, state, total, key_max, kind: int):
    b, h, n, d = q.shape
    if state is None:
        state, total, _ = key_state(k, v, keep, proj_k, plan, key_max)
    # one buffer laid out like the qkv projection's output: `SplitHeads` hands it on as qkv's gradient, no copy
    grad_qkv = q.new_empty(b, n, 3, h, d)
    grad_q, grad_k, grad_v = heads(grad_qkv)
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
