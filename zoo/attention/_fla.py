"""Causal kernel attention on fla-core's Triton kernels, the fast path of `kernel_attention(is_causal=True)` on CUDA.

fla (flash-linear-attention, https://github.com/fla-org/flash-linear-attention; the `fla-core` package, MIT, the
`gpu` extra) computes causal linear attention in chunks after "Gated Linear Attention Transformers with
Hardware-Efficient Training" (Yang et al. 2023), https://arxiv.org/abs/2312.06635. Its
`fla.ops.linear_attn.chunk_linear_attn(q, k, v, scale=1.0, normalize=False)` (`chunk_simple_gla` with no gate) is
the unnormalised causal sum `o_i = sum_{j <= i} (q_i . k_j) v_j`, for any feature width r and value width d, in
fp32 on fp32 inputs (its matmuls in TF32), with its own backward. The normaliser `phi_q_i . sum_{j <= i} phi_k_j`
is computed here, in torch, and clamped like the torch path (`clamp_min(eps)`): fla's own `normalize=True` adds
1e-10 instead and ignores `eps`. Padded keys have zero features, so they add to neither sum, and a query with no
kept key gets zeros, as on the torch path.

When it applies (`use_fla`): every tensor on CUDA, float32 compute (a float64 run stays in torch), no key
log-scale (the caller's check: Performer's causal softmax kernel carries one), at most 65535 batch x heads (fla's
second grid axis), and fla importable. TF32 rounds the matmul inputs to 10 mantissa bits, below a bf16 / fp16
output's own rounding but not a float32 output's, so by default only 16-bit values take the path. `ZOO_FLA`
chooses: unset (16-bit values only), `1` (float32 values too, TF32 accepted), `0` (never: the torch path, the
reference the tests compare with). fla picks its own chunk length (64); `chunk_size` only sizes the torch path.

Letter legend: b - batch, h - heads, n - length, r - features, d - value dim.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
from einops import rearrange
from torch import Tensor

__all__ = ["FLA_ENV", "fla_causal_kernel_attention", "use_fla"]

FLA_ENV = "ZOO_FLA"
_MODES = {"": "16-bit values only", "1": "float32 values too, with TF32 matmuls", "0": "never"}
# CUDA's limit on a grid's second axis, which fla's output kernels give to batch x heads.
_MAX_BATCH_HEADS = 65535


@functools.cache
def _load() -> Callable | None:
    """fla's `chunk_linear_attn`, or None when fla (or triton, or one of its own imports) is not installed."""
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except ImportError:
        return None
    return chunk_linear_attn


def _mode() -> str:
    value = os.environ.get(FLA_ENV, "")
    if value not in _MODES:
        allowed = ", ".join(f"{key or 'unset'} ({meaning})" for key, meaning in _MODES.items())
        raise ValueError(f"{FLA_ENV}={value!r} is not one of: {allowed}")
    return value


def _on_cuda(*tensors: Tensor) -> bool:
    return all(t.is_cuda for t in tensors)


def use_fla(phi_q: Tensor, phi_k: Tensor, v: Tensor) -> bool:
    """Whether causal kernel attention without a key log-scale on these tensors runs through fla.

    phi_q, phi_k: `[b, h, n, r]`, v: `[b, h, n, d]`, in the dtypes the caller received (v's decides, see the module
    docstring). fla is imported on the first call that gets this far on CUDA, never for CPU tensors.
    """
    mode = _mode()
    if mode == "0" or not _on_cuda(phi_q, phi_k, v):
        return False
    if torch.promote_types(torch.promote_types(phi_q.dtype, v.dtype), torch.float32) != torch.float32:
        return False
    if v.dtype == torch.float32 and mode != "1":
        return False
    b, h, n, _ = phi_q.shape
    if n == 0 or b * h > _MAX_BATCH_HEADS:
        return False
    return _load() is not None


def fla_causal_kernel_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float) -> Tensor:
    """`out_i = sum_{j <= i} (phi_q_i . phi_k_j) v_j / max(sum_{j <= i} phi_q_i . phi_k_j, eps)` through fla.

    phi_q, phi_k: `[b, h, n, r]` (non-negative; padded keys zero), v: `[b, h, n, d]`, all float32 on CUDA (the
    caller casts, with autocast off) -> `[b, h, n, d]` float32. Check `use_fla` first.
    """
    chunk_linear_attn = _load()
    assert chunk_linear_attn is not None, "fla_causal_kernel_attention called without fla: check use_fla first"
    # fla's layout is [b, n, h, x]; its input guard makes the views contiguous.
    q, k, values = (rearrange(t, "b h n x -> b n h x") for t in (phi_q, phi_k, v))
    # scale=1.0: fla's default scales the scores by r^-1/2.
    num, _ = chunk_linear_attn(q, k, values, scale=1.0, normalize=False)
    num = rearrange(num, "b n h d -> b h n d")
    den = torch.einsum("bhnr,bhnr->bhn", phi_q, phi_k.cumsum(-2))[..., None]
    return num / den.clamp_min(eps)
