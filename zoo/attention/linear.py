"""Linear attention: "Transformers are RNNs" (Katharopoulos et al. 2020), https://arxiv.org/abs/2006.16236

Softmax's `exp(q.k)` replaced by the dot product of positive features `phi(x) = elu(x) + 1`, so attention is
`out_i = phi(q_i)^T S / phi(q_i)^T z` with `S = sum_j phi(k_j) v_j^T` and `z = sum_j phi(k_j)`: linear in the
sequence length. Causally, S and z are prefix sums, computed in chunks (`_kernel.kernel_attention`: memory
`[n, w]` and `[n / w, d, d]`, never `[n, d, d]`); decoding carries `(S, z)` from token to token in O(d^2)
(`decode_step`, from `KernelStepMixin`), which is the paper's RNN view.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from ._blocks import check_int
from ._common import AttentionBase, masked_fill_keys
from ._features import elu_feature_map
from ._kernel import KernelStepMixin, kernel_attention
from ._registry import register_attention

__all__ = ["LinearAttention", "linear_attention"]


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor] = None,
    is_causal: bool = False,
    *,
    chunk_size: int = 128,
) -> Tensor:
    """Attention with weights `phi(q_i).phi(k_j)`, normalised over the keys, `phi = elu + 1`.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]` in v's dtype.
    Padded keys get zero features, so they add nothing to S or z. Causal: chunks of `chunk_size` (any length
    works; the last chunk is padded internally). Accumulated in float32 at least.
    """
    phi_q = elu_feature_map(q)
    phi_k = masked_fill_keys(elu_feature_map(k), mask)
    return kernel_attention(phi_q, phi_k, v, is_causal=is_causal, chunk_size=chunk_size)


@register_attention("linear")
class LinearAttention(KernelStepMixin, AttentionBase):
    """Linear attention (elu + 1 features) with timm's projections; causal mode and recurrent decoding.

    No parameters or buffers beyond timm's, so weights copy to and from every other variant. No 1/sqrt(d)
    scale: the feature map is applied to q and k as the paper does.
    """

    supports_causal = True

    def __init__(self, dim: int, num_heads: int = 8, *, chunk_size: int = 128, **timm_args) -> None:
        check_int("chunk_size", chunk_size, 1)
        super().__init__(dim, num_heads, **timm_args)
        self.chunk_size = chunk_size
        # The recurrent state has one feature per head dim: phi is elementwise.
        self.state_features = self.head_dim

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool) -> Tensor:
        return linear_attention(q, k, v, mask, is_causal, chunk_size=self.chunk_size)

    def step_features(self, q: Tensor, k: Tensor, keep: Optional[Tensor]) -> tuple[Tensor, Tensor, None]:
        return elu_feature_map(q), masked_fill_keys(elu_feature_map(k), keep), None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, chunk_size={self.chunk_size}"
