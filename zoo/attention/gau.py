"""Gated attention unit and FLASH: "Transformer Quality in Linear Time" (Hua et al. 2022),
https://arxiv.org/abs/2202.10447

A gated attention unit (GAU) computes, from one pre-normed input, a gate U and values V (width e = 2 d) and a
shared low-dimensional base Z (width s = 128); queries and keys are Z under cheap per-dimension scales and offsets.
Attention is a single head of squared ReLU scores, `relu(q . k / n)^2`, with no softmax and no normaliser, and
the output `(U * A V) W_o` comes back through a residual. FLASH makes it linear in n with mixed chunk attention:
positions are cut into chunks of `group_size`; inside a chunk the squared-ReLU attention is exact, across chunks a
plain (unnormalised) linear attention `q . k / n` with its own scales and offsets carries the global context
(non-causal: over every key; causal: over the keys of earlier chunks, by a prefix sum of chunk states):

    A V_i = sum_{j in chunk(i)} relu(quad_q_i . quad_k_j / n)^2 v_j + sum_{j in L(i)} (lin_q_i . lin_k_j / n) v_j

`mixed_chunk_attention_reference` writes this out on a dense `[n, n]` weight matrix (the tests' oracle); the
chunk kernel with its hand-written backward is `_kernels.gau`.

Two forms live here:
- `GAUAttention`, registered as `gau`, fits timm's `attn_layer` slot (the MLP stays). It keeps timm's `qkv` and
  `proj`, mapped as: the q rows of `qkv` give Z (per head, s = head_dim), the k rows give the gate U, the v rows
  give V, all through SiLU; `q_norm` / `k_norm` (qk_norm) normalise Z on the query and the key side. So softmax
  weights copy in, but the k rows change role: they become the gate.
- `GatedAttentionUnit`, the paper's layer (single head, `z_dim` = 128, `expansion` = 2), as a pre-norm residual
  branch. `zoo.models.blocks.GAUBlock` stacks two of them in place of attention + MLP, which matches a
  Transformer block's parameter count (about 6 d^2 each against 4 d^2 + 8 d^2).

Scaling: n is the number of real (unpadded) keys of each sample, and the chunk scores are divided by
`min(group_size, n)` (so with `group_size >= n` the quadratic part is exactly the paper's GAU `relu(qk / n)^2`);
a padded sequence therefore gives the output of the same sequence unpadded. In causal mode n is still the whole
(real) length, as in training: no output depends on a later token's value, but token-by-token decoding would
have to fix n. Padded keys are zeroed after the offsets, so they get no weight in either part. Relative position
biases (the paper's T5 bias / RoPE) are left to the backbone's position embedding.

`kernel_attention` in `_kernel.py` normalises by the sum of non-negative weights; FLASH's linear part is neither,
so the chunked prefix sum is written out here (a few lines) rather than shared.

Letter legend: b - batch, h - heads, n - length (padded to k * w inside), s - query/key width (Z), e - value
width, k - chunks, w - chunk length, f - the four scale/offset rows (quad q, quad k, linear q, linear k).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import DropPath, LayerNorm, LayerScale
from torch import Tensor, nn

from .._validate import check_bool, check_int
from ._common import AttentionBase, key_padding_mask, masked_fill_keys, pad_to_multiple
from ._kernels.gau import ChunkReluSquare, relu_square
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = [
    "GAUAttention",
    "GatedAttentionUnit",
    "mixed_chunk_attention",
    "mixed_chunk_attention_reference",
    "scale_offset",
]


def scale_offset(z: Tensor, gamma: Tensor, beta: Tensor) -> tuple[Tensor, ...]:
    """Per-dimension scales and offsets of the shared base: `z: [b, h, n, s]`, gamma, beta: `[f, h, s]` -> f
    tensors `[b, h, n, s]` (with all four rows: quad_q, quad_k, lin_q, lin_k)."""
    out = z[None] * gamma[:, None, :, None, :] + beta[:, None, :, None, :]
    return tuple(out.unbind(0))


def _key_counts(mask: Tensor | None, v: Tensor) -> Tensor:
    """`[b, 1, 1, 1]`: real keys per sample (at least 1), the paper's n."""
    if mask is None:
        return v.new_full((v.shape[0], 1, 1, 1), float(v.shape[-2]))
    return mask.sum(-1).clamp_min(1).to(v.dtype)[:, None, None, None]


def _chunks(x: Tensor, w: int) -> Tensor:
    """`[b, h, n, x]` -> `[b, h, k, w, x]`, zero-padded to a multiple of w."""
    return rearrange(pad_to_multiple(x, w)[0], "b h (k w) x -> b h k w x", w=w)


def mixed_chunk_attention_reference(
    quad_q: Tensor,
    quad_k: Tensor,
    lin_q: Tensor,
    lin_k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    group_size: int = 256,
) -> Tensor:
    """`mixed_chunk_attention` on a dense `[b, h, n, n]` weight matrix, for the tests (same shapes, no chunking)."""
    n = v.shape[-2]
    chunk = torch.arange(n, device=v.device) // min(group_size, n)
    same = chunk[:, None] == chunk[None, :]
    count = _key_counts(mask, v)
    quad = F.relu(quad_q @ quad_k.transpose(-2, -1) / count.clamp_max(group_size)).square() * same
    lin = lin_q @ lin_k.transpose(-2, -1) / count
    if is_causal:
        quad = quad.tril()
        lin = lin * (chunk[None, :] < chunk[:, None])
    weights = quad + lin
    if mask is not None:
        weights = weights * mask[:, None, None, :]
    return weights @ v


def mixed_chunk_attention(
    quad_q: Tensor,
    quad_k: Tensor,
    lin_q: Tensor,
    lin_k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    group_size: int = 256,
) -> Tensor:
    """FLASH mixed chunk attention, unnormalised.

    quad_q, quad_k, lin_q, lin_k: `[b, h, n, s]`; v: `[b, h, n, e]`; mask: `[b, n]` bool, True = keep, or None
    -> `[b, h, n, e]` in v's dtype. With chunks of w = min(group_size, n) positions and c the real keys of the
    sample,

        out_i = sum_{j in chunk(i)} relu(quad_q_i . quad_k_j / min(group_size, c))^2 v_j
              + sum_{j in L(i)} (lin_q_i . lin_k_j / c) v_j

    L(i) is every key (non-causal) or the keys of earlier chunks (causal, which also keeps j <= i in the chunk).
    Memory is `[n, w]` for the chunk scores and `[n / w, s, e]` for causal states, never `[n, n]`. Computed in
    float32 at least, with autocast off: squared scores and sums over thousands of keys lose too much in half.
    """
    n = v.shape[-2]
    out_dtype = v.dtype
    dtype = torch.promote_types(v.dtype, torch.float32)
    with torch.autocast(v.device.type, enabled=False):
        quad_q, quad_k, lin_q, lin_k, v = (t.to(dtype) for t in (quad_q, quad_k, lin_q, lin_k, v))
        count = _key_counts(mask, v)
        quad_k, lin_k, v = (masked_fill_keys(t, mask) for t in (quad_k, lin_k, v))
        w = min(group_size, n)
        out = _quadratic(quad_q, quad_k, v, count.clamp_max(group_size), w, is_causal)
        if is_causal:
            out = out + _causal_linear(lin_q, lin_k, v, w) / count
        else:
            out = out + torch.matmul(lin_q, torch.matmul(lin_k.transpose(-2, -1), v)) / count
        return out.to(out_dtype)


def _quadratic(q: Tensor, k: Tensor, v: Tensor, scale: Tensor, w: int, is_causal: bool) -> Tensor:
    """Squared-ReLU attention inside each chunk: q, k `[b, h, n, s]`, v `[b, h, n, e]`, scale `[b, 1, 1, 1]`."""
    b, h, n, _ = v.shape
    qc, kc, vc = (rearrange(_chunks(x, w), "b h k w x -> (b h k) w x") for x in (q, k, v))
    # One scale per chunk row: the sample's, repeated over its heads and chunks.
    inv_scale = scale.reciprocal().expand(b, h, qc.shape[0] // (b * h), 1).reshape(-1, 1, 1)
    if choose_path(qc, kernel=lambda: True) is Path.KERNEL:
        out = ChunkReluSquare.apply(qc, kc, vc, inv_scale, is_causal)
    else:
        # torch.export's tracing refuses the pass-wise `out=` writes: every chunk's weights at once, autograd's backward
        out = torch.bmm(relu_square(qc, kc, inv_scale, is_causal)[0], vc)
    return rearrange(out, "(b h k) w e -> b h (k w) e", b=b, h=h)[:, :, :n]


def _causal_linear(q: Tensor, k: Tensor, v: Tensor, w: int) -> Tensor:
    """`sum_{j in earlier chunks} (q_i . k_j) v_j`: per-chunk states `k^T v`, then an exclusive prefix sum."""
    n = v.shape[-2]
    qc, kc, vc = _chunks(q, w), _chunks(k, w), _chunks(v, w)
    states = torch.matmul(kc.transpose(-2, -1), vc)
    states = torch.cat([torch.zeros_like(states[:, :, :1]), states[:, :, :-1].cumsum(2)], dim=2)
    return rearrange(torch.matmul(qc, states), "b h k w e -> b h (k w) e")[:, :, :n]


def _scale_offset_parameters(heads: int, width: int, **dd) -> tuple[nn.Parameter, nn.Parameter]:
    # The paper's initialisation: scales N(0, 0.02), offsets 0.
    gamma = nn.Parameter(torch.empty(4, heads, width, **dd))
    nn.init.normal_(gamma, std=0.02)
    return gamma, nn.Parameter(torch.zeros(4, heads, width, **dd))


@register_attention("gau")
class GAUAttention(AttentionBase):
    """GAU / FLASH attention in timm's attention slot (see the module docstring for how `qkv` maps).

    `x: [b, n, c]` -> `[b, n, c]`: `proj(silu(U) * A silu(V))`, A the mixed chunk attention of each head on
    scales and offsets (`gamma`, `beta`: `[4, h, d]`) of `Z = silu(q rows of qkv)`. `reference=True` computes A
    on a dense weight matrix (`mixed_chunk_attention_reference`) instead of by chunks.
    """

    supports_causal = True
    test_options: ClassVar[dict] = {"group_size": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        group_size: int = 256,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.group_size = check_int("group_size", group_size, 1)
        self.reference = check_bool("reference", reference)
        self.gamma, self.beta = _scale_offset_parameters(num_heads, self.head_dim, **self.factory_kwargs)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """`x: [b, n, c]` -> `[b, n, c]`."""
        mask = self.prepare_mask(attn_mask, x.shape[0], x.shape[1])
        z, u, v = rearrange(F.silu(self.qkv(x)), "b n (t h d) -> t b h n d", t=3, h=self.num_heads).unbind(0)
        return self.project_out(self.attend(self.q_norm(z), self.k_norm(z), v, mask, is_causal) * u, x)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """q, k: the shared base Z on the query and the key side `[b, h, n, d]`; v `[b, h, n, d]` -> `[b, h, n, d]`."""
        quad_q, lin_q = scale_offset(q, self.gamma[0::2], self.beta[0::2])
        quad_k, lin_k = scale_offset(k, self.gamma[1::2], self.beta[1::2])
        reference = choose_path(q, reference=self.reference) is Path.REFERENCE
        attention = mixed_chunk_attention_reference if reference else mixed_chunk_attention
        return attention(quad_q, quad_k, lin_q, lin_k, v, mask=mask, is_causal=is_causal, group_size=self.group_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"


class GatedAttentionUnit(nn.Module):
    """The paper's GAU layer as a pre-norm residual branch (the caller adds the input back).

    `x: [b, n, c]` -> `drop_path(ls(proj(u * A v)))`, `[b, n, c]`, where `u, v, z = silu(uv(norm(x)))` split into
    `[e, e, z_dim]` (e = expansion * c) and A is single-head mixed chunk attention on scales and offsets of z.
    """

    def __init__(
        self,
        dim: int,
        *,
        z_dim: int = 128,
        expansion: float = 2.0,
        group_size: int = 256,
        bias: bool = True,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        init_values: float | None = None,
        drop_path: float = 0.0,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.z_dim = check_int("z_dim", z_dim, 1)
        self.group_size = check_int("group_size", group_size, 1)
        if isinstance(expansion, bool) or not isinstance(expansion, (int, float)) or expansion <= 0:
            raise ValueError(f"expansion={expansion!r} is not allowed: expected a number > 0")
        self.hidden_dim = max(1, int(expansion * dim))
        self.norm = norm_layer(dim, **dd)
        self.uv = nn.Linear(dim, 2 * self.hidden_dim + z_dim, bias=bias, **dd)
        self.gamma, self.beta = _scale_offset_parameters(1, z_dim, **dd)
        self.proj = nn.Linear(self.hidden_dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.ls = LayerScale(dim, init_values=init_values, **dd) if init_values else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """`x: [b, n, c]`, attn_mask: a key padding mask (`[b, n]` or `[b, 1, 1, n]`) -> the branch `[b, n, c]`."""
        mask = key_padding_mask(attn_mask, x.shape[0], x.shape[1])
        split = [self.hidden_dim, self.hidden_dim, self.z_dim]
        u, v, z = F.silu(self.uv(self.norm(x))).split(split, dim=-1)
        quad_q, quad_k, lin_q, lin_k = scale_offset(z[:, None], self.gamma, self.beta)
        out = mixed_chunk_attention(
            quad_q, quad_k, lin_q, lin_k, v[:, None], mask=mask, is_causal=is_causal, group_size=self.group_size
        )
        return self.drop_path(self.ls(self.proj_drop(self.proj(u * out[:, 0]))))

    def extra_repr(self) -> str:
        return f"z_dim={self.z_dim}, hidden_dim={self.hidden_dim}, group_size={self.group_size}"
