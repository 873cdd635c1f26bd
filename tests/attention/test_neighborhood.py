"""`neighborhood`: NATTEN's clamped (and dilated) windows, the tiled torch path against the dense reference, exact
limits, locality, prefix tokens, padding, and the options. The module contract it shares with `window2d` (batch
independence, reference switch, bf16, set_grid) is in test_grid_families.py."""

import builders
import pytest
import torch
from builders import grads

from zoo.attention import neighborhood
from zoo.attention._blocks import allowed_attention
from zoo.attention.neighborhood import axis_neighbors, neighborhood_attention, neighborhood_keep

DIM, HEADS = 32, 2


def qkv(n: int, batch: int = 2, dtype=torch.float64, seed: int = 0):
    return builders.qkv(batch, HEADS, n, 8, dtype=dtype, seed=seed, requires_grad=True)


def padding(n: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return builders.padding(batch, n, drop=0.3, seed=seed)


def make(name: str = "neighborhood", **options):
    return builders.make(name, DIM, HEADS, qkv_bias=True, **options)


def natten_window_start(index: int, length: int, kernel: int, dilation: int) -> int:
    """NATTEN's first neighbour of `index` along an axis (its `get_window_start`), for length >= kernel * dilation."""
    radius = kernel // 2
    if dilation <= 1:
        return max(index - radius, 0) + (index + radius >= length) * (length - index - radius - 1)
    if index - radius * dilation < 0:
        return index % dilation
    if index + radius * dilation >= length:
        residue = index % dilation
        whole = length // dilation * dilation
        rest = length - whole
        if residue < rest:
            return length - rest + residue - 2 * radius * dilation
        return whole + residue - kernel * dilation
    return index - radius * dilation


@pytest.mark.parametrize("kernel", [1, 3, 5, 7])
@pytest.mark.parametrize("dilation", [1, 2, 3])
def test_axis_neighbourhoods_are_nattens(kernel, dilation):
    for length in range(kernel * dilation, kernel * dilation + 2 * dilation + 4):
        expected = torch.zeros(length, length, dtype=torch.bool)
        for index in range(length):
            start = natten_window_start(index, length, kernel, dilation)
            expected[index, start : start + kernel * dilation : dilation] = True
        torch.testing.assert_close(axis_neighbors(length, kernel, dilation), expected, msg=f"length {length}")


def test_every_query_sees_kernel_squared_patches():
    keep = neighborhood_keep((9, 11), 0, 3, 2)
    assert (keep.sum(-1) == 9).all()
    keep = neighborhood_keep((7, 7), 2, 5, 1)
    assert (keep[2:, 2:].sum(-1) == 25).all()


def test_an_axis_shorter_than_the_kernel_is_seen_whole():
    torch.testing.assert_close(axis_neighbors(4, 7, 1), torch.ones(4, 4, dtype=torch.bool))
    # Dilation 2 over 5 cells: groups {0, 2, 4} and {1, 3}, each seen whole by a kernel of 5.
    groups = torch.arange(5) % 2
    torch.testing.assert_close(axis_neighbors(5, 5, 2), groups[:, None] == groups)


@pytest.mark.parametrize("grid", [(6, 6), (5, 7), (11, 13), (1, 9), (3, 2)])
@pytest.mark.parametrize("kernel,dilation", [(1, 1), (3, 1), (5, 1), (3, 2), (3, 3), (7, 1)])
@pytest.mark.parametrize("prefix,masked", [(0, False), (2, True)])
def test_torch_path_matches_the_allowed_attention(grid, kernel, dilation, prefix, masked):
    n = prefix + grid[0] * grid[1]
    q, k, v = qkv(n)
    mask = padding(n) if masked else None
    out = neighborhood_attention(
        q, k, v, mask, grid_size=grid, num_prefix_tokens=prefix, kernel=kernel, dilation=dilation
    )
    expected = allowed_attention(q, k, v, neighborhood_keep(grid, prefix, kernel, dilation), mask, None, 0.0)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads(out, (q, k, v)), grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("tile", [1, 2, 3, 16])
def test_any_tile_size_gives_the_same_result(monkeypatch, tile):
    monkeypatch.setattr(neighborhood, "TILE", tile)
    grid, n = (7, 10), 71
    q, k, v = (x.detach() for x in qkv(n))
    mask = padding(n)
    out = neighborhood_attention(q, k, v, mask, grid_size=grid, num_prefix_tokens=1, kernel=5, dilation=1)
    expected = allowed_attention(q, k, v, neighborhood_keep(grid, 1, 5, 1), mask, None, 0.0)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("grid,kernel", [((5, 5), 5), ((5, 7), 7), ((5, 7), 9), ((1, 9), 9)])
@pytest.mark.parametrize("prefix", [0, 3])
def test_a_kernel_covering_the_grid_is_softmax(grid, kernel, prefix):
    n = prefix + grid[0] * grid[1]
    exact = make("softmax")
    variant = make(grid_size=grid, num_prefix_tokens=prefix, kernel=kernel)
    variant.load_state_dict(exact.state_dict())
    x = torch.randn(2, n, DIM, generator=torch.Generator().manual_seed(3))
    keep = padding(n)
    torch.testing.assert_close(variant(x), exact(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(variant(x, keep), exact(x, keep), rtol=1e-5, atol=1e-5)


def test_a_kernel_smaller_than_the_grid_differs_from_softmax():
    exact = make("softmax")
    variant = make(grid_size=(6, 6), num_prefix_tokens=1, kernel=3)
    variant.load_state_dict(exact.state_dict())
    x = torch.randn(2, 37, DIM)
    assert (variant(x) - exact(x)).abs().max() > 1e-3


@pytest.mark.parametrize("kernel,dilation", [(3, 1), (3, 2)])
def test_a_query_sees_exactly_its_neighbourhood_and_the_prefix(kernel, dilation):
    """Changing key j changes exactly the outputs of the queries whose neighbourhood holds j (all, for a prefix
    key)."""
    grid, prefix = (6, 7), 1
    n = prefix + 42
    options = {"grid_size": grid, "num_prefix_tokens": prefix, "kernel": kernel, "dilation": dilation}
    q, k, v = (x.detach() for x in qkv(n, batch=1))
    base = neighborhood_attention(q, k, v, **options)
    allowed = neighborhood_keep(grid, prefix, kernel, dilation)
    for j in range(n):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, j] += 3.0
        v2[:, :, j] -= 2.0
        changed = (neighborhood_attention(q, k2, v2, **options) - base).abs().amax((0, 1, 3)) > 1e-9
        torch.testing.assert_close(changed, allowed[:, j], msg=f"key {j}")
    assert allowed[:prefix].all() and allowed[:, :prefix].all()


def test_padded_keys_get_no_weight_and_a_fully_padded_neighbourhood_gives_zeros():
    grid, n = (5, 5), 25
    attention = make(grid_size=grid, kernel=3)
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[0, [0, 1, 2, 5, 6, 7, 10, 11, 12]] = False  # the corner query's 3 x 3 neighbourhood
    keep[1, 13:] = False
    x = torch.randn(2, n, DIM)
    changed = x.clone()
    changed[~keep] = torch.randn_like(changed[~keep]) * 40
    q, k, v = attention.project_qkv(x)
    inner = attention.attend(q, k, v, keep, False)
    assert torch.isfinite(inner).all()
    assert (inner[0, :, 0] == 0).all()
    torch.testing.assert_close(attention(x, keep)[keep], attention(changed, keep)[keep])


@pytest.mark.parametrize(
    "options,match",
    [
        ({"kernel": 4}, "kernel=4.*odd"),
        ({"kernel": 0}, "kernel=0"),
        ({"dilation": 0}, "dilation=0"),
        ({"grid_size": [4, "4"]}, "grid_size\\[1\\]='4'"),
        ({"backend": "triton"}, "backend='triton'"),
        ({"tile_rows": 0}, "tile_rows=0 is not allowed: expected 'auto'.*None.*integer >= 1"),
        ({"tile_rows": "raster"}, "tile_rows='raster'"),
        ({"tile_rows": True}, "tile_rows=True"),
        ({"tile_rows": 8.0}, "tile_rows=8.0"),
    ],
)
def test_options_are_checked_at_construction(options, match):
    with pytest.raises(ValueError, match=match):
        make(**options)


def test_token_count_must_fit_the_grid():
    attention = make(grid_size=(4, 5), num_prefix_tokens=2, kernel=3)
    with pytest.raises(ValueError, match="21 tokens do not fit grid_size=\\(4, 5\\) with num_prefix_tokens=2"):
        attention(torch.randn(1, 21, DIM))
