"""Module contract the 2-D families (`neighborhood`, `window2d`) share, parametrized over both: samples never
mix, the reference switch computes the fast module's output, bf16 stays finite and close to float32, and
`set_grid` follows the image size. Each family's own pattern, padding and option checks stay in its file."""

import builders
import pytest
import torch

DIM, HEADS = 32, 2

# Per family: the pattern options at a small grid, a large one (bf16) and a tiny one (set_grid), one prefix token.
FAMILIES = {
    "neighborhood": {
        "small": {"grid_size": (6, 7), "kernel": 3, "dilation": 2},
        "large": {"grid_size": (20, 30), "kernel": 7, "dilation": 2},
        "tiny": {"grid_size": (4, 4), "kernel": 3},
    },
    "window2d": {
        "small": {"grid_size": (5, 7), "window": 3, "shift": 1},
        "large": {"grid_size": (20, 30), "window": 7, "shift": 3},
        "tiny": {"grid_size": (4, 4), "window": 2},
    },
}
NAMES = list(FAMILIES)


def make(name: str, size: str, **options):
    return builders.make(name, DIM, HEADS, qkv_bias=True, num_prefix_tokens=1, **FAMILIES[name][size], **options)


def tokens_of(name: str, size: str) -> int:
    rows, cols = FAMILIES[name][size]["grid_size"]
    return 1 + rows * cols


@pytest.mark.parametrize("name", NAMES)
def test_batch_entries_stay_independent(name):
    attention = make(name, "small")
    x = torch.randn(2, tokens_of(name, "small"), DIM)
    changed = x.clone()
    changed[1] = changed[1] * 50 + 3
    torch.testing.assert_close(attention(x)[0], attention(changed)[0])


@pytest.mark.parametrize("name", NAMES)
def test_reference_switch_computes_the_same_module_output(name):
    fast = make(name, "small")
    reference = make(name, "small", reference=True)
    reference.load_state_dict(fast.state_dict())
    n = tokens_of(name, "small")
    x, keep = torch.randn(2, n, DIM), builders.padding(2, n, drop=0.3, seed=1)
    torch.testing.assert_close(fast(x, keep), reference(x, keep), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_is_finite_and_close_to_float32(name):
    attention = make(name, "large").train()
    x = torch.randn(1, tokens_of(name, "large"), DIM) * 3
    expected = attention(x)
    low = attention.to(torch.bfloat16)
    x16 = x.to(torch.bfloat16).requires_grad_()
    out = low(x16)
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x16.grad).all()
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("name", NAMES)
def test_set_grid_follows_the_image_size(name):
    attention = make(name, "tiny")
    assert attention(torch.randn(1, 17, DIM)).shape == (1, 17, DIM)
    attention.set_grid((3, 5))
    assert attention(torch.randn(1, 16, DIM)).shape == (1, 16, DIM)
    assert attention.grid_size == (3, 5)
