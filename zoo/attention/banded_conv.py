"""Convolutional band attention: sliding-window attention whose band of scores is convolved along the key axis.

The method of the zoo's design notes ("convolutional band attention"). Each query i scores the keys within
`radius` positions, j - i = o in -r..r (causal: -r..0), as in `local` attention; the band of scores
`s[i, o] = q_i . k_{i+o} * scale` is then filtered along the key axis by `depth` learned 1-D kernels (one per head,
depthwise, odd `kernel_size`, zero padding at the band edges), and only then normalised by a softmax over the band.
A key's logit can thus depend on its neighbours' similarity to the query, for instance to attend to a span whose
keys match together rather than to one key. Related idea: the key-query convolution over attention logits of
"Multi-Token Attention" (Golovneva et al. 2025), https://arxiv.org/abs/2504.00927, which convolves the full
causal score matrix; here the convolution stays inside the band, so time and memory are O(n * radius).

Missing keys: a band slot whose key is outside the sequence or padded holds a zero score before every convolution
(as the band edges do) and is masked out of the softmax. Padded content therefore never reaches a kept key's
logit, and a sequence padded at its end gives the same outputs as the truncated sequence. Causal mode needs no
shifted convolution: the causal band stops at the diagonal and what lies right of it is zero padding, so no key
after i influences any logit of query i; the same centred kernels serve both modes.

The stack is linear (no nonlinearity between convolutions): away from missing keys it is one kernel of
`depth * (kernel_size - 1) + 1` taps factored into short ones. Kept linear because a squashing nonlinearity would
distort the logits the softmax ranks, and because with every kernel initialised to the identity (centre tap 1)
the layer equals `local` attention with window `radius` at initialisation, from which training departs smoothly.

`banded_conv_reference` writes this out on the dense `[n, n]` scores, each convolution a product with a banded
Toeplitz matrix. Faster paths (`choose_path` picks one per call): the CPU flash parts
(`_kernels.banded_conv.banded_conv_parts`, the convolutions moved onto the keys); and the torch path here, in
blocks (`_blocks.window_layout`): per block the scores `[w, (s w)]` against its window of keys, the band
`[w, 2r + 1]` gathered out of them, convolved and normalised, then scattered back for the product with the
values; no n x n tensor.
Letter legend: b - batch, h - heads, n - length, d - head dim, k - blocks, w - block length, s - blocks in a window,
l - band slots (2r + 1, causal r + 1), t - kernel taps, z - depth.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .._validate import check_bool, check_int
from ._blocks import BlockLayout, as_sdpa_mask, band_keep, position_offsets, window_layout
from ._common import AttentionBase
from ._kernels.banded_conv import banded_conv_parts, shifted_taps
from ._kernels.flash_parts import on_kept_prefixes, parts_apply, prefix_lengths
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = [
    "BandedConvAttention",
    "band_columns",
    "band_scores",
    "band_slot_keep",
    "banded_conv_attention",
    "banded_conv_reference",
    "convolve_band",
]


def band_width(radius: int, is_causal: bool) -> int:
    """Slots in a query's band, l: offsets -r..r, or -r..0 when causal."""
    return radius + 1 if is_causal else 2 * radius + 1


def band_columns(layout: BlockLayout, radius: int, is_causal: bool, device: torch.device) -> Tensor:
    """`[w, l]`: the column of a block's window scores `[w, (s w)]` holding query row u's key at offset
    o = -r + slot, clamped into the window. A clamped column only ever stands for a key outside the sequence
    (the window reaches `radius` blocks-worth, or covers the whole sequence), which `band_slot_keep` masks."""
    rows = torch.arange(layout.block, device=device)[:, None]
    offsets = torch.arange(band_width(radius, is_causal), device=device) - radius
    return (rows + layout.before * layout.block + offsets).clamp(0, layout.window_blocks * layout.block - 1)


def band_slot_keep(keep: Tensor, radius: int, is_causal: bool) -> Tensor:
    """Per-key keep `[b or 1, n]` (False past the sequence) -> `[b or 1, n, l]`: the key at each band slot exists
    and is kept."""
    keep = F.pad(keep, (radius, 0 if is_causal else radius), value=False)
    return keep.unfold(1, band_width(radius, is_causal), 1)


def band_scores(q: Tensor, k: Tensor, layout: BlockLayout, columns: Tensor, scale: float) -> Tensor:
    """q, k: `[b, h, n, d]` -> band scores `[(b k), h, w, l]`; entry (u, slot) is q . k * scale for block row u
    and its key at offset slot - r. Memory O(n * s * w) for the block scores, never n x n."""
    scores = torch.matmul(layout.blocks(q), layout.windows(k).transpose(-1, -2)) * scale  # (b k) h w (s w)
    return scores.gather(-1, columns.expand(*scores.shape[:2], *columns.shape))


def convolve_band(scores: Tensor, keep: Tensor, kernels: Tensor) -> Tensor:
    """Filter the band along the key axis: scores `[b, h, w, l]`, keep bool broadcastable to it, kernels
    `[z, h, t]` (t odd) -> `[b, h, w, l]`. Missing keys are zeroed before each of the z convolutions, like the zero
    padding past the band edges, so only kept keys' scores ever mix."""
    for kernel in kernels:
        scores = shifted_taps(scores.masked_fill(~keep, 0.0), kernel, 3)
    return scores


def banded_conv_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernels: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    radius: int = 256,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The equation on the dense `[n, n]` scores, each convolution a Toeplitz product, O(n^3): the tests' oracle.

    q, k, v: `[b, h, n, d]`; kernels: `[z, h, t]`; mask: `[b, n]` bool key padding mask, True = keep ->
    `[b, h, n, d]`. Scores outside the band or at padded keys are zeroed before each convolution, then one softmax
    runs over the band's kept keys.
    """
    n, d = q.shape[-2:]
    dtype = torch.promote_types(q.dtype, torch.float32)
    allowed = band_keep(position_offsets(n, q.device), radius, is_causal)  # [n, n]
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    scores = (torch.matmul(q, k.transpose(-1, -2)) * (d**-0.5 if scale is None else scale)).to(dtype)
    for kernel in kernels.to(dtype):
        scores = torch.einsum("bhij,hjm->bhim", scores.masked_fill(~allowed, 0.0), _toeplitz(kernel, n))
    weights = scores.masked_fill(~allowed, torch.finfo(dtype).min).softmax(-1) * allowed
    weights = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return torch.matmul(weights, v.to(dtype)).to(v.dtype)


def _toeplitz(kernel: Tensor, n: int) -> Tensor:
    """`[h, t]` taps -> `[h, n, n]` T with (x @ T)[j] = sum_t kernel[t] * x[j + t - t // 2], zeros past the ends."""
    taps = kernel.shape[-1]
    tap = position_offsets(n, kernel.device) + taps // 2  # [input key, output key]
    inside = (tap >= 0) & (tap < taps)
    return torch.where(inside, kernel[:, tap.clamp(0, taps - 1)], 0.0)


def banded_conv_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernels: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    radius: int = 256,
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Convolutional band attention on the path `choose_path` picks.

    q, k, v: `[b, h, n, d]`; kernels: `[z, h, t]` per-head taps (t odd, centre = the key itself); mask: `[b, n]`
    bool key padding mask, True = keep -> `[b, h, n, d]`. Any n: padded to whole blocks inside. A query with no
    kept key returns zeros. Convolutions and softmax run in float32 or wider. `reference=True`:
    `banded_conv_reference`.
    """
    n = q.shape[-2]
    # Band slots farther than n - 1 always hold missing keys, which equal zero padding: trim them.
    trimmed = min(radius, n - 1)
    reach = kernels.shape[0] * (kernels.shape[-1] // 2)  # band slots the edges' zero padding reaches, s
    inner = trimmed - (2 * reach if is_causal else reach)
    kernel = functools.partial(parts_apply, q, mask, dropout_p, min(inner, n - reach))
    path = choose_path(q, reference=reference, kernel=kernel)
    if path is Path.REFERENCE:
        return banded_conv_reference(q, k, v, kernels, mask, is_causal, radius=radius, scale=scale, dropout_p=dropout_p)
    if path is Path.KERNEL:
        lengths = prefix_lengths(q, mask, dropout_p)
        if lengths is not None:
            # a padded key is a missing key like those past the end (zeroed before each convolution)
            run = functools.partial(
                banded_conv_attention, kernels=kernels, is_causal=is_causal, radius=radius, scale=scale
            )
            return on_kept_prefixes(run, q, k, v, lengths)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return banded_conv_parts(q, k, v, kernels.to(q.dtype), is_causal, trimmed, scale)
    if band_width(trimmed, is_causal) >= n:
        # The band holds every key: the [n, n] scores are no larger and need no gather or scatter.
        return _dense(q, k, v, kernels, mask, is_causal, trimmed, scale, dropout_p)
    return _band_blocks(q, k, v, kernels, mask, is_causal, trimmed, scale, dropout_p)


def _band_blocks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernels: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    radius: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """The torch path in blocks: each block's band gathered out of its window scores, convolved, normalised and
    scattered back for one matmul with the window's values."""
    b, _, n, d = q.shape
    layout = window_layout(n, radius, is_causal)
    columns = band_columns(layout, radius, is_causal, q.device)
    keep = band_slot_keep(layout.keep(mask, q.device), radius, is_causal)  # [b or 1, (k w), l]
    keep = as_sdpa_mask(rearrange(keep, "b (k w) l -> b k 1 w l", w=layout.block), b)  # [(b k), 1, w, l]

    dtype = torch.promote_types(q.dtype, torch.float32)
    scores = band_scores(q, k, layout, columns, d**-0.5 if scale is None else scale).to(dtype)
    logits = convolve_band(scores, keep, kernels.to(dtype))
    # The lowest finite value, not -inf, and zeros after: a query with no kept key gets zero weights.
    probs = logits.masked_fill(~keep, torch.finfo(dtype).min).softmax(-1).masked_fill(~keep, 0.0)
    probs = F.dropout(probs, dropout_p) if dropout_p > 0 else probs

    # Back into the window layout for one matmul with the values; add, not write: clamped columns repeat (at 0).
    values = layout.windows(v)  # (b k) h (s w) d
    weights = probs.new_zeros(*probs.shape[:3], values.shape[-2])
    weights = weights.scatter_add(-1, columns.expand_as(probs), probs).to(v.dtype)
    return layout.unblock(torch.matmul(weights, values), b)


def _dense(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernels: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    radius: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """The torch path on the full `[n, n]` scores (for a band that holds every key): `banded_conv_reference` with
    shifted multiply-adds in place of the Toeplitz products, O(n^2 t) time."""
    n, d = q.shape[-2:]
    dtype = torch.promote_types(q.dtype, torch.float32)
    allowed = band_keep(position_offsets(n, q.device), radius, is_causal)
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    scores = (torch.matmul(q, k.transpose(-1, -2)) * (d**-0.5 if scale is None else scale)).to(dtype)
    for kernel in kernels.to(dtype):
        scores = shifted_taps(scores.masked_fill(~allowed, 0.0), kernel, 3)
    weights = scores.masked_fill(~allowed, torch.finfo(dtype).min).softmax(-1) * allowed
    weights = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return torch.matmul(weights, v.to(dtype)).to(v.dtype)


def identity_kernels(depth: int, num_heads: int, kernel_size: int, **dd) -> Tensor:
    """`[z, h, t]` kernels that leave the band unchanged: centre tap 1, the others 0."""
    kernels = torch.zeros(depth, num_heads, kernel_size, **dd)
    kernels[..., kernel_size // 2] = 1.0
    return kernels


@register_attention("banded_conv")
class BandedConvAttention(AttentionBase):
    """Sliding-window attention of `radius` (default 256, as `local`'s window) whose band of logits is filtered by
    `depth` (default 2) learned per-head kernels of `kernel_size` (odd, default 3) taps, identity at init;
    `reference=True`: the dense reference."""

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"radius": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        radius: int = 256,
        depth: int = 2,
        kernel_size: int = 3,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.radius = check_int("radius", radius, 1)
        self.depth = check_int("depth", depth, 1)
        self.kernel_size = check_int("kernel_size", kernel_size, 1)
        self.reference = check_bool("reference", reference)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size={kernel_size} is not allowed: expected an odd integer, centred on the key")
        dd = self.factory_kwargs
        self.kernels = nn.Parameter(identity_kernels(depth, num_heads, kernel_size, **dd))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        return banded_conv_attention(
            q,
            k,
            v,
            self.kernels,
            mask,
            is_causal,
            radius=self.radius,
            scale=self.scale,
            dropout_p=dropout_p,
            reference=self.reference,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, radius={self.radius}, depth={self.depth}, kernel_size={self.kernel_size}"
