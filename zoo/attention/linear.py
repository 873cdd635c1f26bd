"""Linear attention: "Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention" (Katharopoulos et
al. 2020), https://arxiv.org/abs/2006.16236

Softmax's `exp(q.k)` is replaced by the dot product of positive features `phi(x) = elu(x) + 1`, so attention is

    out_i = phi(q_i)^T S / phi(q_i)^T z,    S = sum_j phi(k_j) v_j^T,    z = sum_j phi(k_j)

linear in the sequence length (the sums run over j <= i when causal). `linear_attention_reference` computes it
as written; the module's forward takes one of the paths `_paths.choose_path` picks, each held to that reference
by the tests:

- fused: non-causal on CUDA, the fused Triton kernels (`_kernels.fused_linear`), features never stored;
- kernel: non-causal on the CPU, the row-blocked kernel with its hand-written backward (`_kernels.blocked_linear`);
- torch: causal, or under `torch.export`: the features through `_kernel.kernel_attention`, causally in chunks
  (memory `[n, w]` and `[n / w, d, d]`, never `[n, d, d]`).

Decoding carries `(S, z)` from token to token in O(d^2) (`decode_step`, from `KernelStepMixin`): the paper's RNN
view.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase, masked_fill_keys
from ._features import Feature
from ._kernel import DENOMINATOR_EPS, KernelStepMixin, kernel_attention
from ._kernels.blocked_linear import blocked_linear_attention
from ._kernels.fused_linear import fused_kernel_attention, fused_usable
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = ["LinearAttention", "elu_feature_map", "linear_attention", "linear_attention_reference"]


def elu_feature_map(x: Tensor) -> Tensor:
    """The paper's features `phi(x) = elu(x) + 1`, positive; any shape, elementwise."""
    return F.elu(x) + 1


def linear_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False
) -> Tensor:
    """Linear attention as the paper's equation reads, the `[n, m]` weights `phi(q_i).phi(k_j)` formed (O(n m)
    memory): the oracle every fast path is tested against.

    q, k: `[b, h, n, d]` and `[b, h, m, d]`, v: `[b, h, m, d]`; mask: `[b, m]` bool key padding mask, True = keep
    (padded keys get zero features) -> `[b, h, n, d]` in v's dtype, computed in float32 at least with autocast off.
    A query that sees no kept key gets zeros.
    """
    dtype = torch.promote_types(torch.promote_types(q.dtype, v.dtype), torch.float32)
    with torch.autocast(v.device.type, enabled=False):
        phi_q = elu_feature_map(q.to(dtype))
        phi_k = masked_fill_keys(elu_feature_map(k.to(dtype)), mask)
        weights = phi_q @ phi_k.transpose(-2, -1)  # [b, h, n, m]
        if is_causal:
            weights = weights.tril()
        out = (weights @ v.to(dtype)) / weights.sum(-1, keepdim=True).clamp_min(DENOMINATOR_EPS)
    return out.to(v.dtype)


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
    """Attention with weights `phi(q_i).phi(k_j)`, normalised over the keys, `phi = elu + 1`, on the path
    `_paths.choose_path` picks (see the module docstring); `reference=True` takes `linear_attention_reference`.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]` in v's dtype.
    Padded keys get zero features, so they add nothing to S or z. Causal: chunks of `chunk_size` (any length
    works; the last chunk is padded internally). Accumulated in float32 at least.
    """
    path = choose_path(
        q,
        reference=reference,
        fused=lambda: not is_causal and fused_usable(q, k, v, q.shape[-1]),
        # the blocked kernel walks keys and queries in the same row blocks: equal lengths only
        kernel=lambda: not is_causal and k.shape[-2] == q.shape[-2],
    )
    if path is Path.REFERENCE:
        return linear_attention_reference(q, k, v, mask, is_causal)
    if path is Path.FUSED:
        return fused_kernel_attention(q, k, v, mask, Feature.ELU)
    if path is Path.KERNEL:
        return blocked_linear_attention(q, k, v, mask)
    phi_q = elu_feature_map(q)
    phi_k = masked_fill_keys(elu_feature_map(k), mask)
    return kernel_attention(phi_q, phi_k, v, is_causal=is_causal, chunk_size=chunk_size)


@register_attention("linear")
class LinearAttention(KernelStepMixin, AttentionBase):
    """Linear attention (elu + 1 features) with timm's projections; causal mode and recurrent decoding.

    No parameters or buffers beyond timm's, so weights copy to and from every other variant. No 1/sqrt(d)
    scale: the feature map is applied to q and k as the paper does. `reference=True` computes every mode through
    `linear_attention_reference`.
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
