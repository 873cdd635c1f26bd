"""The CPU kernel path of convolutional band attention (`zoo.attention.banded_conv`) on the flash parts, and the
per-head shifted taps both of its faster paths filter with.

Letter legend: b - batch, h - heads, n - length, d - head dim, t - kernel taps, s - band slots the edges' zero
padding reaches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .flash_parts import band_parts, parts_attention

__all__ = ["banded_conv_parts", "shifted_taps"]


def shifted_taps(x: Tensor, kernel: Tensor, dim: int) -> Tensor:
    """Filter `x` along `dim` with per-head taps `kernel` `[h, t]` (heads: dim 1), zeros past both ends:
    y[j] = sum_t kernel[t] * x[j + t - t // 2], as `F.conv1d` with padding t // 2.

    Shifted multiply-adds rather than `F.conv1d`: mkldnn's depthwise conv1d over many short rows of a few heads
    dominated a masked training step, backward above all."""
    taps, length = kernel.shape[-1], x.shape[dim]
    padded = F.pad(x.movedim(dim, -1), (taps // 2, taps // 2)).movedim(-1, dim)
    shape = [1] * x.dim()
    shape[1] = kernel.shape[0]
    out = None
    for tap in range(taps):
        term = padded.narrow(dim, tap, length) * kernel[:, tap].view(shape)
        out = term if out is None else out.add_(term)
    return out


def _offset_scores(q: Tensor, k: Tensor, first: int, width: int, scale: float, chunk: int = 32) -> Tensor:
    """`[b, h, n, width]`: q_i . k_{i + first + j} * scale for j < width, 0 where the key is outside the sequence.

    Chunks of `chunk` queries against their `chunk + width - 1` keys, one batched matmul, the wanted diagonals
    read out: a few diagonals of q k^T without forming it or copying the keys `width` times."""
    b, h, n, d = q.shape
    chunks = -(-n // chunk)
    q = F.pad(q, (0, 0, 0, chunks * chunk - n)).view(b, h, chunks, chunk, d)
    left = max(0, -first)
    key_count = chunks * chunk + width - 1  # keys from position `first` on
    keys = F.pad(k, (0, 0, left, max(0, first + key_count - n)))[:, :, left + first : left + first + key_count]
    scores = torch.matmul(q, keys.unfold(2, chunk + width - 1, chunk))  # [b, h, chunks, chunk, chunk + width - 1]
    diagonals = torch.stack([scores.diagonal(j, -2, -1) for j in range(width)], -1)  # [b, h, chunks, chunk, width]
    return diagonals.flatten(2, 3)[:, :, :n] * scale


def banded_conv_parts(
    q: Tensor, k: Tensor, v: Tensor, kernels: Tensor, is_causal: bool, radius: int, scale: float
) -> Tensor:
    """Convolutional band attention, exact: q, k, v `[b, h, n, d]`, kernels `[z, h, t]` -> `[b, h, n, d]`; the
    convolutions move from the scores to the keys.

    Away from the band's edges a convolution of the band along the key axis is one of the keys along the
    sequence, s[i, o] = q_i . k_{i+o} filtered into q_i . k'_{i+o}, and zeroing missing keys between layers is
    zeroing them in k' (outside the sequence, zero padding does it). Only the s = depth * (kernel_size // 2) slots
    next to each band edge see the edge's zero padding: those logits are computed apart, by running the layers
    on a strip of 2s raw scores per edge and keeping the s slots the padding on the inner side never reaches.
    The rest of the band is plain sliding-window attention with the filtered keys (`band_parts`, a window of
    r - s, causal: r - 2s shifted s behind the query), merged with the edge slots in one softmax
    (`parts_attention`).
    """
    n = q.shape[2]
    reach = kernels.shape[0] * (kernels.shape[-1] // 2)
    filtered = k
    for kernel in kernels:
        filtered = shifted_taps(filtered, kernel, 2)
    if is_causal:
        parts = band_parts(n - reach, radius - 2 * reach, True, q.device, q.dtype, shift=reach)
        edges = (-radius, -2 * reach + 1)
    else:
        parts = band_parts(n, radius - reach, False, q.device, q.dtype)
        edges = (-radius, radius - 2 * reach + 1)
    if not reach:
        return parts_attention(q, filtered, v, parts, scale)
    logits, offsets = [], []
    positions = torch.arange(n, device=q.device)[:, None]
    for side, first in enumerate(edges):
        slots = first + torch.arange(2 * reach, device=q.device)
        present = ((positions + slots >= 0) & (positions + slots < n)).to(q.dtype)  # [n, 2s]
        strip = _offset_scores(q, k, first, 2 * reach, scale)
        for kernel in kernels:
            strip = shifted_taps(strip * present, kernel, 3)
        # Left edge: the first s slots are exact; right edge: the last s.
        keep = slice(0, reach) if side == 0 else slice(reach, 2 * reach)
        logits.append(strip[..., keep].masked_fill(present[:, keep] == 0, -1e30))
        offsets.extend(slots[keep].tolist())
    return parts_attention(q, filtered, v, parts, scale, dense=torch.cat(logits, -1), offsets=offsets)
