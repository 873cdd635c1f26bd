"""2-D attention on ragged grids (`GridAttention.set_grids`, NaFlex batches): each sample attends on its own grid,
as the dense reference of that grid alone computes it, and padding after its tokens changes nothing."""

import pytest
import torch

import zoo

GRIDS = [(3, 5), (4, 2), (1, 3)]
PREFIX = 1


@pytest.mark.parametrize(
    ("name", "options"),
    [("window2d", {"window": 2}), ("window2d", {"window": 2, "shift": 1}), ("neighborhood", {"kernel": 3}),
     ("neighborhood", {"kernel": 3, "dilation": 2})],
)  # fmt: skip
def test_each_sample_gets_its_own_grid(name, options):
    torch.manual_seed(0)
    attn = zoo.create_attention(name, 16, 2, num_prefix_tokens=PREFIX, **options).eval()
    oracle = zoo.create_attention(name, 16, 2, num_prefix_tokens=PREFIX, reference=True, **options).eval()
    oracle.load_state_dict(attn.state_dict())
    n = PREFIX + max(r * c for r, c in GRIDS)
    x = torch.randn(len(GRIDS), n, 16, requires_grad=True)
    keep = torch.zeros(len(GRIDS), n, dtype=torch.bool)
    for i, (rows, cols) in enumerate(GRIDS):
        keep[i, : PREFIX + rows * cols] = True
    attn.set_grids(GRIDS)
    out = attn(x.masked_fill(~keep[..., None], 1e4), attn_mask=keep)  # poisoned padding
    (grad,) = torch.autograd.grad((out * keep[..., None]).square().sum(), x)
    for i, (rows, cols) in enumerate(GRIDS):
        length = PREFIX + rows * cols
        oracle.set_grid((rows, cols))
        alone_x = x[i : i + 1, :length].detach().requires_grad_(True)
        alone = oracle(alone_x)
        (alone_grad,) = torch.autograd.grad(alone.square().sum(), alone_x)
        assert torch.allclose(out[i, :length], alone[0], atol=1e-5), (name, i)
        assert torch.allclose(grad[i, :length], alone_grad[0], atol=1e-4), (name, i)
        assert not grad[i, length:].any()


def test_grids_must_match_the_batch():
    attn = zoo.create_attention("window2d", 16, 2, window=2)
    attn.set_grids([(2, 2)])
    with pytest.raises(ValueError, match="1 grids set .* for a batch of 2 samples"):
        attn(torch.randn(2, 4, 16))
    with pytest.raises(ValueError, match="grid_size=\\(0, 3\\)|grid_size\\[0\\]"):
        attn.set_grids([(0, 3)])
