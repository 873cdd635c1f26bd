"""BigBird: "Big Bird: Transformers for Longer Sequences" (Zaheer et al. 2020), https://arxiv.org/abs/2007.14062

The blocked ITC variant: the sequence in blocks of `block_size` (64); query block I (per head) sees the key blocks

    J(I) = {I - 1, I, I + 1} | {0, K - 1} | R(I),    and the global blocks 0 and K - 1 see every block,

    out_i = sum_{j in blocks J(block(i))} softmax_j(q_i . k_j * scale) v_j,

with R(I) `num_random_blocks` (3) random key blocks drawn per head and query block from the blocks outside its
window and the global ones. One softmax over the union of these keys per query. `bigbird_reference` writes this
out on a dense `[h, n, n]` mask. Faster paths (`choose_path` picks one per call): FlexAttention; the CPU flash
parts (`_kernels.windowed.bigbird_parts`); and the torch path here, each query block against its gathered key
blocks: memory and time O(n * (3 + 2 + r) * block_size), no n x n tensor. Random blocks are a pure function of
the `random_seed` buffer and the block count, drawn on the model's device without a host sync
(`_seeded.random_bits`), so they are the same on every call, device, replica and resumed run for a given length
(the original code also fixes them per layer). Padded keys, inside a random block or anywhere else, get no weight.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._blocks import BlockLayout, allowed_attention, as_sdpa_mask, rows_attention
from ._common import AttentionBase
from ._flex import FlexMask, check_backend, flex_attend
from ._kernels.flash_parts import use_flash_parts
from ._kernels.windowed import bigbird_parts
from ._paths import Path, choose_path
from ._registry import register_attention
from ._seeded import host_int, random_bits

__all__ = [
    "BigBirdAttention",
    "bigbird_allowed",
    "bigbird_attention",
    "bigbird_layout",
    "bigbird_mask",
    "bigbird_reference",
    "block_table",
    "draw_random_blocks",
    "global_blocks",
]


def bigbird_layout(length: int, block_size: int) -> BlockLayout:
    """Blocks of `block_size` (of the length, if shorter), each seeing its neighbours."""
    block = min(block_size, length)
    reach = min(1, -(-length // block) - 1)
    return BlockLayout(length, block, before=reach, after=reach)


def global_blocks(num_blocks: int) -> list[int]:
    """The global blocks of the ITC construction: the first and the last."""
    return sorted({0, num_blocks - 1})


def draw_random_blocks(num_blocks: int, num_heads: int, num_random: int, seed: Tensor | int) -> Tensor:
    """`[h, k, r]` long on `seed`'s device: for each head and query block, r distinct key blocks outside its window
    and the global blocks, -1 where fewer than r such blocks exist; a pure function of the int64 `seed` (a scalar
    tensor or an int) and the sizes, equal on every device. Cached on the CPU (O(h k^2) hashes)."""
    seed = torch.as_tensor(seed, dtype=torch.int64)
    value = host_int(seed)
    if value is not None:
        return _random_blocks_on_cpu(num_blocks, num_heads, num_random, value).clone()
    return _draw_random_blocks(num_blocks, num_heads, num_random, seed)


@functools.lru_cache(maxsize=32)
def _random_blocks_on_cpu(num_blocks: int, num_heads: int, num_random: int, seed: int) -> Tensor:
    return _draw_random_blocks(num_blocks, num_heads, num_random, torch.tensor(seed))


def _draw_random_blocks(num_blocks: int, num_heads: int, num_random: int, seed: Tensor) -> Tensor:
    blocks = torch.arange(num_blocks, device=seed.device)
    excluded = ((blocks[:, None] - blocks[None, :]).abs() <= 1) | (blocks == 0) | (blocks == num_blocks - 1)
    # Distinct integer scores (32 random bits, then the key block), so the order has no ties to break differently
    # on another device; excluded blocks score above every allowed one.
    bits = random_bits(seed, num_blocks, num_heads * num_blocks * num_blocks).view(num_heads, num_blocks, num_blocks)
    scores = (bits * num_blocks + blocks).masked_fill(excluded, 2**62)
    values, picks = scores.topk(min(num_random, num_blocks), dim=-1, largest=False)
    picks = picks.masked_fill(values == 2**62, -1)
    return F.pad(picks, (0, num_random - picks.shape[-1]), value=-1)


def block_table(random_blocks: Tensor) -> Tensor:
    """`[h, k, k]` bool, True where query block i sees key block j: its window of 3 blocks, the global blocks both
    ways, its random blocks (`random_blocks` `[h, k, r]`, -1 = none)."""
    heads, blocks, _ = random_blocks.shape
    index = torch.arange(blocks, device=random_blocks.device)
    is_global = torch.isin(index, torch.tensor(global_blocks(blocks), device=index.device))
    table = ((index[:, None] - index).abs() <= 1) | is_global | is_global[:, None]
    # A missing pick (-1) marks an extra column that is dropped.
    picks = torch.where(random_blocks >= 0, random_blocks, blocks)
    picked = torch.zeros(heads, blocks, blocks + 1, dtype=torch.bool, device=index.device).scatter_(2, picks, True)
    return table | picked[..., :blocks]


def bigbird_allowed(n: int, block_size: int, random_blocks: Tensor) -> Tensor:
    """`[h, n, n]` bool, True where query i sees key j (`block_table` of their blocks)."""
    block_of = torch.arange(n, device=random_blocks.device) // bigbird_layout(n, block_size).block
    return block_table(random_blocks)[:, block_of][:, :, block_of]


def bigbird_mask(length: int, block_size: int, random_blocks: Tensor, device: torch.device) -> FlexMask:
    """The FlexAttention pattern over `length` positions: `bigbird_allowed` per head, looked up in a `[h, k, k]`
    table of query block against key block. Cached by the random blocks' values."""
    picks = random_blocks.detach().to("cpu", torch.long).contiguous()
    return _bigbird_mask(length, block_size, (tuple(picks.shape), picks.numpy().tobytes()), device)


@functools.lru_cache(maxsize=64)
def _bigbird_mask(length: int, block_size: int, key: tuple, device: torch.device) -> FlexMask:
    shape, raw = key
    picks = torch.frombuffer(bytearray(raw), dtype=torch.long).view(shape).to(device)  # [h, k, r]
    table = block_table(picks)  # [h, k, k]: query block, key block
    block_of = torch.arange(length, device=device) // bigbird_layout(length, block_size).block

    def mask_mod(b, h, q_idx, kv_idx):
        return table[h, block_of[q_idx], block_of[kv_idx]]

    return FlexMask(mask_mod, length, per_head=True)


def bigbird_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    random_blocks: Tensor,
    mask: Tensor | None = None,
    *,
    block_size: int = 64,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The equation on dense scores, O(n^2): the tests' oracle.

    q, k, v: `[b, h, n, d]`; random_blocks: `[h, k, r]` long, -1 = none; mask: `[b, n]` bool key padding mask,
    True = keep -> `[b, h, n, d]`.
    """
    allowed = bigbird_allowed(q.shape[-2], block_size, random_blocks.to(q.device))  # [h, n, n]
    return allowed_attention(q, k, v, allowed, mask, scale, dropout_p)


def bigbird_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    random_blocks: Tensor,
    mask: Tensor | None = None,
    *,
    block_size: int = 64,
    scale: float | None = None,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """BigBird block-sparse attention on the path `choose_path` picks (FlexAttention is the module's).

    q, k, v: `[b, h, n, d]`; random_blocks: `[h, k, r]` long key blocks per head and query block, -1 = none
    (`draw_random_blocks` for `bigbird_layout(n, block_size).num_blocks`); mask: `[b, n]` bool key padding mask,
    True = keep -> `[b, h, n, d]`. Any n: padded to whole blocks inside, the output unpadded. `reference=True`:
    `bigbird_reference`.
    """
    _check_random_blocks(q, random_blocks, block_size)
    kernel = _kernel_applies(q, mask, dropout_p, random_blocks, block_size)
    path = choose_path(q, reference=reference, kernel=kernel)
    return _bigbird_on(path, q, k, v, random_blocks, mask, block_size, scale, dropout_p)


def _check_random_blocks(q: Tensor, random_blocks: Tensor, block_size: int) -> None:
    h, blocks = q.shape[1], bigbird_layout(q.shape[-2], block_size).num_blocks
    if random_blocks.shape[:2] != (h, blocks):
        raise ValueError(f"random_blocks of shape {tuple(random_blocks.shape)} do not fit {h} heads x {blocks} blocks")


def _kernel_applies(q: Tensor, mask: Tensor | None, dropout_p: float, random_blocks: Tensor, block_size: int):
    """`choose_path`'s `kernel` predicate: the flash parts take at least 3 blocks whose inner ones have every random
    pick."""
    layout = bigbird_layout(q.shape[-2], block_size)
    return lambda: (
        use_flash_parts(q, mask, dropout_p, layout.block)
        and layout.num_blocks >= 3
        and bool((random_blocks.to(q.device)[:, 1:-1] >= 0).all())
    )


def _bigbird_on(
    path: Path,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    random_blocks: Tensor,
    mask: Tensor | None,
    block_size: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """BigBird attention on `path`."""
    if path is Path.REFERENCE:
        return bigbird_reference(q, k, v, random_blocks, mask, block_size=block_size, scale=scale, dropout_p=dropout_p)
    if path is Path.FLEX:
        pattern = bigbird_mask(q.shape[-2], block_size, random_blocks, q.device)
        return flex_attend(q, k, v, pattern, mask, scale=scale)
    picks = random_blocks.to(q.device).transpose(0, 1)  # [k, h, r]
    if path is Path.KERNEL:
        w = bigbird_layout(q.shape[-2], block_size).block
        return bigbird_parts(q, k, v, picks, w, q.shape[-1] ** -0.5 if scale is None else scale)
    return _bigbird_blocks(q, k, v, picks, mask, block_size, scale, dropout_p)


def _bigbird_blocks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    picks: Tensor,
    mask: Tensor | None,
    block_size: int,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """The torch path: each query block against its gathered key blocks (`picks`: `[k, h, r]` random ones), then
    the global blocks' queries against the whole sequence."""
    b, h, n, _ = q.shape
    layout = bigbird_layout(n, block_size)
    blocks, w = layout.num_blocks, layout.block
    keep = layout.keep(mask, q.device)  # [b or 1, k * w]
    query_block = torch.arange(blocks, device=q.device)[:, None]
    glob = torch.tensor(global_blocks(blocks), device=q.device)
    window = query_block + torch.arange(-layout.before, layout.after + 1, device=q.device)  # [k, 3]
    # The key blocks of every query block and head, [k, h, s]: window, global, random. A slot is void outside the
    # sequence, for a global block the window already holds, and for a missing random pick.
    index = torch.cat(
        [window.clamp(0, blocks - 1)[:, None].expand(-1, h, -1), glob.expand(blocks, h, -1), picks.clamp(min=0)], -1
    )
    valid = torch.cat(
        [
            ((window >= 0) & (window < blocks))[:, None].expand(-1, h, -1),
            ((glob - query_block).abs() > layout.before)[:, None].expand(-1, h, -1),
            picks >= 0,
        ],
        dim=-1,
    )
    attn_mask = (keep.view(-1, blocks, w)[:, index] & valid[..., None]).flatten(-2)  # [b, k, h, (s w)]
    out = F.scaled_dot_product_attention(
        layout.blocks(q),
        layout.gather(k, index),
        layout.gather(v, index),
        attn_mask=as_sdpa_mask(attn_mask[:, :, :, None], b),
        dropout_p=dropout_p,
        scale=scale,
    )
    out = layout.unblock(out, b)
    # The global blocks' queries attend to the whole sequence.
    rows = torch.cat([torch.arange(g * w, min(g * w + w, n), device=q.device) for g in global_blocks(blocks)])
    return out.index_copy(2, rows, rows_attention(q, k, v, rows, keep[:, :n], False, scale, dropout_p))


@register_attention("bigbird")
class BigBirdAttention(AttentionBase):
    """BigBird-ITC: window of 3 blocks + first/last global blocks + `num_random_blocks` (3) random blocks of
    `block_size` (64); `reference=True`: the dense reference."""

    has_attention_weights = True
    test_options: ClassVar[dict] = {"block_size": 8, "num_random_blocks": 2}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        block_size: int = 64,
        num_random_blocks: int = 3,
        backend: Literal["auto", "torch", "flex"] = "auto",
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        super().__init__(dim, num_heads, **timm_args)
        self.block_size = check_int("block_size", block_size, 1)
        self.num_random_blocks = check_int("num_random_blocks", num_random_blocks, 0)
        self.reference = check_bool("reference", reference)
        self.backend = check_backend(backend, self.attn_drop.p, self.reference)
        # Drawn from the global generator once, then saved with the weights: every call, device, replica and
        # resumed run uses the same random blocks.
        self.register_buffer("random_seed", torch.randint(2**62, ()).to(self.factory_kwargs["device"]), persistent=True)

    def random_blocks(self, length: int) -> Tensor:
        """`[h, k, r]` random key blocks for a sequence of `length`, on the buffer's device (`draw_random_blocks`)."""
        num_blocks = bigbird_layout(length, self.block_size).num_blocks
        return draw_random_blocks(num_blocks, self.num_heads, self.num_random_blocks, self.random_seed)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        dropout_p = self.attn_drop.p if self.training else 0.0
        random_blocks = self.random_blocks(q.shape[-2]).to(q.device)
        kernel = _kernel_applies(q, mask, dropout_p, random_blocks, self.block_size)
        path = choose_path(
            q, reference=self.reference, backend=self.backend, dropout_p=dropout_p, flex=True, kernel=kernel
        )
        return _bigbird_on(path, q, k, v, random_blocks, mask, self.block_size, self.scale, dropout_p)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, block_size={self.block_size}, num_random_blocks={self.num_random_blocks}, "
            f"backend={self.backend!r}"
        )
