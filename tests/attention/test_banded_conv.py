"""Convolutional band attention (`banded_conv`).

The blocked function is checked against a naive dense reference (the full [n, n] score matrix, scores outside the
band or of missing keys zeroed, each convolution a multiplication by a banded Toeplitz matrix along the key axis,
then a masked softmax) on outputs and every gradient, kernels included, at odd lengths with several blocks in play;
then the limits (identity kernels are `local` attention, a band covering the sequence is exact softmax), padding,
causality and memory.
"""

import builders
import pytest
import torch

import zoo
from zoo.attention._blocks import window_layout
from zoo.attention.banded_conv import BandedConvAttention, band_columns, band_scores, banded_conv_attention
from zoo.attention.local import local_attention

DIM, HEADS, BATCH = 32, 2, 2


def qkv(n: int, seed: int = 0):
    return builders.qkv(BATCH, HEADS, n, 8, seed=seed, requires_grad=True)


def random_kernels(depth: int, kernel_size: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(depth, HEADS, kernel_size, generator=generator) * 0.6).requires_grad_()


def padding(n: int) -> torch.Tensor:
    keep = torch.ones(BATCH, n, dtype=torch.bool)
    keep[1, n // 2 :] = False
    # Holes inside the sequence; the first query has no key at all in causal mode.
    keep[0, [0, 3, n // 2]] = False
    return keep


def inputs(n: int, seed: int = 1) -> torch.Tensor:
    return builders.tokens(BATCH, n, DIM, seed)


def with_random_kernels(attention: BandedConvAttention, seed: int = 0) -> BandedConvAttention:
    with torch.no_grad():
        attention.kernels.copy_(random_kernels(attention.depth, attention.kernel_size, seed))
    return attention.eval()


def toeplitz(kernel: torch.Tensor, n: int) -> torch.Tensor:
    """`[h, t]` taps -> `[h, n, n]` T with (x @ T)[j] = sum_t kernel[t] * x[j + t - t // 2], zeros past the ends."""
    taps = kernel.shape[-1]
    tap = torch.arange(n)[:, None] - torch.arange(n) + taps // 2  # [input key, output key]
    inside = (tap >= 0) & (tap < taps)
    return torch.where(inside, kernel[:, tap.clamp(0, taps - 1)], 0.0)


def reference(q, k, v, kernels, keep, radius, causal):
    """Dense convolutional band attention; a query with no kept key gets zeros."""
    n = q.shape[-2]
    offset = torch.arange(n) - torch.arange(n)[:, None]  # key minus query
    band = (offset >= -radius) & (offset <= 0) if causal else offset.abs() <= radius
    allowed = band & keep[:, None, None, :]
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    for kernel in kernels:
        # Zeroed outside the band first: a causal row never reads a future key, padded content never spreads.
        scores = torch.einsum("bhij,hjm->bhim", scores.masked_fill(~allowed, 0.0), toeplitz(kernel, n))
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.where(allowed.any(-1, keepdim=True), weights, 0.0) @ v


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("radius,depth,kernel_size", [(1, 1, 3), (8, 2, 3), (20, 2, 5), (70, 3, 3)])
def test_matches_dense_reference(n, causal, radius, depth, kernel_size):
    q, k, v = qkv(n)
    kernels = random_kernels(depth, kernel_size)
    keep = padding(n)
    out = banded_conv_attention(q, k, v, kernels, keep, causal, radius=radius)
    expected = reference(q, k, v, kernels, keep, radius, causal)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, kernels), grad_out)
    expected_grads = torch.autograd.grad(expected, (q, k, v, kernels), grad_out)
    for name, got, want in zip(["q", "k", "v", "kernels"], grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"gradient of {name}")


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("radius", [1, 8, 20])
def test_identity_kernels_are_local_attention(n, causal, radius):
    q, k, v = qkv(n)
    keep = padding(n)
    attention = zoo.create_attention("banded_conv", DIM, HEADS, radius=radius, depth=2, kernel_size=5)
    out = banded_conv_attention(q, k, v, attention.kernels, keep, causal, radius=radius)
    torch.testing.assert_close(out, local_attention(q, k, v, keep, causal, window=radius), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("radius", [130, 500])
@pytest.mark.parametrize("causal", [False, True])
def test_band_covering_the_sequence_is_exact_attention(radius, causal):
    torch.manual_seed(0)
    exact = zoo.create_attention("softmax", DIM, HEADS, qkv_bias=True).eval()
    variant = zoo.create_attention("banded_conv", DIM, HEADS, qkv_bias=True, radius=radius).eval()
    missing, unexpected = variant.load_state_dict(exact.state_dict(), strict=False)
    assert missing == ["kernels"] and not unexpected
    x, keep = inputs(131), padding(131)
    torch.testing.assert_close(variant(x, keep, causal), exact(x, keep, causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_padding_at_the_end_equals_a_shorter_sequence(causal):
    """Missing keys are zeros to the convolution, like the band edges: a padded tail changes nothing."""
    q, k, v = qkv(131)
    kernels = random_kernels(2, 5)
    keep = torch.ones(BATCH, 131, dtype=torch.bool)
    keep[:, 90:] = False
    padded = banded_conv_attention(q, k, v, kernels, keep, causal, radius=20)[:, :, :90]
    short = banded_conv_attention(q[:, :, :90], k[:, :, :90], v[:, :, :90], kernels, None, causal, radius=20)
    torch.testing.assert_close(padded, short, rtol=1e-5, atol=1e-5)


def test_padded_keys_never_leak_through_the_convolution():
    attention = with_random_kernels(zoo.create_attention("banded_conv", DIM, HEADS, radius=8, kernel_size=5))
    x = inputs(131)
    keep = torch.rand(BATCH, 131, generator=torch.Generator().manual_seed(0)) > 0.3
    changed = x.clone()
    changed[~keep] = torch.randn_like(changed[~keep]) * 40
    out, out_changed = attention(x, keep), attention(changed, keep)
    torch.testing.assert_close(out[keep], out_changed[keep], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("radius", [8, 500])
def test_causal_prefix_is_independent_of_the_future(radius):
    attention = with_random_kernels(zoo.create_attention("banded_conv", DIM, HEADS, radius=radius, kernel_size=5))
    x = inputs(131)
    for cut in (1, 40, 97):
        changed = x.clone()
        changed[:, cut:] = torch.randn_like(changed[:, cut:]) * 40
        torch.testing.assert_close(
            attention(x, is_causal=True)[:, :cut], attention(changed, is_causal=True)[:, :cut], rtol=1e-5, atol=1e-5
        )


def test_every_kernel_gets_a_gradient_and_changes_the_output():
    attention = zoo.create_attention("banded_conv", DIM, HEADS, radius=8, depth=3, kernel_size=3)
    assert attention.kernels.shape == (3, HEADS, 3)
    x = inputs(37)
    baseline = attention(x)
    baseline.square().mean().backward()
    grad = attention.kernels.grad
    assert grad is not None and (grad.abs().sum(-1) > 0).all()
    with_random_kernels(attention)
    assert not torch.allclose(attention(x), baseline, atol=1e-3)


def test_memory_is_linear_in_length():
    """The band is `[w, 2r + 1]` per block row, and nothing kept for the backward reaches n x n."""
    n, radius = 1024, 8
    q, k, v = qkv(n)
    layout = window_layout(n, radius, False)
    band = band_scores(q, k, layout, band_columns(layout, radius, False, q.device), 1.0)
    assert band.shape == (BATCH * layout.num_blocks, HEADS, layout.block, 2 * radius + 1)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        banded_conv_attention(q, k, v, random_kernels(2, 3), padding(n), radius=radius)
    per_query = max(saved) / (BATCH * HEADS * n)
    assert per_query <= layout.window_blocks * layout.block < n // 4


def test_bf16_matches_float32():
    attention = with_random_kernels(zoo.create_attention("banded_conv", DIM, HEADS, radius=8))
    x = inputs(131)
    expected = attention(x)
    out = attention.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


def test_attention_dropout_reaches_the_weights():
    attention = zoo.create_attention("banded_conv", DIM, HEADS, radius=8, attn_drop=0.5)
    x = inputs(131)
    assert not torch.allclose(attention.train()(x), attention.eval()(x))


@pytest.mark.parametrize(
    "options,match",
    [
        ({"radius": 0}, "radius=0"),
        ({"radius": 2.5}, "radius=2.5"),
        ({"depth": 0}, "depth=0"),
        ({"kernel_size": 4}, "kernel_size=4.*odd"),
        ({"kernel_size": 0}, "kernel_size=0"),
    ],
)
def test_options_are_validated_at_construction(options, match):
    with pytest.raises(ValueError, match=match):
        zoo.create_attention("banded_conv", DIM, HEADS, **options)


def test_kernels_follow_the_module_dtype_and_shape():
    attention = zoo.create_attention("banded_conv", DIM, 4, depth=2, kernel_size=5, dtype=torch.float64)
    assert attention.kernels.dtype == torch.float64
    expected = torch.zeros(2, 4, 5, dtype=torch.float64)
    expected[..., 2] = 1
    torch.testing.assert_close(attention.kernels.detach(), expected)
