"""The window gather of neighbourhood attention (`zoo.attention.neighborhood`): the grid cut into tiles of
queries, each tile's key region (the union of its queries' neighbourhoods) gathered once, and one SDPA call over
all tiles with a `[tile, region]` mask that keeps each query's own neighbourhood: O(n (tile + kernel)^2) work, no
n x n tensor. The neighbourhoods themselves (which cells a tile's region holds and which of them each query sees)
come from the family's file.

Letter legend: b - batch, h - heads, d - head dim, p - prefix tokens, y / x - grid rows / columns, gy / gx - tiles
along them, ty / tx - rows / columns of a tile, ry / rx - of its key region.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor

from .._grid import masked_sdpa

__all__ = ["tiled_region_attention"]


def tiled_region_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    prefix: tuple[Tensor, Tensor, Tensor | None] | None,
    row_tiles: tuple[Tensor, Tensor],
    col_tiles: tuple[Tensor, Tensor],
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    """Attention of every cell over the cells its tile's tables say it sees, plus the prefix keys.

    q, k, v: `[b, h, y, x, d]`; keep: `[b, y, x]` bool or None; prefix: keys `[b, h, p, d]`, values and their keep
    `[b, p]` (or None) that every query also sees; row_tiles / col_tiles: per axis, the key cells of each tile's
    region `[gy, ry]` and which of them each query of the tile sees `[gy, ty, ry]` -> `[b, h, y, x, d]`.
    """
    b, _, rows, cols, _ = q.shape
    (row_keys, row_seen), (col_keys, col_seen) = row_tiles, col_tiles
    ty, tx = row_seen.shape[1], col_seen.shape[1]
    gy, gx = row_keys.shape[0], col_keys.shape[0]
    queries = F.pad(q, (0, 0, 0, gx * tx - cols, 0, gy * ty - rows))
    queries = rearrange(queries, "b h (gy ty) (gx tx) d -> (b gy gx) h (ty tx) d", ty=ty, tx=tx)

    def regions(x: Tensor) -> Tensor:
        x = x[:, :, row_keys][:, :, :, :, col_keys]  # [b, h, gy, ry, gx, rx, d]
        return rearrange(x, "b h gy ry gx rx d -> (b gy gx) h (ry rx) d")

    keys, values = regions(k), regions(v)
    allowed = row_seen[:, None, :, None, :, None] & col_seen[None, :, None, :, None, :]
    allowed = rearrange(allowed, "gy gx ty tx ry rx -> 1 (gy gx) (ty tx) (ry rx)")
    if keep is not None:
        cells = rearrange(keep[:, row_keys][:, :, :, col_keys], "b gy ry gx rx -> b (gy gx) 1 (ry rx)")
        allowed = allowed & cells
    if prefix is not None:
        prefix_k, prefix_v, prefix_keep = prefix
        keys = torch.cat([keys, repeat(prefix_k, "b h p d -> (b g) h p d", g=gy * gx)], dim=2)
        values = torch.cat([values, repeat(prefix_v, "b h p d -> (b g) h p d", g=gy * gx)], dim=2)
        extra = torch.ones(1, 1, 1, prefix_k.shape[2], dtype=torch.bool, device=q.device)
        extra = extra if prefix_keep is None else prefix_keep[:, None, None, :]
        batch = max(allowed.shape[0], extra.shape[0])
        allowed = torch.cat([allowed.expand(batch, -1, -1, -1), extra.expand(batch, *allowed.shape[1:3], -1)], -1)
    allowed = rearrange(allowed.expand(b, -1, -1, -1), "b g t m -> (b g) 1 t m")
    # Every query's neighbourhood holds a grid cell: only a padding mask can leave it without keys.
    out = masked_sdpa(queries, keys, values, allowed, scale, dropout_p, may_be_empty=keep is not None)
    out = rearrange(out, "(b gy gx) h (ty tx) d -> b h (gy ty) (gx tx) d", b=b, gy=gy, ty=ty)
    return out[:, :, :rows, :cols]
