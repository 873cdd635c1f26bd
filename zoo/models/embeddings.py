"""Inputs of the 1-D models: DNA tokens, k-mers, time-series patches (PatchTST, RevIN), and positions.

- DNA at nucleotide level: one token per base, vocabulary `DNA_TOKENS` (pad 0, cls, mask, A, C, G, T, N).
- k-mers: every window of `k` bases is one of `4**k` tokens plus specials (a window holding N, a special or
  padding within the sequence is the last id, "other"), as in DNABERT (Ji et al. 2021,
  https://doi.org/10.1093/bioinformatics/btab083).
  Both vocabularies are those of `zoo.data.dna.packaged.DNATokenizer` (k = 1 and k > 1).
- Time series by patching: "A Time Series is Worth 64 Words" (PatchTST, Nie et al. 2023),
  https://arxiv.org/abs/2211.14730; channel-independent (each channel its own sequence, weights shared) or
  channel-mixing (a patch is all channels' steps concatenated).
- RevIN: "Reversible Instance Normalization for Accurate Time-Series Forecasting against Distribution Shift"
  (Kim et al. 2022), https://openreview.net/forum?id=cGDAkQo1C0p
- Positions: learned (resampled past their table), sinusoidal (Vaswani et al. 2017,
  https://arxiv.org/abs/1706.03762), rotary (RoFormer, Su et al. 2021, https://arxiv.org/abs/2104.09864).

Every embedding takes a mask (True = keep) and returns the token mask with the tokens; values at padded
positions never reach a kept token.

Letter legend: b - batch, c - channels, l - input length (bases or time steps), n - tokens, p - patch length,
d - model dim (head dim for rotary), k - k-mer length, h - heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from timm.layers.pos_embed_sincos import apply_rot_embed, freq_bands
from torch import Tensor, nn

__all__ = [
    "DNA_BASE_IDS",
    "DNA_CLS",
    "DNA_MASK",
    "DNA_PAD",
    "DNA_TOKENS",
    "KMER_SPECIALS",
    "KmerEmbedding",
    "PatchEmbedding",
    "RevIN",
    "RevINStatsEmbedding",
    "TokenEmbedding",
    "apply_rotary",
    "kmer_vocab_size",
    "num_patches",
    "resample_positions",
    "rotary_tables",
    "sinusoidal_positions",
]

# Nucleotide vocabulary, ids = positions in this tuple, as `zoo.data.dna.packaged` (PAD_ID, CLS_ID, MASK_ID = 0, 1, 2).
# Another layout works too: every embedding takes `vocab_size`, `pad_id` and the ids of A, C, G, T as arguments.
DNA_TOKENS = ("<pad>", "<cls>", "<mask>", "A", "C", "G", "T", "N")
DNA_PAD, DNA_CLS, DNA_MASK = 0, 1, 2
DNA_BASE_IDS = (3, 4, 5, 6)

# k-mer vocabulary: these specials, then the 4**k k-mers in base-4 order (A=0, C=1, G=2, T=3, first base most
# significant), then one "other" id for a window holding anything else.
KMER_SPECIALS = ("<pad>", "<cls>", "<mask>")
KMER_PAD = 0


def kmer_vocab_size(k: int) -> int:
    """Specials + `4**k` k-mers + "other" (whose id is the last one)."""
    return len(KMER_SPECIALS) + 4**k + 1


def _check_mask(mask: Tensor | None, shape: tuple[int, int], what: str) -> Tensor | None:
    if mask is not None and (mask.shape != shape or mask.dtype != torch.bool):
        raise ValueError(f"{what} mask must be bool {list(shape)} (True = keep), got {mask.dtype} {list(mask.shape)}")
    return mask


class TokenEmbedding(nn.Module):
    """Token ids `[b, n]` -> `[b, n, d]`; one vector per id (nucleotides by default, `DNA_TOKENS`)."""

    def __init__(self, dim: int, *, vocab_size: int = len(DNA_TOKENS), pad_id: int = DNA_PAD) -> None:
        super().__init__()
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id={pad_id} is outside the vocabulary of {vocab_size} tokens")
        self.vocab_size, self.pad_id = vocab_size, pad_id
        self.weight = nn.Parameter(torch.randn(vocab_size, dim) * 0.02)

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """tokens `[b, n]` long, mask `[b, n]` -> embeddings `[b, n, d]`, mask `[b, n]`."""
        _check_mask(mask, tokens.shape, "token")
        if mask is not None:
            # Whatever id sits at a padded position, the embedding sees the pad id.
            tokens = tokens.masked_fill(~mask, self.pad_id)
        return F.embedding(tokens, self.weight), mask


class KmerEmbedding(nn.Module):
    """Nucleotide ids `[b, l]` -> one token per window of `k` bases every `stride` bases -> `[b, n, d]`.

    `n = ceil(max(l - k, 0) / stride) + 1`; the last window is completed with padding. A window is kept when any
    of its bases is kept; a kept window holding N, a special or a padded base is "other" (`other_id`). Unlike
    `zoo.data.dna.packaged.DNATokenizer`, which drops a tail shorter than k, the tail becomes one more window.
    """

    def __init__(
        self,
        dim: int,
        *,
        k: int = 3,
        stride: int | None = None,
        pad_id: int = DNA_PAD,
        base_ids: tuple[int, int, int, int] = DNA_BASE_IDS,
    ) -> None:
        super().__init__()
        stride = k if stride is None else stride
        if k < 1 or not 1 <= stride <= k:
            raise ValueError(f"k={k} must be >= 1 and stride={stride} within [1, k]")
        self.k, self.stride, self.pad_id = k, stride, pad_id
        self.vocab_size = kmer_vocab_size(k)
        self.other_id = self.vocab_size - 1
        self.embedding = TokenEmbedding(dim, vocab_size=self.vocab_size, pad_id=KMER_PAD)
        lookup = torch.full((max(base_ids) + 1,), -1, dtype=torch.long)
        lookup[list(base_ids)] = torch.arange(4)
        self.register_buffer("base_lookup", lookup, persistent=False)
        self.register_buffer("place", 4 ** torch.arange(k - 1, -1, -1), persistent=False)

    def num_tokens(self, length: int) -> int:
        return math.ceil(max(length - self.k, 0) / self.stride) + 1

    def kmer_ids(self, tokens: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Nucleotide ids `[b, l]`, mask `[b, l]` -> k-mer ids `[b, n]`, mask `[b, n]`."""
        _check_mask(mask, tokens.shape, "nucleotide")
        keep = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask
        length = tokens.shape[1]
        extra = (self.num_tokens(length) - 1) * self.stride + self.k - length
        tokens = F.pad(tokens.masked_fill(~keep, self.pad_id), (0, extra), value=self.pad_id)
        keep = F.pad(keep, (0, extra), value=False)
        windows, window_keep = tokens.unfold(1, self.k, self.stride), keep.unfold(1, self.k, self.stride)
        in_table = windows < self.base_lookup.numel()
        digits = self.base_lookup[windows.clamp(max=self.base_lookup.numel() - 1)].masked_fill(~in_table, -1)
        valid = (digits >= 0).all(-1)
        ids = ((digits.clamp(min=0) * self.place).sum(-1) + len(KMER_SPECIALS)).masked_fill(~valid, self.other_id)
        kept = window_keep.any(-1)
        return ids.masked_fill(~kept, KMER_PAD), kept

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Nucleotide ids `[b, l]`, mask `[b, l]` -> `[b, n, d]`, mask `[b, n]` (None when `mask` is None)."""
        ids, kept = self.kmer_ids(tokens, mask)
        return self.embedding(ids, kept)[0], None if mask is None else kept


def num_patches(length: int, patch_len: int, stride: int) -> int:
    """PatchTST's patch count: `(l - p) // s + 2` (the end is replicate-padded by `s` steps)."""
    if length < patch_len:
        raise ValueError(f"series length {length} is shorter than patch_len {patch_len}")
    return (length - patch_len) // stride + 2


class PatchEmbedding(nn.Module):
    """Time series `[b, c, l]` -> patch tokens, PatchTST style (https://arxiv.org/abs/2211.14730).

    The series is padded at the end by repeating its last step `stride` times, then cut into
    `num_patches(l, p, s)` windows of `patch_len` steps every `stride` steps. Channel-independent: each channel
    is its own sequence, folded into the batch, `b c l -> (b c) n p -> (b c) n d`. Channel-mixing: a patch is the
    steps of every channel, `b n (c p) -> b n d`. A patch is kept when any of its steps is kept; padded steps are
    zeroed first, so their values never reach a token.
    """

    def __init__(
        self, dim: int, *, num_channels: int, patch_len: int = 16, stride: int = 8, channel_independent: bool = True
    ) -> None:
        super().__init__()
        if patch_len < 1 or stride < 1:
            raise ValueError(f"patch_len={patch_len} and stride={stride} must be >= 1")
        self.num_channels, self.patch_len, self.stride = num_channels, patch_len, stride
        self.channel_independent = channel_independent
        self.proj = nn.Linear(patch_len if channel_independent else num_channels * patch_len, dim)

    def num_patches(self, length: int) -> int:
        return num_patches(length, self.patch_len, self.stride)

    def patchify(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """`x: [b, c, l]`, mask `[b, l]` -> patches `[b, c, n, p]`, mask `[b, n]`."""
        b, c, length = x.shape
        if c != self.num_channels:
            raise ValueError(f"series has {c} channels, the embedding was built for {self.num_channels}")
        self.num_patches(length)
        _check_mask(mask, (b, length), "time step")
        if mask is not None:
            x = x.masked_fill(~mask[:, None], 0.0)
        # PatchTST's ReplicationPad1d((0, stride)): the last step repeated, so the last window is full.
        x = F.pad(x, (0, self.stride), mode="replicate")
        patches = x.unfold(-1, self.patch_len, self.stride)
        if mask is None:
            return patches, None
        keep = torch.cat([mask, mask[:, -1:].expand(b, self.stride)], dim=1)
        return patches, keep.unfold(-1, self.patch_len, self.stride).any(-1)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """`x: [b, c, l]`, mask `[b, l]` -> tokens `[(b c), n, d]` (independent) or `[b, n, d]` (mixing), mask."""
        patches, keep = self.patchify(x, mask)
        if self.channel_independent:
            tokens = rearrange(patches, "b c n p -> (b c) n p")
            keep = None if keep is None else repeat(keep, "b n -> (b c) n", c=self.num_channels)
        else:
            tokens = rearrange(patches, "b c n p -> b n (c p)")
        return self.proj(tokens), keep


class RevIN(nn.Module):
    """Reversible instance normalisation (Kim et al. 2022): per series and channel, with a learnable affine.

    `normalize` subtracts the mean and divides by the standard deviation over the kept steps of each
    (sample, channel), then applies `weight`, `bias`; `denormalize` undoes both on the model's forecasts, so the
    network sees stationary inputs and the forecast returns to the input's scale.
    """

    def __init__(self, num_channels: int, *, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_channels)) if affine else None

    def statistics(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`x: [b, c, l]`, mask `[b, l]` -> mean, std `[b, c, 1]` over kept steps (computed without gradient)."""
        with torch.no_grad():
            if mask is None:
                mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
            else:
                # masked_fill, not a product with the mask: a NaN at a missing step must not reach the sums.
                drop = ~mask[:, None]
                count = mask[:, None].sum(-1, keepdim=True).clamp_min(1).to(x.dtype)
                mean = x.masked_fill(drop, 0.0).sum(-1, keepdim=True) / count
                var = (x - mean).square().masked_fill(drop, 0.0).sum(-1, keepdim=True) / count
        return mean, (var + self.eps).sqrt()

    def normalize(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """`x: [b, c, l]` -> normalised `[b, c, l]` (zero at padded steps) and the statistics for `denormalize`."""
        stats = self.statistics(x, mask)
        out = (x - stats[0]) / stats[1]
        if self.weight is not None:
            out = out * self.weight[:, None] + self.bias[:, None]
        if mask is not None:
            out = out.masked_fill(~mask[:, None], 0.0)
        return out, stats

    def denormalize(self, y: Tensor, stats: tuple[Tensor, Tensor]) -> Tensor:
        """`y: [b, c, h]` in normalised units -> `[b, c, h]` in the input's units."""
        if self.weight is not None:
            y = (y - self.bias[:, None]) / (self.weight[:, None] + self.eps**2)
        return y * stats[1] + stats[0]


class RevINStatsEmbedding(nn.Module):
    """RevIN's statistics back in as an embedding added to every token: the level and scale that instance
    normalisation removes (the idea of the Non-stationary Transformer, Liu et al. 2022,
    https://arxiv.org/abs/2205.14415, which feeds them to the attention instead).

    `(mean, std)`, each `[b, c, 1]` -> `[(b c), 1, d]` (channel-independent tokens) or `[b, 1, d]` (channel-mixing),
    from `asinh(mean)` and `log(std)`, which stay in a small range over series of any unit. Zero-initialised: a
    model starts as plain RevIN and learns how much the scale tells.
    """

    def __init__(self, dim: int, num_channels: int, channel_independent: bool = True) -> None:
        super().__init__()
        self.channel_independent = channel_independent
        self.proj = nn.Linear(2 if channel_independent else 2 * num_channels, dim)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, stats: tuple[Tensor, Tensor]) -> Tensor:
        mean, std = stats
        features = torch.cat([torch.asinh(mean), std.log()], dim=-1)
        pattern = "b c f -> (b c) 1 f" if self.channel_independent else "b c f -> b 1 (c f)"
        return self.proj(rearrange(features, pattern))


def sinusoidal_positions(length: int, dim: int, *, offset: int = 0, base: float = 10000.0, device=None) -> Tensor:
    """`[length, dim]` fixed sine / cosine positions for positions `offset .. offset + length - 1`."""
    if dim % 2:
        raise ValueError(f"sinusoidal positions need an even dim, got {dim}")
    position = torch.arange(offset, offset + length, device=device, dtype=torch.float32)
    angle = position[:, None] * freq_bands(dim, temperature=base, step=2, device=device)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)


def resample_positions(table: Tensor, length: int) -> Tensor:
    """Learned positions `[1, m, d]` -> `[1, length, d]`: the table itself when it is long enough, otherwise
    linearly interpolated over the whole range (the 1-D counterpart of timm's `resample_abs_pos_embed`)."""
    if length <= table.shape[1]:
        return table[:, :length]
    resampled = F.interpolate(rearrange(table, "1 m d -> 1 d m"), size=length, mode="linear", align_corners=False)
    return rearrange(resampled, "1 d n -> 1 n d")


def rotary_tables(positions: Tensor, head_dim: int, *, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """positions `[n]` -> cos, sin `[n, d]` for RoFormer's rotation of `d / 2` channel pairs (float32)."""
    if head_dim % 2:
        raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
    angle = positions.float()[:, None] * freq_bands(head_dim, temperature=base, step=2, device=positions.device)
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos(), angle.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`x: [b, h, n, d]` rotated by position: pair (i, i + d/2) turns by angle `position * base^(-2i/d)`.

    The half-split pairing (GPT-NeoX) rather than RoFormer's interleaved pairs: the same rotation up to a fixed
    permutation of channels, without strided indexing (timm's `half` layout, `apply_rot_embed`). `q.k` then depends on
    positions only through `i - j`. The rotation runs in the tables' float32 (or `x`'s wider dtype), cast back to
    `x`'s dtype (cast here: timm 1.0.29's `apply_rot_embed` returns the promoted float32, 1.0.31's casts back).
    """
    return apply_rot_embed(x, sin, cos, half=True).to(x.dtype)
