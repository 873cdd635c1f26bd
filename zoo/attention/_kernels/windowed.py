"""The CPU kernel paths of the 1-D windowed families (local, dilated, Longformer, BigBird) on the flash parts.

Each function cuts its family's pattern into `flash_parts.Part`s and runs them in one `parts_attention` call, so
every query gets one softmax over the union of its keys without a score matrix in memory. They compute what the
family's reference function computes (in the family's file) and are taken where `flash_parts.use_flash_parts`
says the parts apply: CPU, float32 / float64, no key padding mask, no dropout, blocks long enough.

Letter legend: b - batch, h - heads, n - length, d - head dim, g - global positions, t - steps of a residue
class, r - residue classes (the dilation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from .._blocks import band_keep, rows_attention
from .flash_parts import Part, additive, band_parts, parts_attention

__all__ = ["bigbird_parts", "dilated_parts", "local_parts", "longformer_parts"]


def local_parts(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: int, scale: float) -> Tensor:
    """Sliding-window attention, q, k, v `[b, h, n, d]` -> `[b, h, n, d]`: the window's parts (`band_parts`)."""
    n = q.shape[2]
    return parts_attention(q, k, v, band_parts(n, window, is_causal, q.device, q.dtype), scale)


def dilated_parts(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, steps: int, dilation: int, scale: float):
    """Dilated sliding-window attention, q, k, v `[b, h, n, d]` -> `[b, h, n, d]`: residue classes as a batch dim,
    `[b, h, (t r), d] -> [b, r, h, t, d]` (views when n is a multiple of `dilation`), each a sliding window of
    `steps` steps, the output laid out `[b, t, r, h, d]` so that regrouping it is a view too."""
    n = q.shape[2]
    t, rem = divmod(n, dilation)
    if rem:
        # Residues below `rem` hold t + 1 positions, the others t: two calls on views of the padded sequence.
        q, k, v = (F.pad(x, (0, 0, 0, dilation - rem)) for x in (q, k, v))
    q, k, v = (rearrange(x, "b h (t r) d -> b r h t d", r=dilation) for x in (q, k, v))
    if not rem:
        out = parts_attention(q, k, v, band_parts(t, steps, is_causal, q.device, q.dtype), scale)
        return rearrange(out, "b r h t d -> b h (t r) d")
    long = parts_attention(
        *(x[:, :rem] for x in (q, k, v)), band_parts(t + 1, steps, is_causal, q.device, q.dtype), scale
    )
    short = parts_attention(
        *(x[:, rem:, :, :t] for x in (q, k, v)), band_parts(t, steps, is_causal, q.device, q.dtype), scale
    )
    out = torch.cat([long, F.pad(short, (0, 0, 0, 1))], dim=1)
    return rearrange(out, "b r h t d -> b h (t r) d")[:, :, :n]


def longformer_parts(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, is_causal: bool, window: int, scale: float):
    """Sliding window plus the global positions `rows` (`[g]` long), q, k, v `[b, h, n, d]` -> `[b, h, n, d]`: the
    window's parts plus one part of every query against the global keys outside its window (a small `[n, g]`
    mask), then the global queries against the whole sequence."""
    n = q.shape[2]
    parts = band_parts(n, window, is_causal, q.device, q.dtype)
    if not len(rows):
        return parts_attention(q, k, v, parts, scale)
    offsets = torch.arange(n, device=q.device)[:, None] - rows  # [n, g]
    allowed = ~band_keep(offsets, window, is_causal)
    if is_causal:
        allowed &= offsets >= 0
    parts.append(Part(0, 1, n, 0, len(rows), source="extra", mask=additive(allowed, q.dtype)))
    out = parts_attention(q, k, v, parts, scale, k[:, :, rows], v[:, :, rows])
    keep = torch.ones(1, n, dtype=torch.bool, device=q.device)
    return out.index_copy(2, rows, rows_attention(q, k, v, rows, keep, is_causal, scale, 0.0))


def bigbird_parts(q: Tensor, k: Tensor, v: Tensor, picks: Tensor, w: int, scale: float) -> Tensor:
    """BigBird-ITC on k >= 3 blocks of `w`, every random pick present (`picks` `[k, h, r]`), q, k, v `[b, h, n, d]`
    -> `[b, h, n, d]`.

    Query blocks 1 .. k - 2 against: their window (one part reading overlapping 3-block key windows in place; the
    last window is shorter when the last block is), the global blocks outside their window (keys gathered once,
    shared by the blocks), their random blocks (gathered per block and head). The global blocks' queries attend
    to the whole sequence, as in the torch path.
    """
    n = q.shape[2]
    blocks = -(-n // w)
    last = n - (blocks - 1) * w  # length of the last block
    inner = blocks - 2  # query blocks 1 .. k - 2
    exact = last == w  # the last window has 3 whole blocks
    parts = [Part(w, inner - (not exact), w, 0, 3 * w, w, w)]
    if not exact:
        parts.append(Part((blocks - 2) * w, 1, w, (blocks - 3) * w, 2 * w + last))
    parts = [part for part in parts if part.count > 0]
    # Extra keys: block 0 (w keys), then the last block (`last` keys).
    if blocks >= 5:
        parts.append(Part(2 * w, blocks - 4, w, 0, w + last, w, 0, source="extra"))
    if blocks >= 4:
        parts.append(Part(w, 1, w, w, last, source="extra"))  # block 1: block 0 is in its window
        parts.append(Part((blocks - 2) * w, 1, w, 0, w, source="extra"))  # block k - 2: so is the last block
    if picks.shape[-1]:
        parts.append(Part(w, inner, w, 0, picks.shape[-1] * w, w, source="gather", index=picks[1:-1], block=w))
    extra = [torch.cat([x[:, :, :w], x[:, :, (blocks - 1) * w :]], dim=2) for x in (k, v)]
    out = parts_attention(q, k, v, parts, scale, *extra)
    rows = torch.cat([torch.arange(w, device=q.device), torch.arange((blocks - 1) * w, n, device=q.device)])
    keep = torch.ones(1, n, dtype=torch.bool, device=q.device)
    return out.index_copy(2, rows, rows_attention(q, k, v, rows, keep, False, scale, 0.0))
