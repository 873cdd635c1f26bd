"""FlexAttention over a whole packed batch whose samples have grids of their own (`GridAttention.set_grids` with
backend 'flex', `_grid.ragged_pattern`): one call a forward, and each sample gets what the dense reference of its
grid alone gives it, outputs and gradients; padded keys never get weight, padded queries get zeros.

The forward runs FlexAttention compiled on CPU (`compiled_flex`); FlexAttention has no CPU backward, so the gradients
are checked with `blockwise_flex` (test_flex_tiles.py) in its place: FlexAttention's semantics in differentiable dense
ops that honour the block lists, so a block the pattern leaves out fails the check as the kernel would."""

import pytest
import timm
import torch
from test_flex_tiles import dense_flex  # noqa: F401 (a fixture, used by name)
from timm.data.naflex_transforms import patchify_image

import zoo
from zoo.attention import _flex
from zoo.attention._grid import ragged_pattern
from zoo.attention.neighborhood import axis_neighborhood
from zoo.attention.window2d import window_axis

DIM, HEADS, PREFIX = 16, 2, 1
# A batch of three grids: both sides odd (the longest, 136 tokens with the prefix: two FlexAttention blocks),
# a tall one and a short one, so two of them are padded and one has a whole padded query block.
GRIDS = [(9, 15), (12, 7), (5, 11)]
N = PREFIX + max(rows * cols for rows, cols in GRIDS)
VARIANTS = [
    ("window2d", {"window": 4}),
    ("window2d", {"window": 4, "shift": 2}),
    ("neighborhood", {"kernel": 3}),
    ("neighborhood", {"kernel": 5, "dilation": 2}),
]
IDS = ["window2d", "window2d-shift", "neighborhood", "neighborhood-dilation"]


def lengths() -> list[int]:
    return [PREFIX + rows * cols for rows, cols in GRIDS]


def valid() -> torch.Tensor:
    """`[3, N]` bool: each sample's prefix and grid tokens, then its padding."""
    return torch.arange(N) < torch.tensor(lengths())[:, None]


def pair(name: str, options: dict, dtype=torch.float32):
    """The variant on the flex backend and its dense reference, with the same weights."""
    torch.manual_seed(0)
    flex = zoo.create_attention(name, DIM, HEADS, num_prefix_tokens=PREFIX, backend="flex", **options).eval()
    oracle = zoo.create_attention(name, DIM, HEADS, num_prefix_tokens=PREFIX, reference=True, **options).eval()
    oracle.load_state_dict(flex.state_dict())
    flex.set_grids(GRIDS)
    return flex.to(dtype), oracle.to(dtype)


def alone(oracle, x: torch.Tensor, index: int) -> torch.Tensor:
    """Sample `index` of `x` `[b, N, c]` through the reference on its own grid, its leading tokens only."""
    oracle.set_grid(GRIDS[index])
    return oracle(x[index : index + 1, : lengths()[index]])[0]


@pytest.fixture
def counted_flex(compiled_flex, monkeypatch):
    """The compiled FlexAttention of `compiled_flex`, counting its calls."""
    calls = []
    compiled = _flex._compiled_flex()

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return compiled(*args, **kwargs)

    monkeypatch.setattr(_flex, "_compiled_flex", lambda: counting)
    return calls


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_one_flex_call_gives_each_sample_its_own_grid(counted_flex, name, options):
    """The compiled forward over the padded batch, one call, against each sample alone through the reference."""
    flex, oracle = pair(name, options)
    x = torch.randn(3, N, DIM, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = flex(x, attn_mask=valid())
        assert len(counted_flex) == 1 and counted_flex[0][0] == 3
        for index in range(3):
            torch.testing.assert_close(out[index, : lengths()[index]], alone(oracle, x, index), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("dense_flex")
@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_gradients_match_each_sample_alone(name, options):
    """float64, through the block lists of the one batch pattern: the packed batch's outputs and input gradients
    equal those of each sample alone; padded tokens get no gradient."""
    flex, oracle = pair(name, options, torch.float64)
    x = torch.randn(3, N, DIM, generator=torch.Generator().manual_seed(2), dtype=torch.float64, requires_grad=True)
    weight = torch.randn(N, DIM, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    keep = valid()
    out = flex(x, attn_mask=keep)
    (grad,) = torch.autograd.grad((out * weight * keep[..., None]).sum(), x)
    for index, length in enumerate(lengths()):
        single = x[index : index + 1, :length].detach().requires_grad_(True)
        oracle.set_grid(GRIDS[index])
        reference = oracle(single)
        (reference_grad,) = torch.autograd.grad((reference * weight[:length]).sum(), single)
        torch.testing.assert_close(out[index, :length], reference[0])
        torch.testing.assert_close(grad[index, :length], reference_grad[0])
        assert not grad[index, length:].any()


@pytest.mark.parametrize("with_mask", [True, False], ids=["key-padding", "pattern-only"])
@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_padded_keys_never_get_weight(compiled_flex, name, options, with_mask):
    """At `attend` itself, with and without the key padding mask: keys and values of 1e4 at the padded positions
    leave every valid output as it was, and padded queries get zeros."""
    flex, _ = pair(name, options)
    q, k, v = torch.randn(3, 3, HEADS, N, 8, generator=torch.Generator().manual_seed(4)).unbind(0)
    keep = valid()
    mask = keep if with_mask else None
    clean = flex.attend(q, k, v, mask, False)
    padded = ~keep[:, None, :, None]
    dirty = flex.attend(q, k.masked_fill(padded, 1e4), v.masked_fill(padded, 1e4), mask, False)
    torch.testing.assert_close(dirty, clean, rtol=0, atol=0)
    assert not clean.masked_select(padded).any()


def test_padding_reaches_no_block():
    """The one pattern's block lists, per sample (136 tokens, two blocks): a query block of padding alone lists no
    key block (the second block of the samples of 85 and 56 tokens), and their first lists only the first key block,
    where the longest sample's reach both."""
    pattern = ragged_pattern(axis_neighborhood, (3, 1), tuple(GRIDS), PREFIX, N, torch.device("cpu"))
    blocks = _flex.block_mask(pattern, N, HEADS, torch.device("cpu"))
    counts = blocks.kv_num_blocks + blocks.full_kv_num_blocks  # [b, 1, query blocks]
    assert counts[2, 0].tolist() == [1, 0]
    assert counts[0, 0].tolist() == [2, 2] and counts[1, 0].tolist() == [1, 0]


@pytest.mark.parametrize(
    ("length", "window", "shift", "windows"),
    [(7, 3, 0, [[0, 3], [0, 3], [0, 3], [3, 6], [3, 6], [3, 6], [6, 7]]),
     (7, 3, 1, [[0, 1], [1, 4], [1, 4], [1, 4], [4, 7], [4, 7], [4, 7]]),
     (2, 3, 1, [[0, 2], [0, 2]])],
)  # fmt: skip
def test_window_axis_gives_each_cell_its_window(length, window, shift, windows):
    """Windows written out by hand: of 3 cells from the first, from the shift (a first window of `shift` cells),
    and one window where the axis is no longer than the window."""
    group, step, first, stop = window_axis(length, window, shift)
    assert not group.any() and step.tolist() == list(range(length))
    assert torch.stack([first, stop], 1).tolist() == windows


def test_a_naflex_vit_on_the_flex_backend_gives_the_torch_paths_features(counted_flex):
    """timm's NaFlex ViT with window2d on a packed batch of three image sizes: backend 'flex' runs one FlexAttention
    call a block and gives the features of backend 'auto' (the torch path on CPU, each grid on its own)."""

    def vit(backend: str):
        torch.manual_seed(0)
        return timm.create_model(
            "zoo_naflexvit_tiny_patch16_gap", attention="window2d", attention_options={"window": 2, "backend": backend},
            patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4, init_values=1.0,
        ).eval()  # fmt: skip

    generator = torch.Generator().manual_seed(5)
    items = [patchify_image(torch.randn(3, h * 8, w * 8, generator=generator), (8, 8)) for h, w in GRIDS]
    batch = [torch.nn.utils.rnn.pad_sequence([item[i] for item in items], batch_first=True) for i in range(3)]
    with torch.no_grad():
        flex = vit("flex").forward_features(*batch)["patches"]
        assert len(counted_flex) == 2
        torch.testing.assert_close(flex, vit("auto").forward_features(*batch)["patches"], rtol=1e-5, atol=1e-5)
