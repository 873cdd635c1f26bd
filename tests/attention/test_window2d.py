"""`window2d`: the windowed torch path against the dense reference, Swin's shifted-window mask, exact limits,
locality, prefix tokens, padding, and the grid options. The module contract it shares with `neighborhood` (batch
independence, reference switch, bf16, set_grid) is in test_grid_families.py."""

import builders
import pytest
import torch
from builders import grads

from zoo.attention._blocks import allowed_attention
from zoo.attention.window2d import window2d_attention, window2d_keep

DIM, HEADS = 32, 2


def qkv(n: int, batch: int = 2, dtype=torch.float64, seed: int = 0):
    return builders.qkv(batch, HEADS, n, 8, dtype=dtype, seed=seed, requires_grad=True)


def padding(n: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return builders.padding(batch, n, drop=0.3, seed=seed)


def make(name: str = "window2d", **options):
    return builders.make(name, DIM, HEADS, qkv_bias=True, **options)


@pytest.mark.parametrize("grid", [(6, 6), (5, 7), (7, 3), (1, 9)])
@pytest.mark.parametrize("window,shift", [(1, 0), (2, 0), (3, 1), (4, 2), (5, 3)])
@pytest.mark.parametrize("prefix,masked", [(0, False), (2, True)])
def test_torch_path_matches_the_allowed_attention(grid, window, shift, prefix, masked):
    n = prefix + grid[0] * grid[1]
    q, k, v = qkv(n)
    mask = padding(n) if masked else None
    options = {"grid_size": grid, "num_prefix_tokens": prefix, "window": window, "shift": shift}
    out = window2d_attention(q, k, v, mask, **options)
    allowed = window2d_keep(grid, prefix, window, shift)
    expected = allowed_attention(q, k, v, allowed, mask, None, 0.0)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads(out, (q, k, v)), grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want)


def swin_allowed(rows: int, cols: int, window: int, shift: int) -> torch.Tensor:
    """Swin Transformer's shifted-window attention mask, `[cells, cells]`: the grid padded to whole windows and
    rolled by -shift; cells attend within one window and one region of the roll (the wrapped strips)."""
    padded_rows, padded_cols = -(-rows // window) * window, -(-cols // window) * window
    regions = torch.zeros(padded_rows, padded_cols, dtype=torch.long)
    label = 0
    for row_slice in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
        for col_slice in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            regions[row_slice, col_slice] = label
            label += 1
    # The cell at (i, j) sits at ((i - shift) mod H, (j - shift) mod W) after the roll.
    r = (torch.arange(rows) - shift) % padded_rows
    c = (torch.arange(cols) - shift) % padded_cols
    windows = ((r // window)[:, None] * (padded_cols // window) + (c // window)[None]).flatten()
    labels = regions[r][:, c].flatten()
    return (windows[:, None] == windows) & (labels[:, None] == labels)


@pytest.mark.parametrize("grid", [(8, 8), (6, 9), (7, 5), (12, 8)])
@pytest.mark.parametrize("window,shift", [(4, 2), (4, 1), (4, 3), (3, 1)])
def test_shifted_windows_are_swins_mask(grid, window, shift):
    expected = swin_allowed(*grid, window, shift)
    torch.testing.assert_close(window2d_keep(grid, 0, window, shift), expected)
    # And the torch path computes that pattern.
    n = 1 + grid[0] * grid[1]
    q, k, v = qkv(n, batch=1)
    allowed = torch.ones(n, n, dtype=torch.bool)
    allowed[1:, 1:] = expected
    out = window2d_attention(q, k, v, grid_size=grid, num_prefix_tokens=1, window=window, shift=shift)
    torch.testing.assert_close(out, allowed_attention(q, k, v, allowed, None, None, 0.0))


def test_unshifted_windows_are_sams_partition():
    """Without shift, cells share a window iff they share (row // window, col // window), as after SAM's
    window_partition of the grid padded at the bottom and right."""
    rows, cols, window = 7, 10, 4
    cell = torch.arange(rows * cols)
    ids = (cell // cols // window) * 100 + cell % cols // window
    torch.testing.assert_close(window2d_keep((rows, cols), 0, window), ids[:, None] == ids)


@pytest.mark.parametrize("grid,window", [((5, 7), 7), ((5, 7), 20), ((6, 6), 6), ((1, 9), 9)])
@pytest.mark.parametrize("shift", [0, True])
@pytest.mark.parametrize("prefix", [0, 3])
def test_a_window_covering_the_grid_is_softmax(grid, window, shift, prefix):
    n = prefix + grid[0] * grid[1]
    exact = make("softmax")
    variant = make(grid_size=grid, num_prefix_tokens=prefix, window=window, shift=shift)
    variant.load_state_dict(exact.state_dict())
    x = torch.randn(2, n, DIM, generator=torch.Generator().manual_seed(3))
    keep = padding(n)
    torch.testing.assert_close(variant(x), exact(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(variant(x, keep), exact(x, keep), rtol=1e-5, atol=1e-5)


def test_window_smaller_than_the_grid_differs_from_softmax():
    exact = make("softmax")
    variant = make(grid_size=(6, 6), num_prefix_tokens=1, window=3)
    variant.load_state_dict(exact.state_dict())
    x = torch.randn(2, 37, DIM)
    assert (variant(x) - exact(x)).abs().max() > 1e-3


@pytest.mark.parametrize("shift", [0, 1])
def test_a_query_sees_exactly_its_window_and_the_prefix(shift):
    """Changing key j changes exactly the outputs of the queries whose window holds j (all, for a prefix key)."""
    grid, prefix, window = (5, 7), 2, 3
    n = prefix + 35
    options = {"grid_size": grid, "num_prefix_tokens": prefix, "window": window, "shift": shift}
    q, k, v = (x.detach() for x in qkv(n, batch=1))
    base = window2d_attention(q, k, v, **options)
    allowed = window2d_keep(grid, prefix, window, shift)
    for j in range(n):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, j] += 3.0
        v2[:, :, j] -= 2.0
        changed = (window2d_attention(q, k2, v2, **options) - base).abs().amax((0, 1, 3)) > 1e-9
        torch.testing.assert_close(changed, allowed[:, j], msg=f"key {j}")
    # Prefix tokens attend to every token, and every token attends to them.
    assert allowed[:prefix].all() and allowed[:, :prefix].all()


def test_padded_keys_get_no_weight_and_a_fully_padded_window_gives_zeros():
    grid, n = (4, 4), 17
    attention = make(grid_size=grid, num_prefix_tokens=1, window=2)
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[0, [1, 2, 5, 6]] = False  # every cell of the top-left window, and no prefix key: nothing to see
    keep[0, 0] = False
    keep[1, 9:] = False
    x = torch.randn(2, n, DIM)
    changed = x.clone()
    changed[~keep] = torch.randn_like(changed[~keep]) * 40
    q, k, v = attention.project_qkv(x)
    inner = attention.attend(q, k, v, keep, False)
    assert torch.isfinite(inner).all()
    assert (inner[0, :, [1, 2, 5, 6]] == 0).all()
    torch.testing.assert_close(attention(x, keep)[keep], attention(changed, keep)[keep])


def test_attention_dropout_reaches_the_weights():
    attention = make(grid_size=(4, 4), num_prefix_tokens=1, window=2, attn_drop=0.5).train()
    x = torch.randn(1, 17, DIM)
    torch.manual_seed(0)
    first = attention(x)
    torch.manual_seed(1)
    assert (attention(x) - first).abs().max() > 1e-3


def test_shift_true_is_half_a_window():
    assert make(window=7, shift=True).shift == 3
    assert make(window=7, shift=False).shift == 0


@pytest.mark.parametrize(
    "options,match",
    [
        ({"window": 0}, "window=0"),
        ({"window": 4, "shift": 4}, "shift=4"),
        ({"shift": -1}, "shift=-1"),
        ({"grid_size": (4,)}, "grid_size=\\(4,\\)"),
        ({"grid_size": (4, 0)}, "grid_size\\[1\\]=0"),
        ({"num_prefix_tokens": -1}, "num_prefix_tokens=-1"),
        ({"backend": "flexx"}, "backend='flexx'.*did you mean 'flex'"),
        ({"backend": "flex", "attn_drop": 0.1}, "attn_drop=0.1"),
        ({"backend": "flex", "reference": True}, "pick one"),
        ({"reference": 1}, "reference=1"),
    ],
)
def test_options_are_checked_at_construction(options, match):
    with pytest.raises(ValueError, match=match):
        make(**options)


def test_token_count_must_fit_the_grid():
    attention = make(grid_size=(4, 4), num_prefix_tokens=1, window=2)
    with pytest.raises(ValueError, match="18 tokens do not fit grid_size=\\(4, 4\\).*expected 1 \\+ 4 x 4 = 17"):
        attention(torch.randn(1, 18, DIM))
    with pytest.raises(ValueError, match="grid_size is not set"):
        make(window=2)(torch.randn(1, 17, DIM))


def test_flex_backend_refuses_a_cpu_backward():
    attention = make(grid_size=(4, 4), num_prefix_tokens=1, window=2, backend="flex")
    with pytest.raises(ValueError, match="no CPU backward"):
        attention(torch.randn(1, 17, DIM))


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "padded"])
def test_windows_that_tile_the_grid_take_views_of_one_qkv_and_hand_the_projection_its_layout(masked):
    """Windows that tile the grid (8 x 8 in 4 x 4, a class token) are written in and out once: q, k, v as the layer
    passes them (views of one `[b, n, 3, h, d]` projection), the output laid out as `[b, n, h, d]`, which the
    projection after it then reads without a copy; output and gradients those of the dense reference."""
    n = 1 + 8 * 8
    packed = torch.randn(2, n, 3, HEADS, 8, dtype=torch.float64, requires_grad=True)
    q, k, v = packed.permute(2, 0, 3, 1, 4).unbind(0)
    mask = padding(n) if masked else None
    out = window2d_attention(q, k, v, mask, grid_size=(8, 8), num_prefix_tokens=1, window=4)
    assert out.transpose(1, 2).is_contiguous()
    expected = allowed_attention(q, k, v, window2d_keep((8, 8), 1, 4, 0), mask, None, 0.0)
    torch.testing.assert_close(out, expected)
    (got,) = torch.autograd.grad(out.square().sum(), packed)
    (want,) = torch.autograd.grad(expected.square().sum(), packed)
    torch.testing.assert_close(got, want)


def test_windows_that_tile_the_grid_compile_whole_and_equal_eager():
    """The tiled path's autograd functions trace into one graph (fullgraph) through AOTAutograd, forward and
    backward equal to eager."""
    torch._dynamo.reset()
    n = 1 + 8 * 8
    q, k, v = qkv(n, dtype=torch.float32)
    mask = padding(n)

    def attend(q, k, v, mask):
        return window2d_attention(q, k, v, mask, grid_size=(8, 8), num_prefix_tokens=1, window=4)

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True, dynamic=False)
    results = []
    for fn in (attend, compiled):
        out = fn(q, k, v, mask)
        results.append((out, *grads(out, (q, k, v))))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want)
