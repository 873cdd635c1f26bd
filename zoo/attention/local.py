"""Sliding-window (local) attention: the local attention baseline of "Long Range Arena" (Tay et al. 2020),
https://arxiv.org/abs/2011.04006, and the sliding window of "Longformer" (Beltagy et al. 2020),
https://arxiv.org/abs/2004.05150.

    out_i = sum_{j in W(i)} softmax_j(q_i . k_j * scale) v_j,    W(i) = {j : |i - j| <= window}
                                                                   (causal: 0 <= i - j <= window)

`local_reference` writes this out on dense `[n, n]` scores. The paths that compute it faster
(`zoo.attention._paths.choose_path` picks one per call): FlexAttention on the band; the CPU flash parts
(`_kernels.windowed.local_parts`); and the torch path here, which cuts the sequence into blocks of the window
length, lets each block attend to itself and its neighbour blocks and keeps the exact window with a band mask:
memory and time O(n * window), no n x n tensor. A window as long as the sequence is exact softmax attention.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._blocks import allowed_attention, as_sdpa_mask, band_keep, position_offsets, window_layout
from ._common import AttentionBase
from ._flex import FlexMask, check_backend, flex_attend
from ._kernels.flash_parts import on_kept_prefixes, parts_apply, prefix_lengths
from ._kernels.windowed import local_parts
from ._paths import Path, choose_path
from ._registry import register_attention

__all__ = ["LocalAttention", "local_attention", "local_mask", "local_reference"]


def local_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 256,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The equation on dense scores, O(n^2): the tests' oracle.

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`.
    """
    allowed = band_keep(position_offsets(q.shape[-2], q.device), window, is_causal)  # [n, n]
    return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    window: int = 256,
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Sliding-window attention on the path `choose_path` picks (no FlexAttention here: that is the module's).

    q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. Any n: the
    sequence is padded to whole blocks inside and the output unpadded. `reference=True`: `local_reference`.
    """
    kernel = functools.partial(parts_apply, q, mask, dropout_p, min(window, q.shape[-2]))
    path = choose_path(q, reference=reference, kernel=kernel)
    return _local_on(path, q, k, v, mask, is_causal, window, scale, dropout_p)


def _local_on(
    path: Path,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    window: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """Sliding-window attention on `path`."""
    if path is Path.REFERENCE:
        return local_reference(q, k, v, mask, is_causal, window=window, scale=scale, dropout_p=dropout_p)
    if path is Path.FLEX:
        return flex_attend(q, k, v, local_mask(window, is_causal), mask, scale=scale)
    if path is Path.KERNEL:
        lengths = prefix_lengths(q, mask, dropout_p)
        if lengths is not None:
            run = functools.partial(local_attention, is_causal=is_causal, window=window, scale=scale)
            return on_kept_prefixes(run, q, k, v, lengths)
        return local_parts(q, k, v, is_causal, window, q.shape[-1] ** -0.5 if scale is None else scale)
    return _local_blocks(q, k, v, mask, is_causal, window, scale, dropout_p)


def _local_blocks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    window: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """The torch path: each block of queries against its window of key blocks, `[(b k), h, w, (s w)]` scores."""
    b, _, n, _ = q.shape
    layout = window_layout(n, window, is_causal)
    keep = layout.window_keep(layout.keep(mask, q.device))  # [b, k, (s w)]
    keep = keep[:, :, None, None, :] & band_keep(layout.offsets(q.device), window, is_causal)[None]
    out = F.scaled_dot_product_attention(
        layout.blocks(q),
        layout.windows(k),
        layout.windows(v),
        attn_mask=as_sdpa_mask(keep, b),
        dropout_p=dropout_p,
        scale=scale,
    )
    return layout.unblock(out, b)


@functools.lru_cache(maxsize=64)
def local_mask(window: int, is_causal: bool = False) -> FlexMask:
    """The FlexAttention pattern: |i - j| <= window (causal: 0 <= i - j <= window), as `band_keep`."""

    def mask_mod(b, h, q_idx, kv_idx):
        return band_keep(q_idx - kv_idx, window, is_causal)

    return FlexMask(mask_mod)


@register_attention("local")
class LocalAttention(AttentionBase):
    """Sliding-window attention: `window` positions each side (behind, when causal), default 256;
    `reference=True`: the dense reference."""

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"window": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        window: int = 256,
        backend: Literal["auto", "torch", "flex"] = "auto",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.window = check_int("window", window, 1)
        self.reference = check_bool("reference", reference)
        self.backend = check_backend(backend, self.attn_drop.p, self.reference)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        kernel = functools.partial(parts_apply, q, mask, dropout_p, min(self.window, q.shape[-2]))
        path = choose_path(
            q, reference=self.reference, backend=self.backend, dropout_p=dropout_p, flex=True, kernel=kernel
        )
        return _local_on(path, q, k, v, mask, is_causal, self.window, self.scale, dropout_p)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, backend={self.backend!r}"
