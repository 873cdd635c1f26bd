"""Hedgehog: learned softmax feature maps, causal prefix sums, recurrent decoding and LoLCATs' sliding window."""

import builders
import pytest
import torch
from builders import grads

import zoo
from zoo.attention.hedgehog import (
    hedgehog_attention,
    hedgehog_attention_reference,
    hedgehog_features,
    identity_feature_map,
)

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37


def make(**options) -> torch.nn.Module:
    attention = builders.make("hedgehog", DIM, HEADS, **{"feature_dim": 16, "chunk_size": 8, **options})
    with torch.no_grad():
        # Trained maps and window factors, not the identity and 1/2: the tests must see them used.
        attention.feature_map_q.add_(torch.randn_like(attention.feature_map_q) * 0.5)
        attention.feature_map_k.add_(torch.randn_like(attention.feature_map_k) * 0.5)
        if attention.window_factor is not None:
            attention.window_factor.copy_(torch.tensor([-1.0, 2.0]))
    return attention


def inputs(batch: int = BATCH, length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    return builders.tokens(batch, length, DIM, seed)


def gaussians(*shape, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).requires_grad_()


def naive_features(x, weight):
    logits = torch.einsum("bhnd,hdf->bhnf", x, weight)
    return torch.cat([logits.softmax(-1), (-logits).softmax(-1)], -1)


def test_features_are_two_distributions_and_padded_keys_are_zero():
    x = gaussians(2, 3, 11, 8, seed=1, scale=5.0)
    weight = identity_feature_map(3, 8, 8, dtype=torch.float64)
    keep = torch.ones(2, 11, dtype=torch.bool)
    keep[1, 7:] = False
    phi = hedgehog_features(x, weight, keep)
    assert phi.shape == (2, 3, 11, 16) and (phi >= 0).all()
    sums = torch.stack([phi[..., :8].sum(-1), phi[..., 8:].sum(-1)])
    torch.testing.assert_close(
        sums[:, keep[:, None].expand(2, 3, 11)], torch.ones_like(sums[:, keep[:, None].expand(2, 3, 11)])
    )
    assert (phi[1, :, 7:] == 0).all()
    # the identity map: softmax of x itself, and of -x
    torch.testing.assert_close(phi[0, ..., :8], x[0].softmax(-1))
    torch.testing.assert_close(phi[0, ..., 8:], (-x[0]).softmax(-1))
    # any map: the two softmaxes of x W, as the reference computes them
    weight = gaussians(3, 8, 6, seed=2)
    torch.testing.assert_close(hedgehog_features(x, weight), naive_features(x, weight))


@pytest.mark.parametrize("features", [8, 5, 24])
def test_maps_start_as_the_identity_or_an_isometry(features):
    weight = identity_feature_map(3, 8, features, dtype=torch.float64)
    assert weight.shape == (3, 8, features)
    if features == 8:
        assert torch.equal(weight, torch.eye(8, dtype=torch.float64).expand(3, 8, 8))
    elif features > 8:  # orthonormal rows: dot products of q and k are kept
        torch.testing.assert_close(weight @ weight.transpose(-1, -2), torch.eye(8, dtype=torch.float64).expand(3, 8, 8))
    else:  # orthonormal columns
        torch.testing.assert_close(
            weight.transpose(-1, -2) @ weight, torch.eye(features, dtype=torch.float64).expand(3, features, features)
        )


@pytest.mark.parametrize("window", [0, 1, 4, 40])
@pytest.mark.parametrize("is_causal,chunk_size", [(False, 8), (True, 1), (True, 5), (True, 16)])
@pytest.mark.parametrize("masked", [False, True])
def test_equals_the_dense_reference_with_gradients(window, is_causal, chunk_size, masked):
    # Chunks of 5 and 16 do not divide 37; window 40 covers the whole sequence.
    q, k, v = (gaussians(2, 3, LENGTH, 8, seed=s, scale=2.0) for s in (1, 2, 3))
    fq, fk = (gaussians(3, 8, 6, seed=s) for s in (4, 5))
    gate = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64, requires_grad=True) if window else None
    mask = None
    if masked:
        mask = torch.ones(2, LENGTH, dtype=torch.bool)
        mask[1, 21:] = False
        mask[0, 3] = False
    out = hedgehog_attention(q, k, v, fq, fk, mask, is_causal, window=window, window_gate=gate, chunk_size=chunk_size)
    expected = hedgehog_attention_reference(q, k, v, fq, fk, mask, is_causal, window=window, window_gate=gate)
    torch.testing.assert_close(out, expected)
    # A band over the whole sequence leaves no key to the feature maps: they get no gradient at all.
    tensors = (q, k, v) + ((fq, fk) if window < LENGTH else ()) + ((gate,) if window else ())
    for actual, reference in zip(grads(out, tensors), grads(expected, tensors), strict=True):
        torch.testing.assert_close(actual, reference)


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_window_over_the_whole_sequence_is_exact_softmax(is_causal):
    hedgehog = make(window=LENGTH)
    softmax = zoo.create_attention("softmax", DIM, HEADS)
    softmax.load_state_dict(hedgehog.state_dict(), strict=False)
    x = inputs()
    torch.testing.assert_close(hedgehog(x, is_causal=is_causal), softmax(x, is_causal=is_causal), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, 3])
def test_module_is_the_function_between_timm_projections(window):
    attention = make(qkv_bias=True, window=window).double()
    x = inputs().double()
    gate = None if window == 0 else attention.window_factor.sigmoid()
    for causal in (False, True):
        q, k, v = attention.project_qkv(x)
        out = hedgehog_attention_reference(
            q, k, v, attention.feature_map_q, attention.feature_map_k, None, causal, window=window, window_gate=gate
        )
        expected = attention.proj(out.transpose(1, 2).flatten(2))
        torch.testing.assert_close(attention(x, is_causal=causal), expected)


@pytest.mark.parametrize("window", [0, 3])
def test_decode_step_equals_the_causal_forward(window):
    attention = make(window=window, qkv_bias=True)
    x = inputs()
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[0, 5] = keep[1, 11:13] = False  # padding tokens in the middle add nothing to the state
    expected = attention(x, attn_mask=keep, is_causal=True)
    state, outs = None, []
    with torch.no_grad():
        for t in range(LENGTH):
            out, state = attention.decode_step(x[:, t], state, keep=keep[:, t])
            outs.append(out)
    torch.testing.assert_close(torch.stack(outs, 1), expected.detach(), atol=1e-5, rtol=1e-5)
    # the state does not grow with the position
    fresh = attention.init_state(BATCH)
    assert [s.shape for s in state] == [s.shape for s in fresh]


def test_decode_step_checks_its_inputs():
    attention = make(window=3)
    with pytest.raises(ValueError, match="one token"):
        attention.decode_step(inputs()[:, :2])
    with pytest.raises(ValueError, match="one flag per sample"):
        attention.decode_step(inputs()[:, 0], keep=torch.ones(3, dtype=torch.bool))


@pytest.mark.parametrize("window", [0, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_keys_get_no_weight(window, causal):
    attention = make(window=window)
    x = inputs()
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[1, 25:] = False
    out = attention(x, attn_mask=keep, is_causal=causal)
    torch.testing.assert_close(out[1, :25], attention(x[1:, :25], is_causal=causal)[0], atol=1e-6, rtol=1e-5)
    changed = x.clone()
    changed[1, 25:] = torch.randn(LENGTH - 25, DIM) * 50
    torch.testing.assert_close(attention(changed, attn_mask=keep, is_causal=causal)[keep], out[keep])


@pytest.mark.parametrize("window", [0, 4])
def test_causal_prefix_never_sees_the_future(window):
    attention = make(window=window)
    x = inputs()
    changed = x.clone()
    changed[:, 20:] = torch.randn_like(changed[:, 20:]) * 40
    out, out_changed = attention(x, is_causal=True), attention(changed, is_causal=True)
    torch.testing.assert_close(out[:, :20], out_changed[:, :20])
    # the changed tokens themselves do change: an output blind to every input would pass the check above
    assert (out[:, 20:] - out_changed[:, 20:]).abs().amax(-1).gt(1e-3).all()


@pytest.mark.parametrize("window", [0, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_is_finite_and_close_to_float32(window, causal):
    attention = make(window=window)
    x = torch.randn(1, 1000, DIM, generator=torch.Generator().manual_seed(3)) * 30
    reference = attention(x, is_causal=causal)
    half = attention.to(torch.bfloat16).train()
    x16 = x.to(torch.bfloat16).requires_grad_()
    out = half(x16, is_causal=causal)
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x16.grad).all()
    error = (out.float() - reference).norm() / reference.norm()
    assert error < 0.05, error


@pytest.mark.parametrize("window", [0, 4])
def test_every_parameter_gets_its_gradient(window):
    """In float64, the gradient of the input and of every parameter (the feature maps and the window factor
    included, each non-zero) against autograd through `hedgehog_attention_reference` between the same
    projections."""
    attention = make(window=window, qkv_bias=True).double().train()
    own = {"feature_map_q", "feature_map_k"} | ({"window_factor"} if window else set())
    assert own <= {name for name, _ in attention.named_parameters()}
    x, causal = inputs().double().requires_grad_(), bool(window)
    out = attention(x, is_causal=causal)
    q, k, v = attention.project_qkv(x)
    gate = None if window == 0 else attention.window_factor.sigmoid()
    expected = hedgehog_attention_reference(
        q, k, v, attention.feature_map_q, attention.feature_map_k, None, causal, window=window, window_gate=gate
    )
    expected = attention.proj(expected.transpose(1, 2).flatten(2))
    tensors = (x, *attention.parameters())
    names = ["input", *(name for name, _ in attention.named_parameters())]
    for name, got, want in zip(names, grads(out, tensors), grads(expected, tensors), strict=True):
        assert want.abs().sum() > 0, name
        torch.testing.assert_close(got, want, msg=lambda message, name=name: f"gradient of {name}: {message}")


@pytest.mark.parametrize(
    "options,match",
    [
        ({"feature_dim": 0}, "feature_dim=0"),
        ({"window": -1}, "window=-1"),
        ({"window": 2.5}, "window=2.5"),
        ({"chunk_size": 0}, "chunk_size=0"),
    ],
)
def test_options_are_validated_with_the_bad_value(options, match):
    with pytest.raises(ValueError, match=match):
        zoo.create_attention("hedgehog", DIM, HEADS, **options)
