"""FlexAttention's token orders for the 2-D families: `neighborhood`'s bands of `tile_rows` rows (tiles of 128
queries) and `window2d`'s windows with the prefix tokens last. The tiled flex path against a dense reference
written here (NATTEN's clamped windows over full softmax) on outputs and every gradient, with key padding, on odd
grids and on grids the tiles divide; and the key blocks each order reaches, counted on the dense mask, against
raster order.

On CPU the kernel is swapped for `blockwise_flex`, FlexAttention's semantics in differentiable dense ops that honour
the block lists (a key counts in a full block, or in a partial one where the mask_mod allows it), so the order, the
block lists, the key padding and the gradients are all checked without a GPU; the compiled forward of a tiled
neighbourhood runs on CPU in test_flex.py (against the torch path), the compiled backward only on CUDA, here."""

import builders
import pytest
import torch
from builders import grads
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from zoo.attention import _flex
from zoo.attention._flex import BLOCK, block_mask
from zoo.attention.neighborhood import auto_tile_rows, neighborhood_mask, tile_order
from zoo.attention.window2d import window2d_keep, window2d_mask

DIM, HEADS = 32, 2
CPU = torch.device("cpu")


def neighbours(length: int, kernel: int) -> torch.Tensor:
    """`[length, length]` bool: NATTEN's window along an axis, dilation 1 - the `kernel` cells from
    clamp(i - kernel // 2, 0, length - kernel), or the whole axis when it is shorter than the kernel."""
    seen = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        if length <= kernel:
            seen[i] = True
        else:
            start = min(max(i - kernel // 2, 0), length - kernel)
            seen[i, start : start + kernel] = True
    return seen


def reference_keep(grid: tuple[int, int], prefix: int, kernel: int) -> torch.Tensor:
    """`[n, n]` bool over prefix tokens then the grid in raster order: each cell sees its kernel x kernel
    neighbourhood, the prefix tokens see and are seen by everything."""
    rows, cols = grid
    cells = neighbours(rows, kernel)[:, None, :, None] & neighbours(cols, kernel)[None, :, None, :]
    keep = torch.ones(prefix + rows * cols, prefix + rows * cols, dtype=torch.bool)
    keep[prefix:, prefix:] = cells.reshape(rows * cols, rows * cols)
    return keep


def softmax_reference(q, k, v, allowed, padding, scale=None):
    """Full softmax attention over the keys `allowed` `[n, n]` and kept by `padding` `[b, n]`; zeros for a query
    with no key."""
    allowed = allowed & padding[:, None, None, :]
    scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    weights = scores.masked_fill(~allowed, torch.finfo(q.dtype).min).softmax(-1) * allowed
    return weights @ v


def bands(grid: tuple[int, int], tile_rows: int) -> torch.Tensor:
    """The raster indices of the cells ordered band by band (`tile_rows` rows), column by column, top to bottom."""
    rows, cols = grid
    cells = sorted(range(rows * cols), key=lambda i: (i // cols // tile_rows, i % cols, i // cols % tile_rows))
    return torch.tensor(cells)


def listed_blocks(num: torch.Tensor | None, indices: torch.Tensor | None, n: int) -> torch.Tensor:
    """A block list (`[.., kq]` counts, `[.., kq, kk]` indices) as a bool `[.., n, n]` over positions."""
    if num is None:
        return torch.zeros(n, n, dtype=torch.bool)
    slots = (torch.arange(indices.shape[-1]) < num[..., None]).to(torch.int32)
    blocks = torch.zeros_like(indices, dtype=torch.int32).scatter_add_(-1, indices.long(), slots) > 0
    return blocks.repeat_interleave(BLOCK, -2).repeat_interleave(BLOCK, -1)[..., :n, :n]


def blockwise_flex(q, k, v, block_mask, scale=None):
    """FlexAttention on dense tensors: key j counts for query i where their block is listed full, or listed partial
    and the mask_mod allows (i, j); a query with no key gets zeros."""
    b, h, n, _ = q.shape
    full = listed_blocks(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n)
    partial = listed_blocks(block_mask.kv_num_blocks, block_mask.kv_indices, n)
    allowed = full | (partial & create_mask(block_mask.mask_mod, b, h, n, n, q.device))
    scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    return scores.masked_fill(~allowed, torch.finfo(q.dtype).min).softmax(-1) * allowed @ v


@pytest.fixture
def dense_flex(monkeypatch):
    """`flex_attend` on CPU with `blockwise_flex` as its kernel (differentiable) and fresh block-mask caches."""
    monkeypatch.setattr(_flex, "_compiled_flex", lambda: blockwise_flex)
    monkeypatch.setattr(_flex, "_refuse_cpu_backward", lambda: None)
    _flex._block_structure.cache_clear()
    _flex._cached_block_mask.cache_clear()
    yield
    _flex._block_structure.cache_clear()
    _flex._cached_block_mask.cache_clear()


def make(**options):
    return builders.make("neighborhood", DIM, HEADS, backend="flex", **options).double()


@pytest.mark.parametrize("grid,tile_rows", [((7, 9), 2), ((13, 11), 4), ((16, 32), 8), ((5, 5), 8), ((9, 4), 1)])
def test_tile_order_is_bands_column_by_column(grid, tile_rows):
    torch.testing.assert_close(tile_order(grid, tile_rows), bands(grid, tile_rows))
    # The prefix tokens go after the grid, so the first band starts a block.
    order = neighborhood_mask(grid, 2, 3, 1, CPU, tile_rows).order
    torch.testing.assert_close(order, torch.cat([2 + bands(grid, tile_rows), torch.arange(2)]))
    # Any 128 consecutive cells of a band of 8 rows are an 8 x 16 patch, with a column part-filled at each end
    # where they do not start a column.
    band = bands((64, 48), 8)[: 8 * 48]
    for first in range(8 * 48 - 128):
        cells = band[first : first + 128]
        assert len(set((cells // 48).tolist())) == 8 and len(set((cells % 48).tolist())) == 16 + (first % 8 > 0)


def test_raster_order_is_kept_without_tiles_or_with_one_row_bands():
    assert neighborhood_mask((16, 32), 1, 7, 1, CPU, None).order is None
    assert neighborhood_mask((16, 32), 0, 7, 1, CPU, 1).order is None
    assert make(grid_size=(16, 32), kernel=7, tile_rows=None).flex_pattern((16, 32), CPU).order is None


# (grid, prefix, kernel, tile_rows): odd grids in ragged bands, grids the 8 x 16 tiles divide, and 'auto'.
CASES = [
    ((7, 9), 1, 5, 2),
    ((13, 11), 1, 7, 4),
    ((13, 11), 0, 3, 3),
    ((13, 11), 2, 5, None),
    ((16, 32), 1, 7, 8),
    ((16, 32), 0, 13, "auto"),
    ((24, 16), 1, 5, 8),
]


@pytest.mark.parametrize("grid,prefix,kernel,tile_rows", CASES)
def test_tiled_flex_path_matches_the_dense_reference(dense_flex, grid, prefix, kernel, tile_rows):
    """Through the module's `attend` on the flex backend: outputs and the gradients of q, k and v, with key
    padding."""
    n = prefix + grid[0] * grid[1]
    attention = make(grid_size=grid, num_prefix_tokens=prefix, kernel=kernel, tile_rows=tile_rows)
    q, k, v = builders.qkv(2, HEADS, n, 16, dtype=torch.float64, seed=3, requires_grad=True)
    padding = builders.padding(2, n, drop=0.3, seed=4)
    out = attention.attend(q, k, v, padding, False)
    expected = softmax_reference(q, k, v, reference_keep(grid, prefix, kernel), padding)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads(out, (q, k, v)), grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want)
    if attention.flex_pattern(grid, CPU).order is not None:
        # put back in sequence order laid out as [b, n, h, d], which the projection reads without a copy
        assert out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("grid,window,shift", [((8, 8), 4, 0), ((5, 7), 3, 1)])
def test_window2d_flex_path_in_window_order_matches_the_dense_reference(dense_flex, grid, window, shift):
    """window2d on the flex backend (its tokens in window order, the prefix last): outputs and the gradients of q, k
    and v against the dense pattern, with key padding."""
    n = 2 + grid[0] * grid[1]
    attention = builders.make(
        "window2d", DIM, HEADS, backend="flex", grid_size=grid, num_prefix_tokens=2, window=window, shift=shift
    ).double()
    q, k, v = builders.qkv(2, HEADS, n, 16, dtype=torch.float64, seed=5, requires_grad=True)
    padding = builders.padding(2, n, drop=0.3, seed=6)
    out = attention.attend(q, k, v, padding, False)
    expected = softmax_reference(q, k, v, window2d_keep(grid, 2, window, shift), padding)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads(out, (q, k, v)), grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want)


def block_counts(allowed: torch.Tensor) -> tuple[int, int]:
    """(partial, full) `BLOCK` x `BLOCK` blocks of a dense `[n, n]` mask, padded to whole blocks."""
    n = allowed.shape[-1]
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, blocks * BLOCK, dtype=torch.int32)
    padded[:n, :n] = allowed
    sums = padded.view(blocks, BLOCK, blocks, BLOCK).sum((1, 3))
    return int(((sums > 0) & (sums < BLOCK * BLOCK)).sum()), int((sums == BLOCK * BLOCK).sum())


# (grid, kernel, the height 'auto' picks, key blocks reached in raster order and in that order). At 64 x 64 a raster
# block is already a 2 x 64 patch: with kernel 7 no band beats it (8 x 16 tiles would reach 220), with 13 and 23
# 8 x 16 tiles do. At 16 x 256 a raster block is half a row, and 16 x 8 tiles (the grid column by column) are best;
# at 16 x 32, 16 x 8 tiles divide the grid.
TILINGS = [
    ((16, 32), 13, 16, 16, 10),
    ((64, 64), 7, 1, 156, 156),
    ((64, 64), 13, 8, 224, 220),
    ((64, 64), 23, 8, 404, 340),
    ((16, 256), 7, 16, 448, 94),
]


@pytest.mark.parametrize("grid,kernel,height,raster,tiled", TILINGS)
def test_tiling_reaches_fewer_key_blocks(grid, kernel, height, raster, tiled):
    """The blocks of the reference mask, counted in raster order and in bands of `height` rows, against the block
    mask torch builds from the pattern's mask_mod (with 'auto', in the order the pattern carries)."""
    keep = reference_keep(grid, 0, kernel)
    order = bands(grid, height)
    assert block_counts(keep) == (raster, 0)
    assert block_counts(keep[order][:, order]) == (tiled, 0)
    assert auto_tile_rows(grid, kernel, 1) == height
    pattern = neighborhood_mask(grid, 0, kernel, 1, CPU)
    theirs = create_block_mask(pattern.mask_mod, 1, 1, keep.shape[0], keep.shape[0], CPU)
    assert int(theirs.kv_num_blocks.sum()) == tiled and int(theirs.full_kv_num_blocks.sum()) == 0
    raster_pattern = neighborhood_mask(grid, 0, kernel, 1, CPU, None)
    theirs = create_block_mask(raster_pattern.mask_mod, 1, 1, keep.shape[0], keep.shape[0], CPU)
    assert int(theirs.kv_num_blocks.sum()) == raster
    if kernel == 7 and grid == (64, 64):
        assert block_counts(keep[bands(grid, 8)][:, bands(grid, 8)])[0] == 220


def test_window2d_prefix_tokens_last_keeps_aligned_windows_in_whole_blocks():
    """16 x 16 windows of a 64 x 64 grid and one prefix token: in window order each window is two whole blocks, so
    the 16 windows give 64 full blocks, and only the prefix token's row (33 blocks) and column (32) are partial. With
    the prefix token first, every window would straddle three blocks."""
    grid, window = (64, 64), 16
    cells = torch.arange(64 * 64)
    ids = cells // 64 // window * 4 + cells % 64 // window
    keep = torch.ones(4097, 4097, dtype=torch.bool)
    keep[1:, 1:] = ids[:, None] == ids
    pattern = window2d_mask(grid, 1, window, 0, CPU)
    order = torch.cat([1 + torch.argsort(ids, stable=True), torch.tensor([0])])
    torch.testing.assert_close(pattern.order, order)
    assert block_counts(keep[order][:, order]) == (65, 64)
    first = torch.cat([torch.tensor([0]), 1 + torch.argsort(ids, stable=True)])
    partial, full = block_counts(keep[first][:, first])
    assert partial + full > 129 and full < 64
    ours = block_mask(pattern, 4097, 1, CPU)
    assert (int(ours.kv_num_blocks.sum()), int(ours.full_kv_num_blocks.sum())) == (65, 64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's compiled backward needs CUDA")
@pytest.mark.parametrize("grid,prefix,kernel,tile_rows", [((13, 11), 1, 5, 4), ((32, 64), 1, 13, "auto")])
def test_compiled_tiled_path_matches_the_dense_reference_on_cuda(grid, prefix, kernel, tile_rows):
    cuda = torch.device("cuda")
    n = prefix + grid[0] * grid[1]
    attention = builders.make(
        "neighborhood", DIM, HEADS, grid_size=grid, num_prefix_tokens=prefix, kernel=kernel, tile_rows=tile_rows
    ).to(cuda)
    q, k, v = (x.to(cuda).requires_grad_() for x in builders.qkv(2, HEADS, n, 16, seed=3))
    padding = builders.padding(2, n, drop=0.3, seed=4).to(cuda)
    out = attention.attend(q, k, v, padding, False)
    expected = softmax_reference(q, k, v, reference_keep(grid, prefix, kernel).to(cuda), padding)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    for got, want in zip(grads(out.cpu(), (q, k, v)), grads(expected.cpu(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
