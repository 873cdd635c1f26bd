"""Linformer: "Linformer: Self-Attention with Linear Complexity" (Wang et al. 2020), https://arxiv.org/abs/2006.04768

Keys and values are projected along the sequence by learned `E, F: [r, max_seq_len]` (r = `k` in the paper) before
exact attention,

    out = softmax(q (E k)^T * scale) (F v),

so the attention matrix is `[n, r]` and cost is linear in n. An input shorter than
`max_seq_len` uses the leading n columns of E and F; a longer one is an error. Padded keys and values are zeroed
before the projection, so they add nothing to any projected key or value.

Sharing (paper section 4): `share="none"` is the paper's headwise sharing (one E and one F per layer, shared by
its heads); `"kv"` uses E for values too (F = E); `"layerwise"` shares one E across every layer of a model, for
keys and values. See `LinformerAttention` for how layerwise sharing finds "every layer of a model".

`linformer_reference` writes the equation out (the tests' oracle); the torch path runs the `[n, r]` attention on
SDPA. This file also holds the sequence-length check, the masked softmax and the blocked attention (its kernel in
`_kernels.blocked_softmax`) the projection-family files (nystrom, synthesizer) share.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from .._validate import check_bool, check_int
from ._common import AttentionBase, masked_fill_keys
from ._kernels.blocked_softmax import BlockedAttention
from ._paths import Path, choose_path
from ._registry import register_attention
from .softmax import softmax_attention, softmax_reference

__all__ = [
    "LinformerAttention",
    "blocked_attention",
    "check_seq_len",
    "linformer_attention",
    "linformer_reference",
    "masked_softmax",
]

SHARING = ("none", "kv", "layerwise")


def check_seq_len(attention: str, length: int, max_seq_len: int) -> None:
    """ValueError for an input longer than the `max_seq_len` a variant was built for."""
    if length > max_seq_len:
        raise ValueError(
            f"attention {attention!r} was built with max_seq_len={max_seq_len} but got a sequence of {length} "
            f"tokens; build it with max_seq_len >= {length}"
        )


def masked_softmax(logits: Tensor, keep: Tensor | None) -> Tensor:
    """Softmax over the last dim of `logits` where `keep` (bool, broadcastable, True = keep) allows.

    Dropped entries get exactly zero weight and add nothing to the normaliser; a row with nothing kept is all
    zeros (not NaN, not uniform), with finite gradients.
    """
    if keep is None:
        return logits.softmax(dim=-1)
    weights = logits.masked_fill(~keep, torch.finfo(logits.dtype).min).softmax(dim=-1)
    return weights * keep


def blocked_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None = None) -> Tensor:
    """`softmax(q k^T) v` over the kept keys (no scale: fold it into q or k), never storing `[n, m]`.

    q: `[b, h, n, d]`, k: `[b, h, m, d]`, v: `[b, h, m, e]`, keep: `[b, m]` bool (True = keep) or None -> `[b, h, n, e]`
    (laid out as `[b, n, h, e]`, so merging the heads is a view). Meant for the projection family, where one
    side is short (r landmarks or projected keys): blocks of queries and keys, online softmax over the key
    blocks, the weights recomputed in backward from the saved log-normaliser (as flash attention does). A
    query with no kept key gets zeros, as `masked_softmax` gives. Computed in q's dtype. Under `torch.export`, whose
    tracing refuses the blocks' `out=` workspaces, the `[n, m]` weights are formed instead.
    """
    if choose_path(q, kernel=lambda: True) is Path.KERNEL:
        return BlockedAttention.apply(q, k, v, keep)
    return masked_softmax(q @ k.transpose(-2, -1), None if keep is None else keep[:, None, None, :]) @ v


def linformer_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    f: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The equation `softmax(q (E k)^T * scale) (F v)` written out: the tests' oracle.

    q, k, v: `[b, h, n, d]`; e, f: `[r, n]`; mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`.
    """
    k_proj, v_proj = _projected(k, v, e, f, mask)
    return softmax_reference(q, k_proj, v_proj, scale=scale, dropout_p=dropout_p)


def _projected(k: Tensor, v: Tensor, e: Tensor, f: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """`E k` and `F v`, `[b, h, r, d]`, the padded keys and values zeroed first."""
    if e.shape[-1] != k.shape[-2] or f.shape[-1] != v.shape[-2]:
        raise ValueError(f"projections {tuple(e.shape)}, {tuple(f.shape)} do not fit {k.shape[-2]} keys")
    k_proj = torch.einsum("rm,bhmd->bhrd", e, masked_fill_keys(k, mask))  # b h r d
    v_proj = torch.einsum("rm,bhmd->bhrd", f, masked_fill_keys(v, mask))  # b h r d
    return k_proj, v_proj


def linformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    f: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Linformer attention `softmax(q (E k)^T * scale) (F v)`.

    q, k, v: `[b, h, n, d]`; e, f: `[r, n]` (the leading n columns of the `[r, max_seq_len]` projections);
    mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. The `[n, r]` attention runs on SDPA, or
    `linformer_reference` with `reference=True`.
    """
    if choose_path(q, reference=reference) is Path.REFERENCE:
        return linformer_reference(q, k, v, e, f, mask, scale=scale, dropout_p=dropout_p)
    k_proj, v_proj = _projected(k, v, e, f, mask)
    return softmax_attention(q, k_proj, v_proj, scale=scale, dropout_p=dropout_p)


def _init_projection(weight: Tensor) -> Tensor:
    # The authors' fairseq code: nn.Linear(max_seq_len, k) initialised xavier-uniform with gain 1/sqrt(2).
    return nn.init.xavier_uniform_(weight, gain=1 / math.sqrt(2))


# Layerwise sharing: one projection per (bound attention class, max_seq_len, k). Weak keys, so a class (and its
# shared parameter) is freed with the last model that uses it.
_LAYERWISE: weakref.WeakKeyDictionary[type, dict[tuple, nn.Parameter]] = weakref.WeakKeyDictionary()


def _layerwise_projection(cls: type, max_seq_len: int, k: int, device, dtype) -> nn.Parameter:
    table = _LAYERWISE.setdefault(cls, {})
    if (max_seq_len, k) not in table:
        table[max_seq_len, k] = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, device=device, dtype=dtype)))
    return table[max_seq_len, k]


@register_attention("linformer")
class LinformerAttention(AttentionBase):
    """Linformer multi-head attention with timm's projections; non-causal (E and F mix the whole sequence).

    Parameters: `compress_k`, `compress_v` (`share="none"`) or one `compress` (`"kv"`, `"layerwise"`), each
    `[k, max_seq_len]`.

    Layerwise sharing: timm builds each block's attention from the `attn_layer` class alone, with no handle on
    the model, so the shared parameter is keyed by the module's class, `max_seq_len` and `k` (the first layer built
    picks its device and dtype; `model.to(...)` moves it once for all).
    `zoo.create_model` (and any caller of `attention_class(..., share="layerwise")`) makes a fresh bound class per
    call, so every layer of one model shares one E and two models built by two calls do not. Modules built
    directly from `LinformerAttention` or `create_attention` in one process all share one E per key. `deepcopy`
    keeps the sharing inside the copy. The state dict repeats the shared tensor under each layer's key (loading
    writes the same tensor each time); `model.parameters()` yields it once.
    """

    has_attention_weights = True
    test_options: ClassVar[dict] = {"k": 16, "max_seq_len": 64}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        k: int = 256,
        max_seq_len: int = 4096,
        share: Literal["none", "kv", "layerwise"] = "none",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        check_int("k", k, 1)
        check_int("max_seq_len", max_seq_len, 1)
        if k > max_seq_len:
            raise ValueError(f"k={k} must be <= max_seq_len={max_seq_len}: the projection cannot add keys")
        if share not in SHARING:
            raise ValueError(f"share={share!r} is not one of {', '.join(map(repr, SHARING))}")
        super().__init__(dim, num_heads, **timm_args)
        dd = self.factory_kwargs
        self.k = k
        self.max_seq_len = max_seq_len
        self.share = share
        self.reference = check_bool("reference", reference)
        if share == "layerwise":
            self.compress = _layerwise_projection(type(self), max_seq_len, k, **dd)
        elif share == "kv":
            self.compress = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, **dd)))
        else:
            self.compress_k = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, **dd)))
            self.compress_v = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, **dd)))

    def projections(self, length: int) -> tuple[Tensor, Tensor]:
        """E and F for a sequence of `length` tokens: the leading columns, each `[k, length]`."""
        check_seq_len(self.attention_name, length, self.max_seq_len)
        if self.share == "none":
            return self.compress_k[:, :length], self.compress_v[:, :length]
        return self.compress[:, :length], self.compress[:, :length]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        e, f = self.projections(k.shape[-2])
        dropout_p = self.attn_drop.p if self.training else 0.0
        return linformer_attention(q, k, v, e, f, mask, scale=self.scale, dropout_p=dropout_p, reference=self.reference)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}, max_seq_len={self.max_seq_len}, share={self.share!r}"
