"""Linear attention (elu + 1 features) and the recurrent decoding API it shares with Performer."""

import builders
import pytest
import torch
from builders import grads

import zoo
import zoo.attention._kernels.blocked_linear as blocked_module
from zoo.attention.linear import linear_attention, linear_attention_reference

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37

# Recurrent variants and options that exercise their feature maps (Performer: fixed features, eval mode).
DECODERS = {
    "linear": ("linear", {"chunk_size": 8}),
    "performer": ("performer", {"nb_features": 24, "chunk_size": 8}),
    "performer-relu-hadamard": ("performer", {"nb_features": 24, "kernel": "relu", "projection": "hadamard"}),
}


def make(name: str = "linear", **options) -> torch.nn.Module:
    return builders.make(name, DIM, HEADS, **options)


def inputs(batch: int = BATCH, length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    return builders.tokens(batch, length, DIM, seed)


def gaussians(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_()


@pytest.mark.parametrize("is_causal,chunk_size", [(False, 128), (True, 1), (True, 5), (True, 16), (True, 128)])
@pytest.mark.parametrize("masked", [False, True])
def test_equals_the_quadratic_reference(is_causal, chunk_size, masked):
    # Chunk sizes 5 and 16 do not divide 37: the last chunk is padded internally.
    q, k, v = (gaussians(2, 3, LENGTH, 8, seed=s) for s in (1, 2, 3))
    mask = None
    if masked:
        mask = torch.ones(2, LENGTH, dtype=torch.bool)
        mask[1, 21:] = False
    out = linear_attention(q, k, v, mask, is_causal, chunk_size=chunk_size)
    expected = linear_attention_reference(q, k, v, mask, is_causal)
    torch.testing.assert_close(out, expected)
    for actual, reference in zip(grads(out, (q, k, v)), grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(actual, reference)


def test_module_is_the_function_between_timm_projections():
    attention = make(qkv_bias=True).double()
    x = inputs().double()
    for causal in (False, True):
        q, k, v = attention.project_qkv(x)
        expected = attention.proj(linear_attention_reference(q, k, v, None, causal).transpose(1, 2).flatten(2))
        torch.testing.assert_close(attention(x, is_causal=causal), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_padded_keys_get_no_weight(causal):
    attention = make(chunk_size=8)
    x = inputs()
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[1, 25:] = False
    out = attention(x, attn_mask=keep, is_causal=causal)
    torch.testing.assert_close(out[1, :25], attention(x[1:, :25], is_causal=causal)[0], atol=1e-6, rtol=1e-5)
    changed = x.clone()
    changed[1, 25:] = torch.randn(LENGTH - 25, DIM) * 50
    torch.testing.assert_close(attention(changed, attn_mask=keep, is_causal=causal)[keep], out[keep])


def test_causal_never_sees_the_future():
    attention = make(chunk_size=8)
    x = inputs()
    changed = x.clone()
    changed[:, 20:] = torch.randn_like(changed[:, 20:]) * 40
    out, out_changed = attention(x, is_causal=True), attention(changed, is_causal=True)
    torch.testing.assert_close(out[:, :20], out_changed[:, :20], atol=1e-6, rtol=0)
    assert not torch.allclose(out[:, 20:], out_changed[:, 20:])


@pytest.mark.parametrize("variant", list(DECODERS))
def test_decode_step_equals_the_causal_forward(variant):
    name, options = DECODERS[variant]
    attention = make(name, qkv_bias=True, gated=True, **options)
    x = inputs()
    full = attention(x, is_causal=True)
    state, steps = attention.init_state(BATCH), []
    for t in range(LENGTH):
        out, state = attention.decode_step(x[:, t], state)
        steps.append(out)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    r = attention.state_features
    assert [tuple(s.shape) for s in state] == [(BATCH, HEADS, r, DIM // HEADS), (BATCH, HEADS, r), (BATCH, HEADS)]
    # [b, 1, c] in gives [b, 1, c] out; no state is the initial state.
    first, _ = attention.decode_step(x[:, :1])
    torch.testing.assert_close(first, full[:, :1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", list(DECODERS))
def test_decode_step_skips_padding_tokens_like_the_key_padding_mask(variant):
    name, options = DECODERS[variant]
    attention = make(name, **options)
    x = inputs()
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    # Left padding (as for prompts of different lengths) and a hole in the middle.
    keep[0, :4] = False
    keep[1, 10] = False
    full = attention(x, attn_mask=keep, is_causal=True)
    state, steps = None, []
    for t in range(LENGTH):
        out, state = attention.decode_step(x[:, t], state, keep=keep[:, t])
        steps.append(out)
    torch.testing.assert_close(torch.stack(steps, dim=1)[keep], full[keep], atol=1e-5, rtol=1e-5)


def test_decode_step_rejects_more_than_one_token_and_bad_keep():
    attention = make()
    with pytest.raises(ValueError, match=r"one token.*\(2, 3, 32\)"):
        attention.decode_step(inputs(length=3))
    with pytest.raises(ValueError, match=r"keep of shape \(2, 1\)"):
        attention.decode_step(inputs(length=1), keep=torch.ones(2, 1, dtype=torch.bool))


def test_chunk_size_is_validated_and_does_not_change_the_output():
    with pytest.raises(ValueError, match="chunk_size=0"):
        make(chunk_size=0)
    x = inputs()
    outs = [make(chunk_size=c)(x, is_causal=True) for c in (3, 37, 64)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_long_sequence_equals_the_reference(causal):
    """4K tokens of 30 times a block's scale in bf16 against `linear_attention_reference` in float32 between the
    same projections (the bf16 weights, widened): the features and sums run in float32, so only the roundings of
    bf16's inputs and outputs remain (bounds: `builders.BF16_ROUNDOFF`)."""
    attention = make().to(torch.bfloat16).train()
    x = (torch.randn(1, 4096, DIM, generator=torch.Generator().manual_seed(0)) * 30).to(torch.bfloat16)

    def expected(module, x):
        q, k, v = module.project_qkv(x)
        return module.proj(linear_attention_reference(q, k, v, None, causal).transpose(1, 2).flatten(2))

    out, x_grad, params = builders.bf16_against(attention, x, expected, is_causal=causal)
    assert out <= 4 * builders.BF16_ROUNDOFF, out
    bound = 12 * builders.BF16_ROUNDOFF  # log2(4096) roundings
    assert x_grad <= bound and all(error <= bound for error in params.values()), (x_grad, params)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("value_dim", [8, 5])
def test_blocked_kernel_equals_the_feature_path(masked, value_dim, monkeypatch):
    # Blocks of 8 rows: several blocks and a ragged last one; a value dim other than the feature dim.
    monkeypatch.setattr(blocked_module, "LINEAR_BLOCK_BYTES", 8 * 2 * 3 * 9 * 8)
    q, k = gaussians(2, 3, LENGTH, 8, seed=1) * 2, gaussians(2, 3, LENGTH, 8, seed=2) * 2
    v = gaussians(2, 3, LENGTH, value_dim, seed=3)
    mask = None
    if masked:
        mask = torch.ones(2, LENGTH, dtype=torch.bool)
        mask[0, 30:] = False
        mask[1, 3:] = False
    blocked = linear_attention(q, k, v, mask)
    reference = linear_attention(q, k, v, mask, reference=True)
    torch.testing.assert_close(blocked, reference)
    for actual, expected in zip(grads(blocked, (q, k, v)), grads(reference, (q, k, v)), strict=True):
        torch.testing.assert_close(actual, expected)


def test_blocked_module_gradients_equal_the_reference_module():
    attention = make(qkv_bias=True).double().train()
    x = inputs().double().requires_grad_()
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[1, 25:] = False
    out = attention(x, attn_mask=keep)
    got = grads(out, (x, *attention.parameters()))
    reference = make(qkv_bias=True, reference=True).double().train()
    reference.load_state_dict(attention.state_dict())
    expected = reference(x, attn_mask=keep)
    torch.testing.assert_close(out, expected)
    for actual, wanted in zip(got, grads(expected, (x, *reference.parameters())), strict=True):
        torch.testing.assert_close(actual, wanted)


def test_blocked_kernel_refuses_double_backward_and_the_causal_path_supports_it():
    torch.manual_seed(0)
    attention = zoo.create_attention("linear", dim=32, num_heads=2).double()
    x = torch.randn(2, 37, 32, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(attention(x).square().sum(), x)
    assert grad.shape == x.shape
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(attention(x).square().sum(), x, create_graph=True)
    # second derivatives by finite differences: a short, narrow input keeps it to a second
    small = zoo.create_attention("linear", dim=8, num_heads=2).double()
    x = torch.randn(1, 9, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: small(x, is_causal=True), (x,))


def test_keys_longer_than_queries_take_the_reference_path():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 37, 8, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 60, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(linear_attention(q, k, v), linear_attention(q, k, v, reference=True))


def test_a_gpu_takes_the_whole_sequence_as_one_block_and_the_cpu_cache_sized_blocks():
    from zoo.attention._workspace import rows_per_block

    row = 1 * 8 * 65 * 4  # batch 1, 8 heads, d + 1 = 65 floats
    assert rows_per_block(65536, row, blocked_module.LINEAR_BLOCK_BYTES, torch.device("cpu")) == 2**22 // row
    assert rows_per_block(65536, row, blocked_module.LINEAR_BLOCK_BYTES, torch.device("cuda")) == 65536
    # a GPU workspace past 1 GiB is cut into blocks again; a tiny budget still takes 16 rows
    assert rows_per_block(2**24, 2**12, 2**22, torch.device("cuda")) == 2**30 // 2**12
    assert rows_per_block(1000, 2**20, 1, torch.device("cpu")) == 16
