"""Synthesizer: "Synthesizer: Rethinking Self-Attention in Transformer Models" (Tay et al. 2020),
https://arxiv.org/abs/2005.00743

Attention weights synthesized without token-token dot products, `Y = softmax(B) G(X)`, `G` the value projection:

- dense: `B_i = W2 relu(W1 X_i + b1) + b2`, a per-token 2-layer MLP to `max_seq_len` logits, truncated to n;
- dense, factorized: two smaller outputs `A_i` (a logits) and `B_i` (b logits), `a * b = max_seq_len`, tiled to
  `C_i[j] = A_i[j mod a] * B_i[j div a]`;
- random: a learned (or, `fixed_random`, frozen buffer) `R: [max_seq_len, max_seq_len]` per head, truncated;
- random, factorized: `R = R1 R2^T`, `R1, R2: [max_seq_len, rank]`.

`mix` adds the paper's mixture with dot-product attention, `softmax((1 - a) B + a q k^T / sqrt(d))`, with a
learned `a` per head initialised to `mix`. Causal mode masks the logits (the dense MLP reads only token i).

Letter legend as in `_common`, plus: e - MLP hidden width (= d), l - max_seq_len, p - rank of factorized R.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from einops import repeat
from torch import Tensor, nn

from .._validate import check_bool, check_int
from ._common import AttentionBase
from ._paths import Path, choose_path
from ._registry import register_attention
from .linformer import check_seq_len, masked_softmax
from .softmax import causal_keep, softmax_attention

__all__ = ["SynthesizerAttention", "synthesizer_attention"]

MODES = ("dense", "random")


def synthesizer_attention(
    logits: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention with given logits: `softmax(logits) v`, computed in float32 at least.

    logits: `[b or 1, h, n, n]`; v: `[b, h, n, d]`; mask: `[b, n]` bool key padding mask, True = keep ->
    `[b, h, n, d]` in v's dtype. A query that sees no key outputs zero.
    """
    n = v.shape[-2]
    keep = causal_keep(n, n, v.device) if is_causal else None
    if mask is not None:
        keep = mask[:, None, None, :] if keep is None else keep & mask[:, None, None, :]
    dtype = torch.promote_types(v.dtype, torch.float32)
    weights = F.dropout(masked_softmax(logits.to(dtype), keep), p=dropout_p)
    return (weights @ v.to(dtype)).to(v.dtype)


def _factor_pair(length: int) -> tuple[int, int]:
    """`(a, b)` with `a * b = length` and `a <= b` as close as possible (32 x 32 for 1024)."""
    a = max(i for i in range(1, math.isqrt(length) + 1) if length % i == 0)
    return a, length // a


def _uniform(*shape: int, bound: float, **dd) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, **dd).uniform_(-bound, bound))


@register_attention("synthesizer")
class SynthesizerAttention(AttentionBase):
    """Synthesizer multi-head attention with timm's projections; causal mode masks the logits.

    The dense MLP reads each head's query projection `q_i = W_q X_i` (timm's `qkv`), so it is still a 2-layer
    MLP of `X_i` whose first layer factors through `W_q` (width d per head); pretrained `qkv` weights copy in.
    Parameters (none named `proj*`, timm's output projection): dense `synth_w1 [h, d, e]`, `synth_b1 [h, e]`,
    `synth_w2 [h, e, l]` (factorized: `[h, e, a + b]`, one hidden layer feeding both outputs), `synth_b2`;
    random `random_logits [h, l, l]` or factorized `random_left`, `random_right [h, l, rank]` (buffers with
    `fixed_random`); `mix_weight [h]` with `mix`.

    Fast path: dense and factorized-random logits are dot products (`[relu(.), 1] . [W2_j, b2_j]`,
    `R1_i . R2_j`, plus `q_i . k_j` for `mix`), so they run on SDPA without an `[n, n]` tensor. The factorized
    dense and full random logits are not, and are formed explicitly (the paper's O(n^2)), as on the reference
    path (`reference=True`) for every mode.
    """

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"max_seq_len": 64}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        mode: Literal["dense", "random"] = "dense",
        factorized: bool = False,
        rank: int = 8,
        fixed_random: bool = False,
        mix: float | None = None,
        max_seq_len: int = 1024,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {', '.join(map(repr, MODES))}")
        check_int("rank", rank, 1)
        check_int("max_seq_len", max_seq_len, 1)
        if fixed_random and mode != "random":
            raise ValueError(f"fixed_random=True needs mode='random', got mode={mode!r}")
        if mix is not None and (isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0 <= mix <= 1):
            raise ValueError(f"mix={mix!r} must be None or a number in [0, 1] (the dot-product logits' weight)")
        super().__init__(dim, num_heads, **timm_args)
        self.mode, self.factorized, self.rank, self.fixed_random = mode, bool(factorized), rank, bool(fixed_random)
        self.max_seq_len, self.reference = max_seq_len, check_bool("reference", reference)
        self.mix = float(mix) if mix else None
        dd = self.factory_kwargs
        h, d = num_heads, self.head_dim
        if mode == "dense":
            # nn.Linear's default initialisation, per head.
            self.synth_w1 = _uniform(h, d, d, bound=d**-0.5, **dd)
            self.synth_b1 = _uniform(h, d, bound=d**-0.5, **dd)
            self.factors = _factor_pair(max_seq_len) if self.factorized else None
            out = sum(self.factors) if self.factorized else max_seq_len
            self.synth_w2 = _uniform(h, d, out, bound=d**-0.5, **dd)
            self.synth_b2 = _uniform(h, out, bound=d**-0.5, **dd)
        else:
            # Unit-variance logits at initialisation, for the full and the factorized R alike.
            shapes = {"random_left": (h, max_seq_len, rank), "random_right": (h, max_seq_len, rank)}
            std = rank**-0.25
            if not self.factorized:
                shapes, std = {"random_logits": (h, max_seq_len, max_seq_len)}, 1.0
            for name, shape in shapes.items():
                tensor = torch.randn(*shape, **dd) * std
                if fixed_random:
                    self.register_buffer(name, tensor)
                else:
                    setattr(self, name, nn.Parameter(tensor))
        if self.mix is not None:
            self.mix_weight = nn.Parameter(torch.full((h,), self.mix, **dd))

    def _hidden(self, q: Tensor) -> Tensor:
        """`q: [b, h, n, d]` -> the dense MLP's hidden layer `[b, h, n, e]`."""
        return torch.relu(torch.einsum("bhnd,hde->bhne", q, self.synth_w1) + self.synth_b1[:, None])

    def _mix(self) -> tuple[Tensor, Tensor]:
        """Weights `(1 - a, a)` of the synthesized and the dot-product logits, each `[h, 1, 1]`."""
        a = self.mix_weight[:, None, None]
        return 1 - a, a

    def logits(self, q: Tensor, k: Tensor) -> Tensor:
        """Explicit logits `[b or 1, h, n, n]` for q, k: `[b, h, n, d]` (the reference path)."""
        n = q.shape[-2]
        if self.mode == "dense":
            hidden = self._hidden(q)
            if self.factorized:
                a, b = self.factors
                rows = -(-n // a)  # only the B entries that reach the first n tiled logits
                w_a, w_b = self.synth_w2.split([a, b], dim=-1)
                b_a, b_b = self.synth_b2.split([a, b], dim=-1)
                tile_a = hidden @ w_a + b_a[:, None]  # b h n a
                tile_b = hidden @ w_b[..., :rows] + b_b[:, None, :rows]  # b h n rows
                synth = (tile_b[..., :, None] * tile_a[..., None, :]).flatten(-2)[..., :n]
            else:
                synth = hidden @ self.synth_w2[..., :n] + self.synth_b2[:, None, :n]
        elif self.factorized:
            synth = (self.random_left[:, :n] @ self.random_right[:, :n].transpose(-2, -1))[None]
        else:
            synth = self.random_logits[None, :, :n, :n]
        if self.mix is None:
            return synth
        w_synth, w_dot = self._mix()
        return w_synth * synth + w_dot * (q * self.scale) @ k.transpose(-2, -1)

    def _dot_product_form(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Queries and keys `[b, h, n, x]` whose dot products are the logits (dense, factorized random)."""
        b, _, n, _ = q.shape
        if self.mode == "dense":
            hidden = self._hidden(q)
            queries = torch.cat([hidden, hidden.new_ones(hidden.shape[:-1] + (1,))], dim=-1)
            keys = torch.cat([self.synth_w2[..., :n].transpose(-2, -1), self.synth_b2[:, :n, None]], dim=-1)
        else:
            queries = repeat(self.random_left[:, :n], "h n p -> b h n p", b=b)
            keys = self.random_right[:, :n]
        keys = repeat(keys, "h n x -> b h n x", b=b)
        if self.mix is not None:
            w_synth, w_dot = self._mix()
            queries = torch.cat([queries * w_synth, q * (w_dot * self.scale)], dim=-1)
            keys = torch.cat([keys.to(k.dtype), k], dim=-1)
        return queries.to(q.dtype), keys.to(q.dtype)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        check_seq_len(self.attention_name, q.shape[-2], self.max_seq_len)
        dropout_p = self.attn_drop.p if self.training else 0.0
        # The factorized dense and the full random logits are no dot products: the torch path forms them too.
        explicit = (self.mode == "dense") == self.factorized
        if choose_path(q, reference=self.reference) is Path.REFERENCE or explicit:
            return synthesizer_attention(self.logits(q, k), v, mask, is_causal, dropout_p)
        queries, keys = self._dot_product_form(q, k)
        # SDPA's fused kernels want one head dim for queries, keys and values: zero columns change nothing.
        width = max(queries.shape[-1], v.shape[-1])
        queries, keys, values = (F.pad(t, (0, width - t.shape[-1])) for t in (queries, keys, v))
        keep = mask[:, None, None, :] if mask is not None else None
        out = softmax_attention(queries, keys, values, keep, is_causal, scale=1.0, dropout_p=dropout_p)
        return out[..., : v.shape[-1]]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, mode={self.mode!r}, factorized={self.factorized}, max_seq_len="
            f"{self.max_seq_len}, mix={self.mix}"
        )
