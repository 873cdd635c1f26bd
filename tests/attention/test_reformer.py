"""Reformer LSH attention: exact limits, the blocked fast path against the dense O(n^2) reference (outputs and
gradients), hashing, causality, padding, rotations, bf16 and approximation quality."""

import math

import builders
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.attention.reformer import GROUP, SELF_LOGIT, _signed_argmax, lsh_attention, lsh_bucket_count, lsh_buckets

DIM, HEADS, D = 32, 2, 16


def layer_normed(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return builders.tokens(batch, length, DIM, seed)


def rotations(length: int, bucket_size: int, rounds: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    half = lsh_bucket_count(length + (-length % bucket_size), bucket_size) // 2
    return torch.randn(HEADS, rounds, D, half, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def qkv(batch: int, length: int, seed: int = 0, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared-QK q (drawn at twice the unit scale) and v."""
    q, v = builders.qkv(batch, HEADS, length, D, count=2, dtype=dtype, seed=seed)
    return (q * 2).requires_grad_(), v.requires_grad_()


def padding_mask(length: int) -> torch.Tensor:
    """`[2, length]`: the first sample padded from its middle, the second in its last 3 keys."""
    return builders.padded_tails(length, (length // 2, length - 3))


def shared_qk_softmax(q, v, keep=None, is_causal=False):
    """Exact shared-QK attention: keys q / |q|, own key at -5e4, padded / future keys excluded."""
    n = q.shape[-2]
    scores = (q * q.shape[-1] ** -0.5) @ F.normalize(q, dim=-1).transpose(-1, -2)
    scores = scores.masked_fill(torch.eye(n, dtype=torch.bool), SELF_LOGIT)
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    if is_causal:
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1) @ v


def grads(out, inputs, keep=None):
    """Gradients of a fixed random projection of the output, ignoring masked query rows (their output is
    unspecified)."""
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    if keep is not None:
        weight = weight * keep[:, None, :, None]
    return torch.autograd.grad((out * weight).sum(), inputs)


def test_bucket_count_follows_the_length():
    assert lsh_bucket_count(16384, 64) == 256
    assert lsh_bucket_count(37, 64) == 1
    assert lsh_bucket_count(65, 64) == 2
    assert lsh_bucket_count(129, 64) == 4  # 3 chunks, rounded up to even
    assert lsh_bucket_count(40, 8) == 6


@pytest.mark.parametrize("half", [1, 3, 8, 13, 64])
def test_hash_is_argmax_over_rotations_and_their_negatives(half):
    generator = torch.Generator().manual_seed(half)
    q, rot = torch.randn(2, HEADS, 300, D, generator=generator), torch.randn(HEADS, 3, D, half, generator=generator)
    rotated = torch.einsum("bhnd,hrdu->bhrnu", q, rot)
    torch.testing.assert_close(lsh_buckets(q, rot), torch.cat([rotated, -rotated], -1).argmax(-1), rtol=0, atol=0)
    keep = torch.rand(2, 300, generator=generator) > 0.3
    masked = lsh_buckets(q, rot, keep)
    assert (masked[~keep[:, None, None].expand_as(masked)] == 2 * half).all()


def test_a_repeated_column_that_wins_by_rounding_maps_to_its_original():
    # Padding columns repeat columns j % half; the matmul may compute a repeat one ulp above its original.
    half = 3
    x = torch.tensor([0.1, 0.5, -0.2, 0.1, 0.5, -0.2, 0.1, 0.5])
    x[4] = torch.nextafter(x[1], torch.tensor(1.0))
    assert _signed_argmax(x.view(1, GROUP), half).item() == 1
    x = -x
    assert _signed_argmax(x.view(1, GROUP), half).item() == 1 + half


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("n_hashes, reference", [(1, False), (4, False), (4, True)])
def test_one_bucket_is_exact_shared_qk_attention(is_causal, masked, n_hashes, reference):
    # bucket_size >= n: one bucket, one chunk; every round sees every key, so any number of hashes is exact.
    attention = zoo.create_attention(
        "reformer",
        DIM,
        HEADS,
        n_hashes=n_hashes,
        reference=reference,
        qkv_bias=True,
        qk_norm=True,
        norm_layer=nn.LayerNorm,
    ).eval()
    x, keep = layer_normed(2, 37), padding_mask(37) if masked else None
    out = attention(x, attn_mask=keep, is_causal=is_causal)
    q, v = attention.qkv(x).unflatten(-1, (3, HEADS, D)).permute(2, 0, 3, 1, 4)[[0, 2]]
    # Keys are the normalised q after timm's q_norm (k_norm is unused).
    expected = shared_qk_softmax(attention.q_norm(q), v, keep, is_causal)
    expected = attention.proj(expected.transpose(1, 2).flatten(2))
    rows = keep if masked else torch.ones(2, 37, dtype=torch.bool)
    torch.testing.assert_close(out[rows], expected[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("count_duplicates", [True, False])
@pytest.mark.parametrize("length, masked", [(37, True), (131, False)])
def test_fast_path_matches_the_dense_reference(is_causal, count_duplicates, length, masked):
    # Chunks in blocks with integer codes against the rules on [n, n] matrices and one softmax over the union.
    q, v = qkv(2, length)
    rot = rotations(length, 8, rounds=3, dtype=torch.float64)
    keep = padding_mask(length) if masked else None
    fast, dense = (
        lsh_attention(q, v, rot, keep, is_causal, bucket_size=8, count_duplicates=count_duplicates, reference=reference)
        for reference in (False, True)
    )
    rows = (keep if masked else torch.ones(2, length, dtype=torch.bool))[:, None, :].expand(-1, HEADS, -1)
    torch.testing.assert_close(fast[rows], dense[rows], rtol=1e-9, atol=1e-9)
    for got, expected in zip(grads(fast, (q, v), keep), grads(dense, (q, v), keep), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("is_causal", [False, True])
def test_fast_path_gradients_pass_gradcheck_with_dropout(is_causal):
    q, v = qkv(1, 21, seed=3)
    rot = rotations(21, 4, rounds=2, dtype=torch.float64)

    def attend(q, v):
        # The same dropout mask on every call: the fast path draws it from torch's global generator.
        torch.manual_seed(0)
        return lsh_attention(q, v, rot, None, is_causal, bucket_size=4, dropout_p=0.3)

    assert torch.autograd.gradcheck(attend, (q, v), fast_mode=True)


def test_causal_outputs_ignore_the_future_with_many_buckets():
    attention = zoo.create_attention("reformer", DIM, HEADS, bucket_size=8, n_hashes=4).eval()
    x = layer_normed(2, 131)
    changed = x.clone()
    changed[:, 70:] = torch.randn(2, 61, DIM) * 10
    out, out_changed = attention(x, is_causal=True), attention(changed, is_causal=True)
    torch.testing.assert_close(out[:, :70], out_changed[:, :70], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[:, 70:], out_changed[:, 70:])


def test_internal_padding_equals_masked_user_padding():
    # 37 tokens pad to 40 inside; 40 tokens with the last 3 masked hash, sort and attend the same way.
    attention = zoo.create_attention("reformer", DIM, HEADS, bucket_size=8).eval()
    x = layer_normed(2, 40)
    keep = torch.ones(2, 40, dtype=torch.bool)
    keep[:, 37:] = False
    torch.testing.assert_close(attention(x[:, :37]), attention(x, attn_mask=keep)[:, :37], rtol=1e-5, atol=1e-5)


def test_rotations_are_redrawn_each_optimizer_step_and_restored_with_the_state():
    attention = zoo.create_attention("reformer", DIM, HEADS, bucket_size=8).eval()
    x = layer_normed(2, 131)
    first = attention(x)
    torch.testing.assert_close(attention(x), first, rtol=0, atol=0)
    saved = {key: value.clone() for key, value in attention.state_dict().items()}
    zoo.on_optimizer_step(attention)
    assert int(attention.step) == 1
    assert not torch.allclose(attention(x), first)
    attention.load_state_dict(saved)
    torch.testing.assert_close(attention(x), first, rtol=0, atol=0)


def _hash32(x: int) -> int:
    x ^= x >> 16
    x = x * 0x21F0AAAD % 2**32
    x ^= x >> 15
    x = x * 0x735A2D97 % 2**32
    return x ^ (x >> 15)


def _python_normal(seed: int, stream: int, count: int) -> list[float]:
    """`random_normal` in plain Python integers and float64 math: what every device must compute."""
    first = _hash32(_hash32(_hash32(seed % 2**32) ^ (seed >> 32)) ^ stream % 2**32)
    second = _hash32(first ^ 0x5BD1E995)
    pairs = (count + 1) // 2
    uniform = [(_hash32(_hash32((i + first) % 2**32) ^ second) + 0.5) * 2.0**-32 for i in range(2 * pairs)]
    radius = [math.sqrt(-2 * math.log(u)) for u in uniform[:pairs]]
    angle = [2 * math.pi * u for u in uniform[pairs:]]
    normal = [r * math.cos(a) for r, a in zip(radius, angle, strict=True)] + [
        r * math.sin(a) for r, a in zip(radius, angle, strict=True)
    ]
    return normal[:count]


def test_rotations_are_a_pure_function_of_seed_and_step_drawn_on_the_device():
    # integer arithmetic that never overflows and float64 transcendentals: the same values on every device
    attention = zoo.create_attention("reformer", DIM, HEADS, bucket_size=8)
    with torch.no_grad():
        attention.seed.fill_(2**62 - 12345)
        attention.step.fill_(3)
    rotations = attention.rotations(131)
    assert rotations.shape == (HEADS, 4, D, lsh_bucket_count(136, 8) // 2) and rotations.dtype == torch.float32
    expected = torch.tensor(_python_normal(2**62 - 12345, 3, rotations.numel()), dtype=torch.float64)
    torch.testing.assert_close(rotations.flatten(), expected.float(), rtol=0, atol=0)
    # the path a GPU takes (no cache keyed by values read on the host), traced whole: the same values
    traced = torch.compile(attention.rotations, backend="eager", fullgraph=True)(131)
    torch.testing.assert_close(traced, rotations, rtol=0, atol=0)
    # no value is read on the host: the draw runs on the meta device, where reading one raises
    assert attention.to("meta").rotations(131).device.type == "meta"


def test_only_the_q_and_v_rows_of_qkv_are_used():
    attention = zoo.create_attention("reformer", DIM, HEADS, bucket_size=8, qkv_bias=True).eval()
    x = layer_normed(2, 37)
    out = attention(x)
    out.square().sum().backward()
    k_rows = slice(DIM, 2 * DIM)
    assert (attention.qkv.weight.grad[k_rows] == 0).all() and (attention.qkv.weight.grad[:DIM] != 0).any()
    with torch.no_grad():
        attention.qkv.weight[k_rows] = torch.randn(DIM, DIM)
    torch.testing.assert_close(attention(x), out, rtol=0, atol=0)


def test_bf16_is_computed_in_float32_inside():
    # The same bf16 values through the bf16 and the float32 path: equal up to the bf16 rounding of the output, even
    # with logits in the hundreds (the hash sees the same float32 values either way).
    q, v = (x.detach().to(torch.bfloat16) for x in qkv(2, 131, dtype=torch.float32))
    q = q * 30
    rot = rotations(131, 8, rounds=4)
    out = lsh_attention(q, v, rot, bucket_size=8, is_causal=True)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    expected = lsh_attention(q.float(), v.float(), rot, bucket_size=8, is_causal=True)
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


def clustered(batch: int, length: int, clusters: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(batch, clusters, DIM, generator=generator)
    assign = torch.randint(0, clusters, (batch, length), generator=generator)
    x = centers.gather(1, assign[..., None].expand(-1, -1, DIM)) + 0.1 * torch.randn(
        batch, length, DIM, generator=generator
    )
    return F.layer_norm(x, (DIM,))


@torch.no_grad()
def approximation_errors(x: torch.Tensor, sharpness: float, count_duplicates: bool = True) -> list[float]:
    """Relative error against exact shared-QK attention for 1, 2, 4 and 8 hashes (256 tokens, bucket 16)."""
    attention = zoo.create_attention("reformer", DIM, HEADS, bucket_size=16)
    attention.qkv.weight.copy_(torch.randn(3 * DIM, DIM, generator=torch.Generator().manual_seed(5)) * DIM**-0.5)
    attention.qkv.weight[:DIM] *= sharpness
    q, _, v = attention.project_qkv(x)
    exact = shared_qk_softmax(q, v)
    errors = []
    for rounds in (1, 2, 4, 8):
        out = lsh_attention(q, v, rotations(256, 16, rounds, seed=1), bucket_size=16, count_duplicates=count_duplicates)
        errors.append(float((out - exact).norm() / exact.norm()))
    return errors


def test_approximation_error_against_exact_attention():
    # Tokens in 16 clusters of ~16 with peaked attention (q scaled by 8): what LSH is for. Each round misses a
    # query's cluster with some probability p, all r rounds with p^r, so the error falls fast with the rounds; the
    # tokens, weights and rotations are seeded (the same errors on every machine) and the bounds leave margin.
    errors = approximation_errors(clustered(2, 256, 16, seed=3), sharpness=8)
    assert errors == sorted(errors, reverse=True)
    assert errors[2] < 0.1 and errors[3] < 0.06
    # Unstructured post-LayerNorm tokens with random weights: attention is diffuse (its exact output is close to the
    # mean of v, a small vector) and LSH sees ~2 chunks of 256 keys, so the error stays of the order of that
    # output's norm (q scaled by 2) and falls only with more rounds; the duplicate correction lowers it further.
    errors = approximation_errors(layer_normed(2, 256, seed=4), sharpness=2)
    assert errors == sorted(errors, reverse=True) and errors[2] < 1.2 and errors[3] < 0.7
    assert errors[3] < approximation_errors(layer_normed(2, 256, seed=4), sharpness=2, count_duplicates=False)[3]


def test_options_are_validated():
    for options, match in [
        ({"n_hashes": 0}, "n_hashes=0"),
        ({"bucket_size": 0}, "bucket_size=0"),
        ({"bucket_size": 2.5}, "bucket_size=2.5"),
        ({"count_duplicates": "yes"}, "count_duplicates='yes'"),
        ({"reference": 1}, "reference=1"),
    ]:
        with pytest.raises(ValueError, match=match):
            zoo.create_attention("reformer", DIM, HEADS, **options)
    q, v = qkv(1, 37)
    with pytest.raises(ValueError, match="rotations of shape"):
        lsh_attention(q, v, torch.randn(HEADS, 2, D, 5), bucket_size=8)
