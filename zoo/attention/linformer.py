"""Linformer: "Linformer: Self-Attention with Linear Complexity" (Wang et al. 2020), https://arxiv.org/abs/2006.04768

Keys and values are projected along the sequence by learned `E, F: [r, max_seq_len]` (r = `k` in the paper) before
exact attention, so the attention matrix is `[n, r]` and cost is linear in n. An input shorter than
`max_seq_len` uses the leading n columns of E and F; a longer one is an error. Padded keys and values are zeroed
before the projection, so they add nothing to any projected key or value.

Sharing (paper section 4): `share="none"` is the paper's headwise sharing (one E and one F per layer, shared by
its heads); `"kv"` uses E for values too (F = E); `"layerwise"` shares one E across every layer of a model, for
keys and values. See `LinformerAttention` for how layerwise sharing finds "every layer of a model".

This file also holds the option checks and the masked softmax the projection-family files (nystrom, synthesizer)
share.
"""
from __future__ import annotations

import math
import weakref
from typing import Literal, Optional

import torch
from torch import Tensor, nn

from ._common import AttentionBase, masked_fill_keys
from ._registry import register_attention
from .softmax import softmax_attention

__all__ = ["LinformerAttention", "linformer_attention", "check_int", "check_seq_len", "masked_softmax"]

SHARING = ("none", "kv", "layerwise")


def check_int(name: str, value: int, minimum: int) -> None:
    """ValueError naming `value` unless it is an integer (not a bool) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def check_seq_len(attention: str, length: int, max_seq_len: int) -> None:
    """ValueError for an input longer than the `max_seq_len` a variant was built for."""
    if length > max_seq_len:
        raise ValueError(
            f"attention {attention!r} was built with max_seq_len={max_seq_len} but got a sequence of {length} "
            f"tokens; build it with max_seq_len >= {length}"
        )


def masked_softmax(logits: Tensor, keep: Optional[Tensor]) -> Tensor:
    """Softmax over the last dim of `logits` where `keep` (bool, broadcastable, True = keep) allows.

    Dropped entries get exactly zero weight and add nothing to the normaliser; a row with nothing kept is all
    zeros (not NaN, not uniform), with finite gradients.
    """
    if keep is None:
        return logits.softmax(dim=-1)
    weights = logits.masked_fill(~keep, torch.finfo(logits.dtype).min).softmax(dim=-1)
    return weights * keep


def linformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    f: Tensor,
    mask: Optional[Tensor] = None,
    *,
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
    fused: bool = True,
) -> Tensor:
    """Linformer attention `softmax(q (E k)^T * scale) (F v)`.

    q, k, v: `[b, h, n, d]`; e, f: `[r, n]` (the leading n columns of the `[r, max_seq_len]` projections);
    mask: `[b, n]` bool key padding mask, True = keep -> `[b, h, n, d]`. `fused` picks SDPA or the explicit
    softmax for the `[n, r]` attention.
    """
    if e.shape[-1] != k.shape[-2] or f.shape[-1] != v.shape[-2]:
        raise ValueError(f"projections {tuple(e.shape)}, {tuple(f.shape)} do not fit {k.shape[-2]} keys")
    k_proj = torch.einsum("rm,bhmd->bhrd", e, masked_fill_keys(k, mask))  # b h r d
    v_proj = torch.einsum("rm,bhmd->bhrd", f, masked_fill_keys(v, mask))  # b h r d
    return softmax_attention(q, k_proj, v_proj, scale=scale, dropout_p=dropout_p, fused=fused)


def _init_projection(weight: Tensor) -> Tensor:
    # The authors' fairseq code: nn.Linear(max_seq_len, k) initialised xavier-uniform with gain 1/sqrt(2).
    return nn.init.xavier_uniform_(weight, gain=1 / math.sqrt(2))


# Layerwise sharing: one projection per (bound attention class, max_seq_len, k). Weak keys, so a class (and its
# shared parameter) is freed with the last model that uses it.
_LAYERWISE: "weakref.WeakKeyDictionary[type, dict[tuple, nn.Parameter]]" = weakref.WeakKeyDictionary()


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

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        k: int = 256,
        max_seq_len: int = 4096,
        share: Literal["none", "kv", "layerwise"] = "none",
        fused: bool = True,
        **timm_args,
    ) -> None:
        check_int("k", k, 1)
        check_int("max_seq_len", max_seq_len, 1)
        if k > max_seq_len:
            raise ValueError(f"k={k} must be <= max_seq_len={max_seq_len}: the projection cannot add keys")
        if share not in SHARING:
            raise ValueError(f"share={share!r} is not one of {', '.join(map(repr, SHARING))}")
        super().__init__(dim, num_heads, **timm_args)
        self.k = k
        self.max_seq_len = max_seq_len
        self.share = share
        self.fused = fused
        device, dtype = timm_args.get("device"), timm_args.get("dtype")
        if share == "layerwise":
            self.compress = _layerwise_projection(type(self), max_seq_len, k, device, dtype)
        elif share == "kv":
            self.compress = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, device=device, dtype=dtype)))
        else:
            self.compress_k = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, device=device, dtype=dtype)))
            self.compress_v = nn.Parameter(_init_projection(torch.empty(k, max_seq_len, device=device, dtype=dtype)))

    def projections(self, length: int) -> tuple[Tensor, Tensor]:
        """E and F for a sequence of `length` tokens: the leading columns, each `[k, length]`."""
        check_seq_len(self.attention_name, length, self.max_seq_len)
        if self.share == "none":
            return self.compress_k[:, :length], self.compress_v[:, :length]
        return self.compress[:, :length], self.compress[:, :length]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool) -> Tensor:
        e, f = self.projections(k.shape[-2])
        dropout_p = self.attn_drop.p if self.training else 0.0
        return linformer_attention(q, k, v, e, f, mask, scale=self.scale, dropout_p=dropout_p, fused=self.fused)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}, max_seq_len={self.max_seq_len}, share={self.share!r}"
