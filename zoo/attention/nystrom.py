"""Nystromformer: "Nystromformer: A Nystrom-Based Algorithm for Approximating Self-Attention" (Xiong et al. 2021),
https://arxiv.org/abs/2102.03902

Softmax attention `S = softmax(q k^T)` approximated through `r` landmarks (segment means of the queries and
keys): `S ~ softmax(q k_l^T) pinv(softmax(q_l k_l^T)) softmax(q_l k^T)`, with the pseudo-inverse by the paper's
iterative (Razavi et al.) scheme, so the cost is linear in n. An optional depthwise convolution of the values
along the sequence is added as a skip connection (the paper's and the authors' code's choice).

Per-sample throughout: landmarks are masked means over each segment's kept tokens (padded tokens never enter a
landmark, a softmax or its normaliser), and the pseudo-inverse's initial scale `1 / (||A||_1 ||A||_inf)` is
taken per (sample, head), never over the batch as the authors' code's default did. A length that does not
divide into the landmark count is padded internally (pad tokens are masked), and the output unpadded. With
at least as many landmarks as tokens every token is its own landmark, the approximation tends to exact
attention as the pseudo-inverse converges, and exact softmax attention is computed directly. `nystrom_reference`
materialises the three kernels (the tests' oracle); the torch path runs the two outer ones as blocked attention
calls (`linformer.blocked_attention`), never forming an `[n, r]` tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .._validate import check_bool, check_int
from ._common import AttentionBase, masked_fill_keys, pad_to_multiple
from ._paths import Path, choose_path
from ._registry import register_attention
from .linformer import blocked_attention, masked_softmax
from .softmax import softmax_attention

__all__ = ["NystromAttention", "iterative_pinv", "nystrom_attention", "nystrom_reference"]


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """Approximate Moore-Penrose pseudo-inverse of `a: [..., r, r]` (paper eq. 16), batched -> `[..., r, r]`.

    `Z_0 = a^T / (||a||_1 ||a||_inf)` with both norms per matrix (per sample and head), then
    `Z <- Z (13 I - a Z (15 I - a Z (7 I - a Z))) / 4`.
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    abs_a = a.abs()
    norm_1 = abs_a.sum(dim=-2).amax(dim=-1)  # max column sum
    norm_inf = abs_a.sum(dim=-1).amax(dim=-1)  # max row sum
    z = a.transpose(-2, -1) / (norm_1 * norm_inf)[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _landmarks(q: Tensor, k: Tensor, keep: Tensor | None, r: int, w: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """The landmarks: segment means of the kept tokens, `q_l, k_l: [b, h, r, d]` (padded tokens zeroed; the
    sequence padded to r * w only here), and which segments hold a kept token, `[b, r]` bool (None: all)."""
    counts = torch.full((1, r), w, device=q.device)
    has_landmark = None
    if keep is not None:
        counts = rearrange(keep, "b (r w) -> b r w", w=w).sum(-1)  # b r
        has_landmark = counts > 0
    denominator = counts.clamp_min(1).to(q.dtype)[:, None, :, None]
    q_l, k_l = (
        rearrange(masked_fill_keys(pad_to_multiple(t, r * w)[0], keep), "b h (r w) d -> b h r w d", w=w).sum(-2)
        / denominator
        for t in (q, k)
    )
    return q_l, k_l, has_landmark


def nystrom_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    num_landmarks: int = 64,
    pinv_iterations: int = 6,
    scale: float | None = None,
) -> Tensor:
    """The equation with its three kernels materialised, `[n, r]`, `[r, r]` and `[r, n]`: the tests' oracle.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool padding mask, True = keep -> `[b, h, n, d]` in v's dtype.
    """
    n, out_dtype = q.shape[-2], v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, keep, marks = _landmark_kernel(q, k, v, mask, num_landmarks, scale)
        key_keep = None if keep is None else keep[:, None, None, :]
        q, k = (masked_fill_keys(pad_to_multiple(t, marks.padded)[0], keep) for t in (q, k))
        v = pad_to_multiple(v, marks.padded)[0]
        landmark_keep = None if marks.present is None else marks.present[:, None, None, :]
        kernel_1 = masked_softmax((q * marks.scale) @ marks.k.transpose(-2, -1), landmark_keep)  # b h n r
        kernel_3 = masked_softmax(marks.q @ k.transpose(-2, -1), key_keep)  # b h r n
        out = kernel_1 @ (iterative_pinv(marks.kernel, pinv_iterations) @ (kernel_3 @ v))
    return out[:, :, :n].to(out_dtype)


def nystrom_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    num_landmarks: int = 64,
    pinv_iterations: int = 6,
    scale: float | None = None,
    reference: bool = False,
) -> Tensor:
    """Nystrom approximation of softmax attention (no convolution skip; the module adds it), on the path
    `choose_path` picks.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool padding mask, True = keep (self-attention: it drops keys and
    keeps padded queries out of the query landmarks) -> `[b, h, n, d]` in v's dtype, computed in float32 at
    least. Segments of `w = ceil(n / r)` tokens (the last ones short when `r` does not divide n); landmark i is
    the mean of the kept tokens in segment i, `q_l, k_l: [b, h, r, d]`. A segment with no kept token has no
    landmark: its column is dropped from the first two kernels and its row of the middle kernel is the
    identity, so it adds nothing. Rows of padded queries are not meaningful.

    The `[n, r]` kernels are never formed: `softmax(q_l k^T) v` and `softmax(q k_l^T) W` are `blocked_attention`
    calls (blocked, weights recomputed in backward); `reference=True`: `nystrom_reference`.
    """
    options = {"num_landmarks": num_landmarks, "pinv_iterations": pinv_iterations, "scale": scale}
    if choose_path(q, reference=reference) is Path.REFERENCE:
        return nystrom_reference(q, k, v, mask, **options)
    out_dtype = v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, keep, marks = _landmark_kernel(q, k, v, mask, num_landmarks, scale)
        values = blocked_attention(marks.q, k, v, mask)  # softmax(q_l k^T) v: b h r d
        weights = iterative_pinv(marks.kernel, pinv_iterations) @ values
        out = blocked_attention(q, marks.k * marks.scale, weights, None if keep is None else marks.present)
    return out.to(out_dtype)


def _landmark_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, r: int, scale: float | None):
    """What both paths share, under autocast off: q, k, v in float32 at least, the keep mask padded to r * w (or
    None), and the `_Landmarks`."""
    b, _, n, d = q.shape
    w = -(-n // r)
    dtype = torch.promote_types(v.dtype, torch.float32)
    scale = scale or d**-0.5
    keep = mask
    if keep is not None or r * w > n:
        keep = torch.ones(b, n, dtype=torch.bool, device=q.device) if keep is None else keep
        keep = F.pad(keep, (0, r * w - n), value=False)
    # The pinv iterations and the three softmaxes lose too much in half precision: float32 inside.
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    q_l, k_l, has_landmark = _landmarks(q, k, keep, r, w)
    q_l = q_l * scale
    landmark_keep = middle_keep = None
    if has_landmark is not None:
        landmark_keep = has_landmark[:, None, None, :]
        eye = torch.eye(r, dtype=torch.bool, device=q.device)
        middle_keep = (has_landmark[:, None, :, None] & landmark_keep) | eye
    kernel_2 = masked_softmax(q_l @ k_l.transpose(-2, -1), middle_keep)  # b h r r
    return q, k, v, keep, _Landmarks(q_l, k_l, kernel_2, has_landmark, scale, r * w)


@dataclass(frozen=True)
class _Landmarks:
    """The landmarks `q` (times the scale) and `k` `[b, h, r, d]`, the middle kernel `softmax(q_l k_l^T)`
    `[b, h, r, r]`, which segments hold a kept token `present` `[b, r]` (None: all), the scale and the padded
    length r * w."""

    q: Tensor
    k: Tensor
    kernel: Tensor
    present: Tensor | None
    scale: float
    padded: int


# Rows per block of `sequence_conv`: small blocks waste few multiplications on the band's zeros (the block's
# [w, w + t - 1] Toeplitz matrix holds t taps per row), while the batched matmul still runs at GEMM speed.
_CONV_BLOCK = 64


def sequence_conv(x: Tensor, taps: Tensor) -> Tensor:
    """Depthwise convolution along the sequence, one kernel per head, zero padding (the residual of the
    paper's code, `nn.Conv2d(h, h, (t, 1), groups=h)` on `[b, h, n, d]`).

    x: `[b, h, n, d]`, taps: `[h, t]` (t odd) -> `[b, h, n, d]`. Computed as a batched matmul of each block of
    `_CONV_BLOCK` rows with its `[w, w + t - 1]` Toeplitz band, which on CPU runs faster than mkldnn's depthwise
    convolution, forward and backward.
    """
    h, n = x.shape[1:3]
    t, w = taps.shape[-1], _CONV_BLOCK
    blocks = -(-n // w)
    padded = F.pad(x, (0, 0, t // 2, blocks * w - n + t // 2))
    windows = padded.unfold(2, w + t - 1, w).transpose(-1, -2)  # b h k (w + t - 1) d
    columns = (torch.arange(w, device=x.device)[:, None] + torch.arange(t, device=x.device)).expand(h, w, t)
    band = taps.new_zeros(h, w, w + t - 1).scatter(2, columns, taps[:, None, :].expand(h, w, t))
    return torch.matmul(band[None, :, None], windows).flatten(2, 3)[:, :, :n]


@register_attention("nystrom")
class NystromAttention(AttentionBase):
    """Nystromformer multi-head attention with timm's projections; non-causal.

    `conv_kernel_size` (odd, or None / 0 for none): a depthwise convolution over the sequence, one kernel per
    head shared across the head dim (the authors' `Conv2d(h, h, (K, 1), groups=h)`), applied to the values with
    padded tokens zeroed and added to the attention output. Attention dropout is refused: dropping entries of
    the three kernels would break the pseudo-inverse they are built around. `reference=True`: the explicit kernels
    of `nystrom_attention` and `softmax_attention`.
    """

    test_options: ClassVar[dict] = {"num_landmarks": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        num_landmarks: int = 64,
        pinv_iterations: int = 6,
        conv_kernel_size: int | None = 33,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        check_int("num_landmarks", num_landmarks, 1)
        check_int("pinv_iterations", pinv_iterations, 0)
        if conv_kernel_size is not None:
            check_int("conv_kernel_size", conv_kernel_size, 0)
            if conv_kernel_size % 2 == 0 and conv_kernel_size:
                raise ValueError(f"conv_kernel_size={conv_kernel_size} must be odd (or None / 0 for no convolution)")
        super().__init__(dim, num_heads, **timm_args)
        self.num_landmarks = num_landmarks
        self.pinv_iterations = pinv_iterations
        self.reference = check_bool("reference", reference)
        self.conv_kernel_size = conv_kernel_size or None
        self.conv = None
        if self.conv_kernel_size:
            # Holds the taps under the paper code's name and shape; `sequence_conv` applies them (faster on CPU).
            self.conv = nn.Conv2d(
                num_heads,
                num_heads,
                (conv_kernel_size, 1),
                padding=(conv_kernel_size // 2, 0),
                groups=num_heads,
                bias=False,
                **self.factory_kwargs,
            )

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        if q.shape[-2] <= self.num_landmarks:
            keep = mask[:, None, None, :] if mask is not None else None
            out = softmax_attention(q, k, v, keep, scale=self.scale, reference=self.reference)
        else:
            out = nystrom_attention(
                q,
                k,
                v,
                mask,
                num_landmarks=self.num_landmarks,
                pinv_iterations=self.pinv_iterations,
                scale=self.scale,
                reference=self.reference,
            )
        if self.conv is not None:
            out = out + sequence_conv(masked_fill_keys(v, mask), self.conv.weight[:, 0, :, 0])
        return out

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_landmarks={self.num_landmarks}, pinv_iterations={self.pinv_iterations}, "
            f"conv_kernel_size={self.conv_kernel_size}"
        )
