"""FlexAttention for the windowed families: the backend machinery, block masks built once and cached.

"FlexAttention: A Programming Model for Generating Optimized Attention Kernels" (Dong et al. 2024),
https://arxiv.org/abs/2412.05496. On CUDA, `torch.compile(flex_attention)` runs a fused kernel that skips the
key blocks a `BlockMask` marks empty, so a windowed pattern costs what its blocks cost, with no Python loop over
blocks. The forward also compiles and runs on CPU (no CPU backward in torch 2.14), which is how the tests check
every pattern without a GPU.

A family owns its pattern: its file defines a cached builder that returns a `FlexMask` from the same parameters
its torch path takes (equal parameters give the same object, so `flex_attend` reuses the block mask it caches per
pattern, length, heads and device). A family with a `backend` option checks it at construction with
`check_backend(backend, self.attn_drop.p, self.reference)` and, in `attend`, when
`zoo.attention._paths.choose_path(..., flex=True)` returns `Path.FLEX` (the rule `use_flex` states), returns
`flex_attend(q, k, v, <its FlexMask>, mask, scale=self.scale)` with `mask` the `[b, n]` key padding mask `attend`
receives. A pattern may also differ from sample to sample (`FlexMask.batch`: its mask_mod reads per-sample
tables, as in FlexAttention's document masking), for a packed batch whose samples have shapes of their own
(`_grid.ragged_pattern`); its block mask is then one per batch. Nothing here names a family.

Letter legend: b - batch, h - heads, n - length, d - head dim, k - blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_mask, flex_attention

from .._validate import did_you_mean

__all__ = ["BACKENDS", "FlexMask", "MaskMod", "block_mask", "check_backend", "flex_attend", "use_flex"]

BACKENDS = ("auto", "torch", "flex")
# FlexAttention's block of queries and keys. Lookup tables in a mask_mod hold exactly n entries: the kernels
# bound the indices of a partial block (modulo the length), and tables longer than the sequence miscompile on
# CPU in torch 2.14 (the same undeclared size symbol as under dynamic shapes, see `_compiled_flex`).
BLOCK = 128
# Booleans of the dense mask evaluated at once while a block mask is built: memory stays bounded at any length.
CHUNK_ELEMENTS = 1 << 26

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True, eq=False)
class FlexMask:
    """A family's attention pattern for FlexAttention.

    mask_mod(b, h, q_idx, kv_idx) -> bool, True where query q_idx may see key kv_idx; `length`: the sequence
    length the pattern was built for (None: any length); `per_head`: whether it depends on h; `order`: `[n]`
    long, the token permutation the pattern is written in (None: the sequence order), applied to q, k, v and
    undone on the output by `flex_attend`, so that a pattern's blocks are dense in that order; `batch`: the batch
    size of a pattern whose mask_mod reads per-sample tables `[batch, n]` (a packed batch of samples of their own
    shapes, as FlexAttention's document masking does), None where every sample has the same pattern. Hashed by
    identity: the builders are cached, so equal parameters give the same object and the same cached block mask.
    """

    mask_mod: MaskMod
    length: int | None = None
    per_head: bool = False
    order: Tensor | None = None
    batch: int | None = None


def check_backend(backend: str, attn_drop: float = 0.0, reference: bool = False) -> str:
    """Validate a variant's `backend` option (`auto`, `torch` or `flex`) at construction, against its dropout and
    its `reference` switch (the dense reference and the FlexAttention path exclude each other)."""
    if backend not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not allowed{did_you_mean(backend, BACKENDS)}: expected one of {BACKENDS}"
        )
    if backend == "flex" and attn_drop > 0:
        raise ValueError(f"backend='flex' cannot apply attn_drop={attn_drop} (FlexAttention has no dropout): use 0")
    if backend == "flex" and reference:
        raise ValueError("reference=True is the dense reference, backend='flex' the FlexAttention path: pick one")
    return backend


def use_flex(backend: str, q: Tensor, dropout_p: float = 0.0) -> bool:
    """Whether a call runs on FlexAttention: `flex`, or `auto` on CUDA without dropout."""
    return backend == "flex" or (backend == "auto" and q.is_cuda and dropout_p == 0.0)


@functools.cache
def _compiled_flex():
    # Static shapes: a new length or pattern recompiles, as it would anyway for a new block mask; with automatic
    # dynamic shapes the CPU code generator of torch 2.14 emits an undeclared size symbol for lookup tables.
    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=32)
def _block_structure(pattern: FlexMask, length: int, heads: int, device: torch.device) -> tuple[Tensor, ...]:
    """`(partial_num, partial_idx, full_num, full_idx, any_num, any_idx)` of the pattern's `BLOCK` x `BLOCK`
    blocks, each pair `[batch, heads, kq, kk]`-style as `BlockMask.from_kv_blocks` takes it (batch: the pattern's,
    else 1); `any` lists partial and full blocks together (for a mask_mod with key padding folded in, under which
    no block stays full).

    The dense mask is evaluated a chunk of query blocks at a time, never `[b, n, n]` whole.
    """
    batch = pattern.batch or 1
    kv_blocks = -(-length // BLOCK)
    rows = max(BLOCK, CHUNK_ELEMENTS // (length * heads * batch) // BLOCK * BLOCK)
    partial, full = [], []
    for start in range(0, length, rows):
        count = min(rows, length - start)

        def shifted(b, h, q_idx, kv_idx, start=start):
            return pattern.mask_mod(b, h, q_idx + start, kv_idx)

        dense = create_mask(shifted, batch, heads, count, length, device)
        dense = F.pad(dense, (0, kv_blocks * BLOCK - length, 0, -count % BLOCK))
        sums = dense.unflatten(-1, (kv_blocks, BLOCK)).unflatten(2, (-1, BLOCK)).sum((3, 5), dtype=torch.int32)
        partial.append((sums > 0) & (sums < BLOCK * BLOCK))
        full.append(sums == BLOCK * BLOCK)
    partial, full = torch.cat(partial, 2), torch.cat(full, 2)
    return (*_ordered(partial), *_ordered(full), *_ordered(partial | full))


def _ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Dense `[b, h, kq, kk]` bool blocks -> (count `[b, h, kq]`, indices `[b, h, kq, kk]`, listed blocks first)."""
    indices = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True)
    return blocks.sum(-1, dtype=torch.int32), indices.to(torch.int32)


def block_mask(pattern: FlexMask, length: int, heads: int, device: torch.device, keep: Tensor | None = None):
    """The `BlockMask` of `pattern` over `length` positions, cached; with `keep` (`[b, n]` bool, True = keep) the
    key padding is folded into the mask_mod, over the cached blocks of the pattern alone (none of them full)."""
    heads = heads if pattern.per_head else 1
    if keep is None:
        return _cached_block_mask(pattern, length, heads, device)
    *_, any_num, any_idx = _block_structure(pattern, length, heads, device)

    def padded(b, h, q_idx, kv_idx):
        return pattern.mask_mod(b, h, q_idx, kv_idx) & keep[b, kv_idx]

    return BlockMask.from_kv_blocks(any_num, any_idx, BLOCK_SIZE=BLOCK, mask_mod=padded, seq_lengths=(length, length))


@functools.lru_cache(maxsize=32)
def _cached_block_mask(pattern: FlexMask, length: int, heads: int, device: torch.device) -> BlockMask:
    partial_num, partial_idx, full_num, full_idx, *_ = _block_structure(pattern, length, heads, device)
    return BlockMask.from_kv_blocks(
        partial_num,
        partial_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=BLOCK,
        mask_mod=pattern.mask_mod,
        seq_lengths=(length, length),
    )


def flex_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pattern: FlexMask,
    key_padding: Tensor | None = None,
    *,
    scale: float | None = None,
) -> Tensor:
    """Attention under `pattern` on FlexAttention (compiled).

    q, k, v: `[b, h, n, d]`; key_padding: `[b, n]` bool, True = keep, or None -> `[b, h, n, d]`. A query whose
    keys are all masked gets zeros. On CPU the forward runs, a backward does not (torch 2.14): a call that needs
    gradients there is refused.
    """
    b, h, n, _ = q.shape
    if pattern.length is not None and n != pattern.length:
        raise ValueError(f"this attention pattern was built for {pattern.length} tokens, got {n}")
    if pattern.batch is not None and b != pattern.batch:
        raise ValueError(f"this attention pattern was built for a batch of {pattern.batch} samples, got {b}")
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        _refuse_cpu_backward()
    order = pattern.order
    if order is not None:
        inverse = torch.argsort(order)
        q, k, v = (_Permute.apply(x, 2, order, inverse) for x in (q, k, v))
        key_padding = None if key_padding is None else key_padding[:, order]
    mask = block_mask(pattern, n, h, q.device, key_padding)
    out = _compiled_flex()(q, k, v, block_mask=mask, scale=scale)
    if order is None:
        return out
    # back in sequence order, laid out as `[b, n, h, d]`: the projection after it then reads it without a copy
    return _Permute.apply(out.transpose(1, 2), 1, inverse, order).transpose(1, 2)


class _Permute(torch.autograd.Function):
    """`x.index_select(dim, order)` for a permutation `order` whose inverse is `inverse`: the backward gathers by the
    inverse, where autograd's indexing backward zero-fills a full-size tensor and scatter-adds into it."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int, order: Tensor, inverse: Tensor) -> Tensor:
        ctx.dim = dim
        ctx.save_for_backward(inverse)
        return x.index_select(dim, order)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(ctx.dim, inverse), None, None, None


def _refuse_cpu_backward() -> None:
    # A test that swaps a differentiable stand-in for `_compiled_flex` swaps this out too.
    raise ValueError(
        "backend='flex' runs forward only on CPU (FlexAttention has no CPU backward in torch 2.14): use "
        "backend='auto' or 'torch' to train on CPU"
    )
