"""Sparse Transformer: "Generating Long Sequences with Sparse Transformers" (Child et al. 2019),
https://arxiv.org/abs/1904.10509

The factorised patterns of Section 4.2 with stride l = `block`, merged into one head (one softmax over the union of
both components, a key in both counted once):
- `strided`: a local window, |i - j| <= l (causal: 0 <= i - j <= l), and the keys a multiple of l away,
  (i - j) mod l = 0: a query sees 2l + 1 + n / l keys (causal about half), O(n sqrt(n)) for l ~ sqrt(n).
  Meant for data with a period, such as image rows.
- `fixed`: the query's own block of l positions, and the last c = `num_summary` positions of every block (the
  summaries): l + c n / l keys per query. Meant for text.
Causal (the paper's setting) restricts both to j <= i. With A(i) the keys query i sees,

    out_i = sum_{j in A(i)} softmax_j(q_i . k_j * scale) v_j.

`sparse_reference` writes this out on dense `[n, n]` scores. Faster paths (`choose_path` picks one per call):
FlexAttention; and the torch path here, each component in its own layout (blocks; positions regrouped by
i mod l; all queries against the summaries), the two merged through their log normalisers, in float32. A block
covering the sequence is exact softmax attention.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import torch
from einops import rearrange
from torch import Tensor

from .._validate import check_bool, check_int
from ._blocks import (
    BlockLayout,
    allowed_attention,
    band_keep,
    merge_partials,
    partial_attention,
    window_layout,
)
from ._common import AttentionBase
from ._flex import FlexMask, check_backend, flex_attend
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = ["SparseAttention", "sparse_allowed", "sparse_attention", "sparse_mask", "sparse_reference"]

PATTERNS = ("strided", "fixed")


def _sees(q_idx: Tensor, kv_idx: Tensor, pattern: str, block: int, num_summary: int, is_causal: bool) -> Tensor:
    """True where query position `q_idx` sees key position `kv_idx` (broadcast), from the paper's definition of
    each pattern: the dense reference and the FlexAttention pattern both."""
    offsets = q_idx - kv_idx
    if pattern == "strided":
        allowed = (offsets.abs() <= block) | (offsets % block == 0)
    else:
        allowed = (q_idx // block == kv_idx // block) | (kv_idx % block >= block - num_summary)
    return allowed & (offsets >= 0) if is_causal else allowed


def sparse_allowed(n: int, pattern: str, block: int, num_summary: int, is_causal: bool, device: torch.device) -> Tensor:
    """`[n, n]` bool, True where query i sees key j."""
    positions = torch.arange(n, device=device)
    return _sees(positions[:, None], positions, pattern, block, num_summary, is_causal)


@functools.lru_cache(maxsize=64)
def sparse_mask(length: int, pattern: str, block: int, num_summary: int, is_causal: bool = False) -> FlexMask:
    """The FlexAttention pattern over `length` positions (`_sees`)."""

    def mask_mod(b, h, q_idx, kv_idx):
        return _sees(q_idx, kv_idx, pattern, block, num_summary, is_causal)

    return FlexMask(mask_mod, length)


def sparse_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    pattern: Literal["strided", "fixed"] = "strided",
    block: int = 128,
    num_summary: int = 8,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The equation on dense scores, O(n^2): the tests' oracle.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`.
    """
    allowed = sparse_allowed(q.shape[-2], pattern, block, num_summary, is_causal, q.device)  # [n, n]
    return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)


def sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    pattern: Literal["strided", "fixed"] = "strided",
    block: int = 128,
    num_summary: int = 8,
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Sparse Transformer attention, one merged head, on the path `choose_path` picks (FlexAttention is the
    module's).

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]` in v's dtype.
    Any n: padded to a multiple of `block` inside, the output unpadded. `reference=True`: `sparse_reference`.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"pattern={pattern!r} is not one of {PATTERNS}")
    options = {"pattern": pattern, "block": block, "num_summary": num_summary, "scale": scale, "dropout_p": dropout_p}
    if choose_path(q, reference=reference) is Path.REFERENCE:
        return sparse_reference(q, k, v, mask, is_causal, **options)
    return _sparse_merged(q, k, v, mask, is_causal, **options)


def _sparse_merged(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    *,
    pattern: str,
    block: int,
    num_summary: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """The torch path: the local component in blocks, the strided or summary component in its own layout, merged
    through their log normalisers."""
    b, _, n, d = q.shape
    scale = d**-0.5 if scale is None else scale
    out_dtype = v.dtype
    # Log normalisers of exponentials: float32 inside for half-precision inputs.
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = (x.to(torch.promote_types(x.dtype, torch.float32)) for x in (q, k, v))
        if pattern == "strided":
            local = window_layout(n, block, is_causal, min_block=block)
            allowed = band_keep(local.offsets(q.device), block, is_causal)
        else:
            local = BlockLayout(n, min(block, n), before=0, after=0)
            allowed = band_keep(local.offsets(q.device), local.block, is_causal)
        keep = local.keep(mask, q.device)  # [b or 1, k * w]
        local_keep = local.window_keep(keep)[:, :, None, None, :] & allowed
        out, lse = partial_attention(
            rearrange(local.pad(q), "b h (k w) d -> b k h w d", w=local.block),
            local.windows(k).unflatten(0, (b, local.num_blocks)),
            local.windows(v).unflatten(0, (b, local.num_blocks)),
            local_keep,
            scale,
            dropout_p,
        )
        parts = [(rearrange(out, "b k h w d -> b h (k w) d"), rearrange(lse, "b k h w -> b h (k w)"))]
        # The padded length is a multiple of block whenever a second component exists.
        padded = [local.pad(x) for x in (q, k, v)]
        if pattern == "strided" and n > 2 * block:
            parts.append(_strided(*padded, keep, is_causal, block, scale, dropout_p))
        elif pattern == "fixed" and local.num_blocks > 1:
            parts.append(_summaries(*padded, keep, is_causal, local, num_summary, scale, dropout_p))
        out = merge_partials(*zip(*parts, strict=True)) if len(parts) > 1 else parts[0][0]
    return out[:, :, :n].to(out_dtype)


def _strided(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, is_causal: bool, stride: int, scale: float, dropout_p: float
):
    """The strided component without the window's keys: i attends to j = i - t * stride, |t| >= 2 (causal t >= 2).

    q, k, v: `[b, h, n, d]` and keep `[b or 1, n]` with n a multiple of `stride` -> out `[b, h, n, d]`, lse `[b, h, n]`.
    """
    q, k, v = (rearrange(x, "b h (t r) d -> b h r t d", r=stride) for x in (q, k, v))
    steps = torch.arange(q.shape[-2], device=q.device)
    offsets = steps[:, None] - steps
    allowed = (offsets >= 2) if is_causal else (offsets.abs() >= 2)
    keep = rearrange(keep, "b (t r) -> b 1 r 1 t", r=stride) & allowed
    out, lse = partial_attention(q, k, v, keep, scale, dropout_p)
    return rearrange(out, "b h r t d -> b h (t r) d"), rearrange(lse, "b h r t -> b h (t r)")


def _summaries(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor,
    is_causal: bool,
    layout: BlockLayout,
    c: int,
    scale: float,
    dropout_p: float,
):
    """The fixed pattern's summary component: every query against the last `c` positions of the other blocks
    (causal: of earlier blocks). q, k, v: `[b, h, k * w, d]`, keep `[b or 1, k * w]` -> out, lse."""
    w = layout.block
    k, v = (rearrange(x, "b h (k w) d -> b h k w d", w=w)[:, :, :, w - c :].flatten(2, 3) for x in (k, v))
    blocks = torch.arange(layout.num_blocks, device=q.device)
    query_block, key_block = blocks.repeat_interleave(w), blocks.repeat_interleave(c)
    allowed = (key_block < query_block[:, None]) if is_causal else (key_block != query_block[:, None])
    keep = rearrange(keep, "b (k w) -> b k w", w=w)[:, :, w - c :].flatten(1)[:, None, None, :] & allowed
    return partial_attention(q, k, v, keep, scale, dropout_p)


@register_attention("sparse")
class SparseAttention(AttentionBase):
    """Sparse Transformer, one merged head: `pattern` "strided" (default) or "fixed", stride `block` (128),
    `num_summary` summary positions per block for "fixed" (c = 8); `reference=True`: the dense reference."""

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"block": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        pattern: Literal["strided", "fixed"] = "strided",
        block: int = 128,
        num_summary: int = 8,
        backend: Literal["auto", "torch", "flex"] = "auto",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        if pattern not in PATTERNS:
            raise ValueError(f"pattern={pattern!r} is not allowed: expected one of {PATTERNS}")
        self.pattern = pattern
        self.block = check_int("block", block, 2)
        self.num_summary = check_int("num_summary", num_summary, 1)
        self.reference = check_bool("reference", reference)
        self.backend = check_backend(backend, self.attn_drop.p, self.reference)
        if pattern == "fixed" and num_summary > block:
            raise ValueError(f"num_summary={num_summary} is larger than block={block}: expected 1..{block}")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        path = choose_path(q, reference=self.reference, backend=self.backend, dropout_p=dropout_p, flex=True)
        if path is Path.FLEX:
            pattern = sparse_mask(q.shape[-2], self.pattern, self.block, self.num_summary, is_causal)
            return flex_attend(q, k, v, pattern, mask, scale=self.scale)
        options = {"pattern": self.pattern, "block": self.block, "num_summary": self.num_summary}
        run = sparse_reference if path is Path.REFERENCE else _sparse_merged
        return run(q, k, v, mask, is_causal, **options, scale=self.scale, dropout_p=dropout_p)

    def extra_repr(self) -> str:
        extra = f", num_summary={self.num_summary}" if self.pattern == "fixed" else ""
        return f"{super().extra_repr()}, pattern={self.pattern!r}, block={self.block}{extra}, backend={self.backend!r}"
