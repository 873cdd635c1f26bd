"""Linear attention: "Transformers are RNNs" (Katharopoulos et al. 2020), https://arxiv.org/abs/2006.16236

Softmax's `exp(q.k)` replaced by the dot product of positive features `phi(x) = elu(x) + 1`, so attention is
`out_i = phi(q_i)^T S / phi(q_i)^T z` with `S = sum_j phi(k_j) v_j^T` and `z = sum_j phi(k_j)`: linear in the
sequence length. Causally, S and z are prefix sums, computed in chunks (`_kernel.kernel_attention`: memory
`[n, w]` and `[n / w, d, d]`, never `[n, d, d]`); decoding carries `(S, z)` from token to token in O(d^2)
(`decode_step`, from `KernelStepMixin`), which is the paper's RNN view. Non-causal, a blocked kernel with a
hand-written backward (`_BlockedLinear`) is the CPU's fast path and fused Triton kernels (`_fused_linear`) the
GPU's; `reference=True` takes `kernel_attention` instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase, masked_fill_keys
from ._features import elu_feature_map
from ._fused_linear import Feature, fused_kernel_attention, fused_usable
from ._kernel import KernelStepMixin, kernel_attention
from ._registry import register_attention
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

__all__ = ["LinearAttention", "linear_attention"]


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    chunk_size: int = 128,
    reference: bool = False,
) -> Tensor:
    """Attention with weights `phi(q_i).phi(k_j)`, normalised over the keys, `phi = elu + 1`.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]` in v's dtype.
    Padded keys get zero features, so they add nothing to S or z. Causal: chunks of `chunk_size` (any length
    works; the last chunk is padded internally). Accumulated in float32 at least.

    Non-causal: on CUDA the fused Triton kernels (`_fused_linear`); elsewhere `_BlockedLinear`, in row blocks with
    the features recomputed in backward (no `[n, d]` intermediate is ever stored); `reference=True`, causally, and
    under `torch.export` (whose tracing refuses the blocked kernel's `out=` workspaces) through `kernel_attention`.
    """
    if not reference and not is_causal and fused_usable(q, k, v, q.shape[-1]):
        return fused_kernel_attention(q, k, v, mask, Feature.ELU)
    # the blocked kernel walks keys and queries in the same row blocks: equal lengths only
    if not reference and not is_causal and k.shape[-2] == q.shape[-2] and not exporting():
        out_dtype = v.dtype
        with torch.autocast(v.device.type, enabled=False):
            dtype = torch.promote_types(torch.promote_types(q.dtype, v.dtype), torch.float32)
            return _BlockedLinear.apply(q.to(dtype), k.to(dtype), v.to(dtype), mask).to(out_dtype)
    phi_q = elu_feature_map(q)
    phi_k = masked_fill_keys(elu_feature_map(k), mask)
    return kernel_attention(phi_q, phi_k, v, is_causal=is_causal, chunk_size=chunk_size)


# Rows per block in `_BlockedLinear`: 4 MiB of `[b, h, w, d]` features, in workspaces reused by every block (a
# fresh buffer the size of q costs page faults as dear as the arithmetic on it).
_BLOCK_BYTES = 2**22


def _features(x: Tensor, workspace: Workspace, scratch: Workspace, keep: Tensor | None = None) -> Tensor:
    """`elu(x) + 1` of a block `x: [b, h, w, d]` into `workspace` (contiguous), using `scratch`; zero where `keep`
    `[b, 1, w]` is False."""
    # elu(x) + 1 = exp(min(x, 0)) + max(x, 0): vectorised passes, about 7x faster on CPU than aten's elu. x (a
    # strided view of qkv) is read from memory once; the other passes run on the cached copy.
    phi = workspace.view(*x.shape).copy_(x)
    below = torch.clamp_max(phi, 0.0, out=scratch.view(*x.shape)).exp_()
    phi.clamp_min_(0.0).add_(below)
    if keep is not None:
        phi.mul_(keep[..., None])
    return phi


def _workspaces(q: Tensor, block: int, value_dim: int) -> tuple[Workspace, Workspace]:
    """The features' workspace (`[b, h, block, r]`) and the values' (`[b, h, block, d + 1]`), which also serves
    `_features` as scratch before each block's values are written."""
    b, h, _, r = q.shape
    return Workspace(q, b * h * block * r), Workspace(q, b * h * block * max(r, value_dim + 1))


class _BlockedLinear(torch.autograd.Function):
    """Non-causal linear attention in row blocks, equal to `kernel_attention` on `elu + 1` features.

    Forward: keys block by block into the state `[S | z]^T = [v | 1]^T phi_k: [b h, e, d]` (e = d + 1; kept as
    `[e, d]`, the layout whose contractions ran fastest on CPU), then queries block by block, the output
    written straight into a `[b, n, h, d]` buffer, so the head merge before `proj` is a view. Backward
    recomputes the features (elu' = min(phi, 1)) and writes the three gradients into one `[b, n, 3, h, d]`
    buffer, which `SplitHeads` hands on as the qkv gradient. Saved: q, k, v, the state, output and normaliser.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None):
        b, h, n, r = q.shape
        d = v.shape[-1]
        block = rows_per_block(n, b * h * max(r, d + 1) * q.element_size(), _BLOCK_BYTES, q.device)
        features_ws, values_ws = _workspaces(q, block, d)
        keep = None if mask is None else mask[:, None, :]
        state = q.new_zeros(b * h, d + 1, r)
        for rows in row_blocks(n, block):
            phi = _features(k[:, :, rows], features_ws, values_ws, keep_in_rows(keep, rows)).flatten(0, 1)
            values = with_ones_into(v[:, :, rows], values_ws).flatten(0, 1)
            state.baddbmm_(values.transpose(1, 2), phi)
        out = unwritten(q, (b, n, h, d)).permute(0, 2, 1, 3)  # [b, h, n, d] laid out as [b, n, h, d] for proj
        den = unwritten(q, (b, h, n))
        for rows in row_blocks(n, block):
            w = num_rows(rows)
            phi = _features(q[:, :, rows], features_ws, values_ws).flatten(0, 1)
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
            phi = _features(q[:, :, rows], features_ws, values_ws).flatten(0, 1)
            grad_numden = normalise_backward_into(grad_out[:, :, rows], out[:, :, rows], den[:, :, rows], values_ws)
            grad_state.baddbmm_(grad_numden.transpose(1, 2), phi)
            # Through phi = elu + 1: its derivative is 1 above zero and exp(x) = phi below, i.e. min(phi, 1).
            grad_phi = torch.bmm(grad_numden, state, out=grad_features_ws.view(b * h, w, r))
            grad_q[:, :, rows] = grad_phi.mul_(phi.clamp_max_(1.0)).view(b, h, w, r)
        grad_state_v = grad_state[:, :d].transpose(1, 2)
        for rows in row_blocks(n, block):
            w = num_rows(rows)
            # Padded keys have phi = 0, so min(phi, 1) = 0 gives them no gradient either.
            phi = _features(k[:, :, rows], features_ws, values_ws, keep_in_rows(keep, rows)).flatten(0, 1)
            grad_v[:, :, rows] = torch.bmm(phi, grad_state_v, out=grad_features_ws.view(b * h, w, d)).view(b, h, w, d)
            values = with_ones_into(v[:, :, rows], values_ws).flatten(0, 1)
            grad_phi = torch.bmm(values, grad_state, out=grad_features_ws.view(b * h, w, r))
            grad_k[:, :, rows] = grad_phi.mul_(phi.clamp_max_(1.0)).view(b, h, w, r)
        return grad_q, grad_k, grad_v, None


@register_attention("linear")
class LinearAttention(KernelStepMixin, AttentionBase):
    """Linear attention (elu + 1 features) with timm's projections; causal mode and recurrent decoding.

    No parameters or buffers beyond timm's, so weights copy to and from every other variant. No 1/sqrt(d)
    scale: the feature map is applied to q and k as the paper does. `reference=True` computes the non-causal mode
    through `kernel_attention` instead of the blocked kernel.
    """

    supports_causal = True
    test_options: ClassVar[dict] = {"chunk_size": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        chunk_size: int = 128,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        check_int("chunk_size", chunk_size, 1)
        super().__init__(dim, num_heads, **timm_args)
        self.chunk_size = chunk_size
        self.reference = check_bool("reference", reference)
        # The recurrent state has one feature per head dim: phi is elementwise.
        self.state_features = self.head_dim

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        return linear_attention(q, k, v, mask, is_causal, chunk_size=self.chunk_size, reference=self.reference)

    def step_features(self, q: Tensor, k: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, None]:
        return elu_feature_map(q), masked_fill_keys(elu_feature_map(k), keep), None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, chunk_size={self.chunk_size}, reference={self.reference}"
