"""FlexAttention for the windowed families: one `mask_mod` per family, block masks built once and cached.

"FlexAttention: A Programming Model for Generating Optimized Attention Kernels" (Dong et al. 2024),
https://arxiv.org/abs/2412.05496. On CUDA, `torch.compile(flex_attention)` runs a fused kernel that skips the
key blocks a `BlockMask` marks empty, so a windowed pattern costs what its blocks cost, with no Python loop over
blocks. Each builder below returns a `FlexMask` for one family, from the same parameters its torch path takes;
builders are cached, so equal parameters give the same `FlexMask` object, and `flex_attend` caches the block
mask per (pattern, length, heads, device). The forward also compiles and runs on CPU (no CPU backward in torch
2.14), which is how the tests check every pattern without a GPU.

Wiring a 1-D family's `backend` option (one call in its `attend`, when `use_flex(self.backend, q, dropout_p)`):

    local:      flex_attend(q, k, v, local_mask(window, is_causal), mask, scale=self.scale)
    dilated:    flex_attend(q, k, v, dilated_mask(window, dilation, is_causal), mask, scale=self.scale)
    sparse:     flex_attend(q, k, v, sparse_mask(n, pattern, block, num_summary, is_causal), mask, scale=self.scale)
    longformer: flex_attend(q, k, v, longformer_mask(n, window, global_indices, is_causal, q.device), mask,
                            scale=self.scale)
    bigbird:    flex_attend(q, k, v, bigbird_mask(n, block_size, random_blocks, q.device), mask,
                            scale=self.scale)

with `mask` the `[b, n]` key padding mask `attend` receives, and the constructor checking its option with
`check_backend(backend, attn_drop, reference)`. `window2d` and `neighborhood` call `window2d_mask` / `neighborhood_mask`.

Letter legend: b - batch, h - heads, n - length, d - head dim, k - blocks, r - random blocks per block.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_mask, flex_attention

from .._validate import did_you_mean

__all__ = [
    "BACKENDS",
    "FlexMask",
    "bigbird_mask",
    "block_mask",
    "check_backend",
    "dilated_mask",
    "flex_attend",
    "local_mask",
    "longformer_mask",
    "neighborhood_mask",
    "sparse_mask",
    "use_flex",
    "window2d_mask",
]

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
    undone on the output by `flex_attend`, so that a pattern's blocks are dense in that order. Hashed by
    identity: the builders are cached, so equal parameters give the same object and the same cached block mask.
    """

    mask_mod: MaskMod
    length: int | None = None
    per_head: bool = False
    order: Tensor | None = None


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
    blocks, each pair `[1, heads, kq, kk]`-style as `BlockMask.from_kv_blocks` takes it; `any` lists partial and
    full blocks together (for a mask_mod with key padding folded in, under which no block stays full).

    The dense mask is evaluated a chunk of query blocks at a time, never `[n, n]` whole.
    """
    kv_blocks = -(-length // BLOCK)
    rows = max(BLOCK, CHUNK_ELEMENTS // (length * heads) // BLOCK * BLOCK)
    partial, full = [], []
    for start in range(0, length, rows):
        count = min(rows, length - start)

        def shifted(b, h, q_idx, kv_idx, start=start):
            return pattern.mask_mod(b, h, q_idx + start, kv_idx)

        dense = create_mask(shifted, 1, heads, count, length, device)
        dense = F.pad(dense, (0, kv_blocks * BLOCK - length, 0, -count % BLOCK))
        sums = dense.unflatten(-1, (kv_blocks, BLOCK)).unflatten(2, (-1, BLOCK)).sum((3, 5), dtype=torch.int32)
        partial.append((sums > 0) & (sums < BLOCK * BLOCK))
        full.append(sums == BLOCK * BLOCK)
    partial, full = torch.cat(partial, 2), torch.cat(full, 2)
    return (*_ordered(partial), *_ordered(full), *_ordered(partial | full))


def _ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Dense `[1, h, kq, kk]` bool blocks -> (count `[1, h, kq]`, indices `[1, h, kq, kk]`, listed blocks first)."""
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
    _, h, n, _ = q.shape
    if pattern.length is not None and n != pattern.length:
        raise ValueError(f"this attention pattern was built for {pattern.length} tokens, got {n}")
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError(
            "backend='flex' runs forward only on CPU (FlexAttention has no CPU backward in torch 2.14): use "
            "backend='auto' or 'torch' to train on CPU"
        )
    if pattern.order is not None:
        q, k, v = (x[:, :, pattern.order] for x in (q, k, v))
        key_padding = None if key_padding is None else key_padding[:, pattern.order]
    mask = block_mask(pattern, n, h, q.device, key_padding)
    out = _compiled_flex()(q, k, v, block_mask=mask, scale=scale)
    if pattern.order is not None:
        out = out[:, :, torch.argsort(pattern.order)]
    return out


# The 1-D families. Positions i (query) and j (key); see each family's file for its semantics.


@functools.lru_cache(maxsize=64)
def local_mask(window: int, is_causal: bool = False) -> FlexMask:
    """`local`: |i - j| <= window (causal: 0 <= i - j <= window)."""

    def mask_mod(b, h, q_idx, kv_idx):
        offset = q_idx - kv_idx
        if is_causal:
            return (offset >= 0) & (offset <= window)
        return offset.abs() <= window

    return FlexMask(mask_mod)


@functools.lru_cache(maxsize=64)
def dilated_mask(window: int, dilation: int, is_causal: bool = False) -> FlexMask:
    """`dilated`: `local`'s window, keys a multiple of `dilation` away."""
    band = local_mask(window, is_causal).mask_mod

    def mask_mod(b, h, q_idx, kv_idx):
        return band(b, h, q_idx, kv_idx) & ((q_idx - kv_idx) % dilation == 0)

    return FlexMask(mask_mod)


@functools.lru_cache(maxsize=64)
def sparse_mask(length: int, pattern: str, block: int, num_summary: int, is_causal: bool = False) -> FlexMask:
    """`sparse`: "strided", |i - j| <= block or (i - j) mod block = 0; "fixed", the query's own block of
    min(block, n) positions and the last `num_summary` positions of every other block (causal: j <= i)."""
    if pattern == "strided":

        def allowed(q_idx, kv_idx):
            offset = q_idx - kv_idx
            return (offset.abs() <= block) | (offset % block == 0)

    else:
        width = min(block, length)

        def allowed(q_idx, kv_idx):
            return (q_idx // width == kv_idx // width) | (kv_idx % width >= width - num_summary)

    def mask_mod(b, h, q_idx, kv_idx):
        return allowed(q_idx, kv_idx) & (kv_idx <= q_idx) if is_causal else allowed(q_idx, kv_idx)

    return FlexMask(mask_mod, length)


def longformer_mask(
    length: int, window: int, global_indices: Sequence[int], is_causal: bool, device: torch.device
) -> FlexMask:
    """`longformer`: `local`'s window, plus global positions that see and are seen by every position (causal:
    j <= i throughout)."""
    return _longformer_mask(length, window, tuple(global_indices), is_causal, device)


@functools.lru_cache(maxsize=64)
def _longformer_mask(
    length: int, window: int, global_indices: tuple[int, ...], is_causal: bool, device: torch.device
) -> FlexMask:
    is_global = torch.zeros(length, dtype=torch.bool, device=device)
    is_global[list(global_indices)] = True
    band = local_mask(window, is_causal).mask_mod

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = band(b, h, q_idx, kv_idx) | is_global[q_idx] | is_global[kv_idx]
        return allowed & (kv_idx <= q_idx) if is_causal else allowed

    return FlexMask(mask_mod, length)


def bigbird_mask(length: int, block_size: int, random_blocks: Tensor, device: torch.device) -> FlexMask:
    """`bigbird`: blocks of min(block_size, n); a query block sees its neighbour blocks, the first and last
    blocks and its random blocks `random_blocks` (`[h, k, r]` long, -1 = none); the first and last blocks'
    queries see everything. Per head; cached by the random blocks' values."""
    picks = random_blocks.detach().to("cpu", torch.long).contiguous()
    return _bigbird_mask(length, block_size, (tuple(picks.shape), picks.numpy().tobytes()), device)


@functools.lru_cache(maxsize=64)
def _bigbird_mask(length: int, block_size: int, key: tuple, device: torch.device) -> FlexMask:
    shape, raw = key
    picks = torch.frombuffer(bytearray(raw), dtype=torch.long).view(shape).to(device)  # [h, k, r]
    heads, blocks, _ = shape
    width = min(block_size, length)
    index = torch.arange(blocks, device=device)
    ends = (index == 0) | (index == blocks - 1)
    table = ((index[:, None] - index).abs() <= 1) | ends | ends[:, None]  # [k, k]: query block, key block
    table = table.expand(heads, -1, -1).clone()
    chosen = torch.zeros(heads, blocks, blocks + 1, dtype=torch.bool, device=device)
    chosen.scatter_(2, torch.where(picks >= 0, picks, blocks), True)
    table |= chosen[..., :blocks]
    block_of = torch.arange(length, device=device) // width

    def mask_mod(b, h, q_idx, kv_idx):
        return table[h, block_of[q_idx], block_of[kv_idx]]

    return FlexMask(mask_mod, length, per_head=True)


# The 2-D families over a patch grid after `num_prefix` prefix tokens, which see and are seen by every token.


def _grid_coordinates(grid_size: tuple[int, int], device: torch.device) -> tuple[Tensor, Tensor]:
    rows, cols = grid_size
    cells = torch.arange(rows * cols, device=device)
    return cells // cols, cells % cols


@functools.lru_cache(maxsize=64)
def window2d_mask(
    grid_size: tuple[int, int], num_prefix: int, window: int, shift: int, device: torch.device
) -> FlexMask:
    """`window2d`: patches in the same `window` x `window` window (shifted by `shift` cells; an axis no longer
    than the window is one window). Written in window order (prefix tokens, then window after window), where
    each window's tokens are contiguous and its blocks dense."""
    row, col = _grid_coordinates(grid_size, device)
    ids = []
    for coord, length in ((row, grid_size[0]), (col, grid_size[1])):
        lead = window - shift if shift and length > window else 0
        ids.append((coord + lead) // window if length > window else torch.zeros_like(coord))
    window_id = ids[0] * (grid_size[1] + 1) + ids[1]  # column window ids are at most the column count
    order = torch.cat([torch.arange(num_prefix, device=device), num_prefix + torch.argsort(window_id, stable=True)])
    ordered_id = torch.cat([window_id.new_full((num_prefix,), -1), window_id.sort(stable=True).values])

    def mask_mod(b, h, q_idx, kv_idx):
        return (ordered_id[q_idx] == ordered_id[kv_idx]) | (q_idx < num_prefix) | (kv_idx < num_prefix)

    return FlexMask(mask_mod, num_prefix + grid_size[0] * grid_size[1], order=order)


@functools.lru_cache(maxsize=64)
def neighborhood_mask(
    grid_size: tuple[int, int], num_prefix: int, kernel: int, dilation: int, device: torch.device
) -> FlexMask:
    """`neighborhood`: per axis, the `kernel` positions of the query's dilation group (coordinates equal mod
    `dilation`) around it, the window clamped inside the group (of the whole group, when shorter than kernel)."""
    tables = []
    for coord, length in zip(_grid_coordinates(grid_size, device), grid_size):
        group, step = coord % dilation, coord // dilation
        group_length = (length - group + dilation - 1) // dilation
        size = group_length.clamp(max=kernel)
        start = torch.minimum((step - size // 2).clamp(min=0), group_length - size)
        # Per token: its dilation group, its step in the group and the first and one-past-last step it sees.
        pad = torch.full((num_prefix,), -1, dtype=coord.dtype, device=device)
        tables.append(tuple(torch.cat([pad, x]) for x in (group, step, start, start + size)))
    (row_group, row, row_low, row_high), (col_group, col, col_low, col_high) = tables

    def mask_mod(b, h, q_idx, kv_idx):
        rows = (
            (row_group[kv_idx] == row_group[q_idx]) & (row[kv_idx] >= row_low[q_idx]) & (row[kv_idx] < row_high[q_idx])
        )
        cols = (
            (col_group[kv_idx] == col_group[q_idx]) & (col[kv_idx] >= col_low[q_idx]) & (col[kv_idx] < col_high[q_idx])
        )
        return (rows & cols) | (q_idx < num_prefix) | (kv_idx < num_prefix)

    return FlexMask(mask_mod, num_prefix + grid_size[0] * grid_size[1])
