"""Hedgehog: "The Hedgehog & the Porcupine: Expressive Linear Attentions with Softmax Mimicry" (Zhang et al. 2024),
https://arxiv.org/abs/2402.04347, in the form "LoLCATs: On Low-Rank Linearizing of Large Language Models" (Zhang et
al. 2024), https://arxiv.org/abs/2410.10254, uses to convert pretrained softmax models.

Linear attention whose feature map is learned to mimic softmax: per head, q and k each go through their own map W
(head dim d -> f features, the identity when f = d) and

    phi(x) = [softmax(W x), softmax(-W x)]     (softmax over the f features: 2 f features in [0, 1])

Softmax features are bounded, so no stabiliser is needed, and the prefix sums run in float32 (`kernel_attention`).
With `window > 0` the keys within `window` positions of the query (behind it, when causal: the same band as
`local`; LoLCATs' 64-token causal window is `window=63`) get exact softmax-like weights and the other keys
linear-attention weights, in one normalisation (LoLCATs' sliding-window mixture):

    out_i = (g_h sum_{j in band} e_ij v_j + sum_{j outside} phi(q_i).phi(k_j) v_j) / (the same with v_j = 1)
    e_ij = exp(q_i.k_j / sqrt(d) - M_i),   M_i = max over the band of q_i.k_j / sqrt(d)

with g_h = sigmoid(a learnable factor per head), 1/2 at initialisation. The band is computed in blocks (memory
O(n window)); the keys outside it causally by prefix sums over the keys shifted past the band, non-causally as
every key's linear terms (two matmuls) with the band's terms replaced in the blocked pass. No n x n tensor is
formed. A window covering the sequence is exact softmax attention.

Both maps (and the window factor) are the variant's own parameters: `zoo.convert.run.transfer_attention` trains them
alone to match a softmax teacher's attention outputs before any other weight moves.

Letter legend: b - batch, h - heads, n - query length, m - key length, d - head dim, f - features per half,
r - features (2 f), e - value dim + 1 (values with a ones column), w - block length, s - blocks in a window.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validate import check_int
from ._blocks import as_sdpa_mask, band_keep, window_layout
from ._common import AttentionBase, masked_fill_keys
from ._features import Feature
from ._kernel import DENOMINATOR_EPS, KernelStepMixin, _causal, kernel_attention
from ._kernels.fused_linear import fused_kernel_attention, fused_usable
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = [
    "HedgehogAttention",
    "WindowState",
    "hedgehog_attention",
    "hedgehog_attention_reference",
    "hedgehog_features",
    "identity_feature_map",
]


def identity_feature_map(heads: int, head_dim: int, features: int, **dd) -> Tensor:
    """`[h, d, f]` initial maps: the identity when f = d; otherwise a random semi-orthogonal map, with orthonormal
    rows when f > d (dot products kept, as by the identity) and orthonormal columns when f < d. Random, not a
    padded identity: equal initial columns would get equal gradients and stay equal."""
    if head_dim == features:
        return torch.eye(head_dim, **dd).expand(heads, head_dim, features).clone()
    weight = torch.empty(heads, head_dim, features, **dd)
    for head in weight:
        nn.init.orthogonal_(head)
    return weight


def hedgehog_features(x: Tensor, weight: Tensor, mask: Tensor | None = None) -> Tensor:
    """`phi(x) = [softmax(W x), softmax(-W x)]` per head, in float32 at least.

    x: `[b, h, n, d]`; weight: `[h, d, f]`; mask: `[b, n]` bool, True = keep (keys only: padded keys get zero
    features) -> `[b, h, n, 2 f]`, each half summing to 1.
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(x.device.type, enabled=False):
        logits = torch.einsum("bhnd,hdf->bhnf", x.to(dtype), weight.to(dtype))
        phi = torch.cat([logits.softmax(-1), logits.neg().softmax(-1)], dim=-1)
    return masked_fill_keys(phi, mask)


def hedgehog_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map_q: Tensor,
    feature_map_k: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 0,
    window_gate: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Hedgehog (with LoLCATs' window) as the module docstring's equation reads, the `[n, n]` weights formed (O(n^2)
    memory): the oracle every faster path is tested against. Arguments and result as `hedgehog_attention`'s.
    """
    phi_q, phi_k = hedgehog_features(q, feature_map_q), hedgehog_features(k, feature_map_k, mask)
    dtype, n = phi_q.dtype, q.shape[-2]
    with torch.autocast(v.device.type, enabled=False):
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        offsets = torch.arange(n, device=q.device)[:, None] - torch.arange(n, device=q.device)  # i - j, [n, n]
        seen = offsets >= 0 if is_causal else torch.ones_like(offsets, dtype=torch.bool)
        seen = seen if mask is None else seen & mask[:, None, None, :]  # [n, n] or [b, 1, n, n]
        weights = phi_q @ phi_k.transpose(-1, -2)  # [b, h, n, n]
        if window:
            band = (offsets.abs() <= window) & (offsets >= 0 if is_causal else torch.ones_like(seen))
            scores = (q @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
            scores = scores.masked_fill(~(band & seen), torch.finfo(dtype).min)
            exact = torch.exp(scores - scores.amax(-1, keepdim=True))
            if window_gate is not None:
                exact = exact * window_gate.to(dtype)[:, None, None]
            weights = torch.where(band, exact, weights)
        weights = weights.masked_fill(~seen, 0.0)
        out = (weights @ v) / weights.sum(-1, keepdim=True).clamp_min(DENOMINATOR_EPS)
    return out.to(v.dtype)


def hedgehog_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map_q: Tensor,
    feature_map_k: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 0,
    window_gate: Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 128,
) -> Tensor:
    """Hedgehog attention, optionally mixed with an exact sliding window.

    q, k, v: `[b, h, n, d]`; feature_map_q, feature_map_k: `[h, d, f]`; mask: `[b, n]` bool key padding mask,
    True = keep; window: 0 (pure linear attention) or the band half-width (|i - j| <= window, 0 <= i - j <= window
    when causal); window_gate: `[h]` weight g_h of the band's terms (None = 1); scale: of q.k in the band (default
    d^-1/2) -> `[b, h, n, d]` in v's dtype. Computed in float32 at least; a query with no kept key returns zeros.
    Paths (`_paths.choose_path`): without a window, non-causal on CUDA, the fused Triton kernels
    (`_kernels.fused_linear`), the features never stored; otherwise the torch path below.
    """
    path = choose_path(
        q, fused=lambda: window == 0 and not is_causal and fused_usable(q, k, v, 2 * feature_map_q.shape[-1])
    )
    if path is Path.FUSED:
        return fused_kernel_attention(q, k, v, mask, Feature.HEDGEHOG, feature_map_q, feature_map_k)
    phi_q = hedgehog_features(q, feature_map_q)
    phi_k = hedgehog_features(k, feature_map_k, mask)
    if window == 0:
        return kernel_attention(phi_q, phi_k, v, is_causal=is_causal, chunk_size=chunk_size)
    out_dtype = v.dtype
    dtype = torch.promote_types(phi_q.dtype, v.dtype)
    n = q.shape[-2]
    scale = scale or q.shape[-1] ** -0.5
    with torch.autocast(v.device.type, enabled=False):
        q, k = q.to(dtype), k.to(dtype)
        v1 = torch.cat([v.to(dtype), v.new_ones(v.shape[:-1] + (1,), dtype=dtype)], dim=-1)  # [b, h, n, e]
        if is_causal:
            # keys left of the band: a prefix sum over the keys shifted window + 1 positions later (exact)
            out = band_terms(q, k, v1, mask, is_causal, window, scale, window_gate)
            if window + 1 < n:
                lagged_k = F.pad(phi_k, (0, 0, window + 1, 0))[:, :, :n]
                lagged_v1 = F.pad(v1, (0, 0, window + 1, 0))[:, :, :n]
                out = out + _causal(phi_q, lagged_k, lagged_v1, None, chunk_size)
        elif window + 1 < n:
            # every key's linear term in two matmuls, the band's replaced by its exact term in the blocked pass:
            # faster on CPU than two prefix sums, left and right of the band
            out = band_terms(q, k, v1, mask, is_causal, window, scale, window_gate, (phi_q, phi_k))
            out = out + torch.matmul(phi_q, torch.matmul(phi_k.transpose(-1, -2), v1))
        else:
            out = band_terms(q, k, v1, mask, is_causal, window, scale, window_gate)
        den = out[..., -1:].clamp_min(DENOMINATOR_EPS)
        return (out[..., :-1] / den).to(out_dtype)


def band_terms(
    q: Tensor,
    k: Tensor,
    v1: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    window: int,
    scale: float,
    gate: Tensor | None = None,
    features: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The band's unnormalised numerator and normaliser `[b, h, n, e]`, computed in blocks of the window length.

    Weights `g_h exp(s_ij - M_i)` over the kept keys within `window` (`M_i` their largest score, so none exceeds
    g_h), minus `phi_q_i . phi_k_j` when `features` (phi_q `[b, h, n, r]`, phi_k `[b, h, n, r]`) are given: the
    correction that turns all keys' linear terms into the mixture. v1: `[b, h, n, e]`, values with a ones column;
    gate: `[h]` or None (= 1).
    """
    b, _, n, _ = q.shape
    # Blocks of at least 16 positions (not 64 as `local`): the band fills more of each block, faster for short
    # windows.
    layout = window_layout(n, window, is_causal, min_block=16)
    keep = layout.window_keep(layout.keep(mask, q.device))  # [b or 1, k, (s w)]
    keep = keep[:, :, None, None, :] & band_keep(layout.offsets(q.device), window, is_causal)
    keep = as_sdpa_mask(keep, b)  # [(b k), 1, w, (s w)]
    scores = torch.matmul(layout.blocks(q), layout.windows(k).transpose(-1, -2)) * scale
    # A finite fill: a query whose band holds no kept key gets peak = fill, weights exp(0) * 0 = 0, no NaN.
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    if gate is not None:
        weights = weights * gate.to(weights.dtype)[:, None, None]
    if features is not None:
        phi_q, phi_k = features
        weights = weights - torch.matmul(layout.blocks(phi_q), layout.windows(phi_k).transpose(-1, -2))
    return layout.unblock(torch.matmul(weights * keep, layout.windows(v1)), b)


class WindowState(NamedTuple):
    """Decoding state of windowed Hedgehog (float32 at least): the linear state of the keys that left the band and
    the band itself, oldest first."""

    kv: Tensor  # [b, h, r, d]: sum of phi(k_j) v_j^T over keys behind the band
    z: Tensor  # [b, h, r]: sum of phi(k_j) over them
    keys: Tensor  # [b, h, window, d]: the last `window` keys
    values: Tensor  # [b, h, window, d]
    keep: Tensor  # [b, window] bool: False for slots not filled yet and padding tokens


@register_attention("hedgehog")
class HedgehogAttention(KernelStepMixin, AttentionBase):
    """Hedgehog linear attention with learned feature maps (`feature_dim` f per half, 64 as in LoLCATs), separate
    maps for q and k; `window > 0` adds LoLCATs' exact sliding window. Causal mode and recurrent decoding.

    Own parameters: `feature_map_q`, `feature_map_k` `[h, d, f]` and, with a window, `window_factor` `[h]`; the
    timm projections copy from every other variant.
    """

    supports_causal = True
    test_options: ClassVar[dict] = {"feature_dim": 16, "window": 4, "chunk_size": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        feature_dim: int = 64,
        window: int = 0,
        chunk_size: int = 128,
        **timm_args: Any,
    ) -> None:
        check_int("feature_dim", feature_dim, 1)
        check_int("window", window, 0)
        check_int("chunk_size", chunk_size, 1)
        super().__init__(dim, num_heads, **timm_args)
        dd = self.factory_kwargs
        self.feature_dim, self.window, self.chunk_size = feature_dim, window, chunk_size
        self.feature_map_q = nn.Parameter(identity_feature_map(num_heads, self.head_dim, feature_dim, **dd))
        self.feature_map_k = nn.Parameter(identity_feature_map(num_heads, self.head_dim, feature_dim, **dd))
        # sigmoid(0) = 1/2, LoLCATs' initial weight of the band against the linear terms
        self.window_factor = nn.Parameter(torch.zeros(num_heads, **dd)) if window else None
        self.state_features = 2 * feature_dim

    def window_gate(self) -> Tensor | None:
        return None if self.window_factor is None else self.window_factor.sigmoid()

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        return hedgehog_attention(
            q,
            k,
            v,
            self.feature_map_q,
            self.feature_map_k,
            mask,
            is_causal,
            window=self.window,
            window_gate=self.window_gate(),
            scale=self.scale,
            chunk_size=self.chunk_size,
        )

    def step_features(self, q: Tensor, k: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, None]:
        return hedgehog_features(q, self.feature_map_q), hedgehog_features(k, self.feature_map_k, keep), None

    def init_state(self, batch: int):
        """The state before the first token: `KernelState` without a window, `WindowState` with one."""
        if not self.window:
            return super().init_state(batch)
        weight = self.qkv.weight
        dd = {"device": weight.device, "dtype": torch.promote_types(weight.dtype, torch.float32)}
        b, h, r, d, w = batch, self.num_heads, self.state_features, self.head_dim, self.window
        keep = torch.zeros(b, w, dtype=torch.bool, device=weight.device)
        return WindowState(
            torch.zeros(b, h, r, d, **dd),
            torch.zeros(b, h, r, **dd),
            torch.zeros(b, h, w, d, **dd),
            torch.zeros(b, h, w, d, **dd),
            keep,
        )

    def decode_step(self, x: Tensor, state=None, *, keep: Tensor | None = None):
        """One causal step (see `KernelStepMixin.decode_step`); with a window the state is a `WindowState`, O(window
        d + r d) per sample and head. Step by step this equals `module(x, is_causal=True)`."""
        if not self.window:
            return super().decode_step(x, state, keep=keep)
        single = x.dim() == 2
        tokens = x[:, None] if single else x
        if tokens.dim() != 3 or tokens.shape[1] != 1:
            raise ValueError(f"decode_step takes one token, x of shape [b, c] or [b, 1, c]; got {tuple(x.shape)}")
        if keep is not None and keep.shape != tokens.shape[:1]:
            raise ValueError(f"keep of shape {tuple(keep.shape)} is not [{tokens.shape[0]}] (one flag per sample)")
        state = self.init_state(tokens.shape[0]) if state is None else state
        q, k, v = self.project_qkv(tokens)
        with torch.autocast(x.device.type, enabled=False):
            out, state = self._window_step(q, k, v, state, keep)
        out = self.project_out(out[:, :, None].to(v.dtype), tokens)
        return (out[:, 0] if single else out), state

    def _window_step(
        self, q: Tensor, k: Tensor, v: Tensor, state: WindowState, keep: Tensor | None
    ) -> tuple[Tensor, WindowState]:
        """q, k, v `[b, h, 1, d]` of the current token -> its output `[b, h, d]` (float32) and the next state."""
        dtype = state.kv.dtype
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        kept = torch.ones_like(state.keep[:, 0]) if keep is None else keep.bool()
        keys = torch.cat([state.keys, k], dim=2)  # [b, h, window + 1, d]: the band of this token
        values = torch.cat([state.values, v], dim=2)
        in_band = torch.cat([state.keep, kept[:, None]], dim=1)  # [b, window + 1]
        scores = torch.einsum("bhd,bhmd->bhm", q[:, :, 0], keys) * self.scale
        scores = scores.masked_fill(~in_band[:, None], torch.finfo(dtype).min)
        weights = torch.exp(scores - scores.amax(-1, keepdim=True)) * in_band[:, None]
        weights = weights * self.window_gate().to(dtype)[:, None]
        phi_q = hedgehog_features(q, self.feature_map_q)[:, :, 0]
        num = torch.einsum("bhm,bhmd->bhd", weights, values) + torch.einsum("bhr,bhrd->bhd", phi_q, state.kv)
        den = weights.sum(-1) + torch.einsum("bhr,bhr->bh", phi_q, state.z)
        out = num / den.clamp_min(DENOMINATOR_EPS)[..., None]
        # The oldest key leaves the band: from the next token on it is a linear-attention key.
        leaving = hedgehog_features(keys[:, :, :1], self.feature_map_k, in_band[:, :1])[:, :, 0]  # [b, h, r]
        kv = state.kv + leaving[..., None] * values[:, :, 0, None, :]
        next_state = WindowState(kv, state.z + leaving, keys[:, :, 1:], values[:, :, 1:], in_band[:, 1:])
        return out, next_state

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, feature_dim={self.feature_dim}, window={self.window}"
