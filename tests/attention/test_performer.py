"""FAVOR+ (Performer) and the shared feature-map / kernel-attention core it is built on."""

import math

import builders
import pytest
import torch
import torch.nn.functional as F
from builders import grads

import zoo
from zoo.attention import AttentionBase, on_optimizer_step
from zoo.attention._features import (
    PROJECTIONS,
    fast_walsh_hadamard,
    gaussian_orthogonal_random_matrix,
    gaussian_random_matrix,
    hadamard_random_matrix,
    random_projection,
)
from zoo.attention._kernel import kernel_attention, kernel_attention_reference, kernel_attention_step
from zoo.attention._kernels import blocked_linear as blocked_module
from zoo.attention.linear import elu_feature_map
from zoo.attention.performer import (
    favor_attention,
    favor_attention_reference,
    relu_kernel_features,
    softmax_kernel_features,
)
from zoo.attention.softmax import softmax_attention

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37
BUFFERS = {"seed", "step", "random_features"}


def make(**options) -> torch.nn.Module:
    return builders.make("performer", DIM, HEADS, **{"nb_features": 24, **options})


def inputs(batch: int = BATCH, length: int = LENGTH, seed: int = 1, dim: int = DIM) -> torch.Tensor:
    return builders.tokens(batch, length, dim, seed)


def gaussians(*shape, seed: int = 0, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale).requires_grad_()


def assert_same(actual, expected, **tolerances):
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, **tolerances)


def favor_module_reference(attention, x: torch.Tensor, causal: bool, mask=None) -> torch.Tensor:
    """The module's output written out: timm's projections around `favor_attention_reference` with its features."""
    q, k, v = AttentionBase.project_qkv(attention, x)
    out = favor_attention_reference(
        q, k, v, attention.random_features, mask, causal, kernel=attention.kernel, eps=attention.eps
    )
    return attention.proj(out.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("options", [{}, {"reference": True}, {"kernel": "relu"}])
def test_output_and_every_parameter_gradient_equal_the_reference(options, causal):
    """In float64, the module's output and the gradients of the input and every parameter (each of them non-zero)
    against `favor_attention_reference` between the same projections."""
    attention = make(qkv_bias=True, **options).double().train()
    x = inputs().double().requires_grad_()
    out = attention(x, is_causal=causal)
    assert out.shape == (BATCH, LENGTH, DIM)
    expected = favor_module_reference(attention, x, causal)
    torch.testing.assert_close(out, expected)
    tensors = (x, *attention.parameters())
    names = ["input", *(name for name, _ in attention.named_parameters())]
    for name, got, want in zip(names, grads(out, tensors), grads(expected, tensors), strict=True):
        assert want.abs().sum() > 0, name
        torch.testing.assert_close(got, want, msg=lambda message, name=name: f"gradient of {name}: {message}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("options", [{}, {"reference": True}, {"qk_norm": True, "norm_layer": torch.nn.LayerNorm}])
def test_packed_qkv_backward_equals_the_base_class_split(options, causal):
    attention = make(qkv_bias=True, **options).double()
    x = inputs().double()
    params = list(attention.parameters())
    out = attention(x, is_causal=causal)
    q, k, v = AttentionBase.project_qkv(attention, x)
    expected = attention.project_out(attention.attend(q, k, v, None, causal), x)
    assert torch.equal(out, expected)
    assert_same(grads(out, params), grads(expected, params), rtol=0, atol=0)


def test_weights_copy_from_softmax_leaving_only_performer_buffers():
    source = zoo.create_attention("softmax", DIM, HEADS, qkv_bias=True)
    target = make(qkv_bias=True)
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    assert set(missing) == BUFFERS and not unexpected
    torch.testing.assert_close(target.proj.weight, source.proj.weight)
    assert BUFFERS <= set(target.state_dict())


def test_options_are_validated_with_the_bad_value():
    for options, match in [
        ({"kernel": "gaussian"}, "'gaussian'.*'softmax', 'relu'"),
        ({"projection": "fourier"}, "projection 'fourier' is not one of 'orthogonal', 'gaussian', 'hadamard'"),
        ({"nb_features": 0}, "nb_features=0"),
        ({"nb_features": 2.5}, "nb_features=2.5"),
        ({"redraw_interval": -1}, "redraw_interval=-1"),
        ({"chunk_size": 0}, "chunk_size=0"),
        ({"eps": -1.0}, "eps=-1.0"),
        ({"reference": "yes"}, "reference='yes'"),
        ({"attn_drop": 0.1}, "attn_drop=0.1"),
    ]:
        with pytest.raises(ValueError, match=match):
            make(**options)


def test_orthogonal_random_matrix_blocks_norms_and_determinism():
    generator = torch.Generator().manual_seed(3)
    matrix = gaussian_orthogonal_random_matrix(20, 8, generator=generator, dtype=torch.float64)
    assert matrix.shape == (20, 8)
    for block in (matrix[:8], matrix[8:16], matrix[16:]):
        directions = F.normalize(block, dim=-1)
        torch.testing.assert_close(directions @ directions.t(), torch.eye(len(block), dtype=torch.float64))
    assert len(set(matrix.norm(dim=-1).tolist())) == 20
    fixed = gaussian_orthogonal_random_matrix(12, 8, scaling="sqrt_d", generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(fixed.norm(dim=-1), torch.full((12,), math.sqrt(8)))
    again = gaussian_orthogonal_random_matrix(20, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(matrix, again)
    with pytest.raises(ValueError, match="'unit'"):
        gaussian_orthogonal_random_matrix(4, 4, scaling="unit")


def test_softmax_features_are_the_exact_features_up_to_their_offset():
    x = gaussians(2, 2, 9, 8, seed=1, scale=2.0)
    projection = gaussian_orthogonal_random_matrix(12, 8, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 6:] = False
    xs = x * 8**-0.25
    exact = torch.exp(xs @ projection.t() - xs.square().sum(-1, keepdim=True) / 2) / math.sqrt(12)
    eps = 1e-3
    for is_query, mask, causal in [(True, None, False), (False, keep, False), (False, keep, True)]:
        phi, offset = softmax_kernel_features(x, projection, is_query=is_query, mask=mask, causal=causal, eps=eps)
        rebuilt = offset.exp()[..., None] * (phi - eps / math.sqrt(12))
        rows = slice(None) if mask is None else keep[:, None, :, None].expand_as(exact)
        torch.testing.assert_close(rebuilt[rows], exact[rows])
        # The stabiliser keeps every feature at most 1 / sqrt(r) (plus eps).
        assert phi.max() <= (1 + eps) / math.sqrt(12) + 1e-12
        if mask is not None:
            assert (phi[1, :, 6:] == 0).all()
    # Non-causal keys share one offset per (sample, head): the max of w.x (the reference's, without |x|^2 / 2)
    # over features and kept keys only.
    _, offset = softmax_kernel_features(x, projection, is_query=False, mask=keep, eps=eps)
    assert offset.shape == (2, 2, 1)
    dash = xs @ projection.t()
    torch.testing.assert_close(offset[1, :, 0], dash[1, :, :6].amax(-1).amax(-1))
    # Queries: one offset per row, the max of w.x; their eps floor, at the reference's place, weighs exp(|x|^2 / 2)
    # more than at an offset that includes it.
    _, offset = softmax_kernel_features(x, projection, is_query=True, eps=eps)
    torch.testing.assert_close(offset, dash.amax(-1))


def test_softmax_features_estimate_the_softmax_kernel_without_bias():
    x, y = gaussians(1, 1, 6, 8, seed=2, scale=0.5), gaussians(1, 1, 5, 8, seed=3, scale=0.5)
    projection = gaussian_orthogonal_random_matrix(
        16384, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64
    )
    phi_x, off_x = softmax_kernel_features(x, projection, is_query=True, eps=0.0)
    phi_y, off_y = softmax_kernel_features(y, projection, is_query=False, eps=0.0)
    estimate = (phi_x @ phi_y.transpose(-2, -1)) * (off_x[..., :, None] + off_y[..., None, :]).exp()
    exact = torch.exp(x @ y.transpose(-2, -1) / math.sqrt(8))
    # Relative std per entry: sqrt((exp(|x+y|^2 / sqrt(d)) - 1) / r) ~ 0.014 here; 0.06 is about 4 sigma.
    torch.testing.assert_close(estimate, exact, rtol=0.06, atol=0)


def test_relu_and_elu_feature_maps():
    x = gaussians(2, 2, 5, 8, seed=5)
    projection = gaussian_orthogonal_random_matrix(6, 8, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    keep = torch.tensor([[True] * 5, [True, True, False, False, False]])
    phi = relu_kernel_features(x, projection, mask=keep, eps=1e-3)
    expected = F.relu(x * 8**-0.25 @ projection.t()) / math.sqrt(6) + 1e-3
    torch.testing.assert_close(phi[0], expected[0])
    assert (phi[1, :, 2:] == 0).all() and (phi[1, :, :2] > 0).all()
    torch.testing.assert_close(elu_feature_map(x), torch.where(x > 0, x + 1, x.exp()))


@pytest.mark.parametrize("is_causal,n,chunk", [(False, 37, 16), (True, 37, 16), (True, 130, 16), (True, 37, 128)])
@pytest.mark.parametrize("log_scale", [False, True])
def test_kernel_attention_equals_the_quadratic_reference(is_causal, n, chunk, log_scale):
    phi_q, phi_k = gaussians(2, 3, n, 5, seed=1).exp().detach(), gaussians(2, 3, n, 5, seed=2).exp().detach()
    phi_q.requires_grad_(), phi_k.requires_grad_()
    v = gaussians(2, 3, n, 4, seed=3)
    # Offsets spread over a wide range (growing and shrinking) exercise the running-max rescaling.
    scale = gaussians(2, 3, n, seed=4, scale=6.0) if log_scale else None
    tensors = (phi_q, phi_k, v) + ((scale,) if log_scale else ())
    out = kernel_attention(phi_q, phi_k, v, key_log_scale=scale, is_causal=is_causal, chunk_size=chunk)
    expected = kernel_attention_reference(phi_q, phi_k, v, key_log_scale=scale, is_causal=is_causal)
    torch.testing.assert_close(out, expected)
    assert_same(grads(out, tensors), grads(expected, tensors))


def test_kernel_attention_with_more_keys_than_queries_and_with_no_kept_key():
    phi_q, phi_k, v = gaussians(1, 2, 29, 5, seed=1).exp(), gaussians(1, 2, 37, 5, seed=2).exp(), gaussians(1, 2, 37, 4)
    torch.testing.assert_close(kernel_attention(phi_q, phi_k, v), kernel_attention_reference(phi_q, phi_k, v))
    # Every key padded (zero features, -inf scale): zero output, not NaN.
    zero = torch.zeros_like(phi_k)
    for causal in (False, True):
        out = kernel_attention(phi_k, zero, v, key_log_scale=torch.full((1, 2, 37), -math.inf), is_causal=causal)
        assert torch.equal(out, torch.zeros_like(out))


def test_causal_log_scale_equals_the_unstabilised_features():
    phi_q, phi_k, v = gaussians(2, 2, 45, 6, seed=1).exp(), gaussians(2, 2, 45, 6, seed=2).exp(), gaussians(2, 2, 45, 4)
    scale = gaussians(2, 2, 45, seed=3, scale=3.0)
    out = kernel_attention(phi_q, phi_k, v, key_log_scale=scale, is_causal=True, chunk_size=8)
    plain = kernel_attention(phi_q, phi_k * scale.exp()[..., None], v, is_causal=True, chunk_size=8)
    torch.testing.assert_close(out, plain)


def test_recurrent_step_equals_the_causal_output():
    phi_q, phi_k, v = gaussians(2, 2, 41, 6, seed=1).exp(), gaussians(2, 2, 41, 6, seed=2).exp(), gaussians(2, 2, 41, 4)
    scale = gaussians(2, 2, 41, seed=3, scale=5.0)
    scale.data[0, 0, 3] = -math.inf  # a padded key in the middle
    full = kernel_attention(phi_q, phi_k, v, key_log_scale=scale, is_causal=True, chunk_size=16)
    state, steps = None, []
    for t in range(41):
        out, state = kernel_attention_step(
            phi_q[:, :, t], phi_k[:, :, t], v[:, :, t], state, key_log_scale=scale[..., t]
        )
        steps.append(out)
    torch.testing.assert_close(torch.stack(steps, dim=2), full, atol=1e-10, rtol=1e-10)
    assert state[0].shape == (2, 2, 6, 4) and state[1].shape == (2, 2, 6) and state[2].shape == (2, 2)


@pytest.mark.parametrize("masked", [False, True])
def test_blocked_favor_equals_the_feature_path(masked, monkeypatch):
    # Blocks of 16 rows: several blocks, a ragged last one, the running max growing across blocks.
    monkeypatch.setattr(blocked_module, "FAVOR_BLOCK_BYTES", 16 * 2 * 3 * 24 * 8)
    q, k = gaussians(2, 3, 37, 16, seed=1, scale=2.0), gaussians(2, 3, 37, 16, seed=2, scale=2.0)
    v = gaussians(2, 3, 37, 16, seed=3)
    with torch.no_grad():
        k[:, :, 30:] *= 2  # the largest keys come last: the state is rescaled
    projection = gaussian_orthogonal_random_matrix(24, 16, generator=torch.Generator().manual_seed(0), dtype=q.dtype)
    mask = None
    if masked:
        mask = torch.ones(2, 37, dtype=torch.bool)
        mask[0, 33:] = False
        mask[1, 4:] = False
    blocked = favor_attention(q, k, v, projection, mask)
    reference = favor_attention(q, k, v, projection, mask, reference=True)
    torch.testing.assert_close(blocked, reference)
    assert_same(grads(blocked, (q, k, v)), grads(reference, (q, k, v)))


def relative_error(nb_features: int, head_dim: int, seeds: int = 6, projection: str = "orthogonal") -> float:
    """Mean relative output error of FAVOR+ against exact attention on post-LayerNorm inputs, default init."""
    errors = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        layer = zoo.create_attention(
            "performer", head_dim * 2, 2, nb_features=nb_features, projection=projection
        ).double()
        x = inputs(2, 128, seed=100 + seed, dim=head_dim * 2).double()
        with torch.no_grad():
            q, k, v = layer.project_qkv(x)
            approx = favor_attention(q, k, v, layer.random_features, eps=0.0)
            exact = softmax_attention(q, k, v)
        errors.append(((approx - exact).norm() / exact.norm()).item())
    return sum(errors) / len(errors)


def test_favor_approximates_softmax_better_with_more_features():
    # The estimator's relative variance per kernel entry is (exp(|q + k|^2 / sqrt(d)) - 1) / nb_features: the error
    # falls about as 1 / sqrt(nb_features) (4x from 256 to 4,096 features: the bound there is a third of the one at
    # 256), and with default-init projections of LayerNorm'd inputs |q|^2 / sqrt(d) grows like sqrt(d), so at ViT
    # head sizes 256 features approximate only roughly (a looser bound at head dim 64). Inputs, weights and
    # features are seeded and the errors computed in float64, so they are the same on every machine; the bounds
    # leave a quarter of margin for other seeds.
    small = [relative_error(r, 16) for r in (16, 64, 256)]
    assert small[0] > small[1] > small[2] and small[2] < 0.45
    assert relative_error(4096, 16, seeds=2) < 0.15
    vit = [relative_error(r, 64, seeds=3) for r in (16, 256)]
    assert vit[0] > vit[1] and vit[1] < 0.85


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_every_projection_approximates_softmax_better_with_more_features(projection):
    # The bounds of the test above hold for each projection: all three draw rows of the same norms (orthogonal and
    # hadamard within a block), so the estimator's variance, and with it the error, is of the same order; head dim
    # 24 (hadamard pads to 32 and truncates) sits between head dims 16 and 64.
    errors = [relative_error(r, 16, seeds=3, projection=projection) for r in (16, 64, 256)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.45
    assert relative_error(256, 24, seeds=2, projection=projection) < 0.55


def test_gaussian_projection_rows_are_iid_standard_normal():
    matrix = gaussian_random_matrix(4096, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert abs(matrix.mean()) < 0.01 and abs(matrix.var() - 1) < 0.02
    # Not orthogonal: the first 16 rows have clearly non-zero dot products.
    directions = F.normalize(matrix[:16], dim=-1)
    assert (directions @ directions.t() - torch.eye(16, dtype=torch.float64)).abs().max() > 0.3


def test_fast_walsh_hadamard_is_the_sylvester_matrix():
    hadamard = torch.ones(1, 1, dtype=torch.float64)
    for _ in range(4):
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)], 0)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(fast_walsh_hadamard(x), x @ hadamard)
    with pytest.raises(ValueError, match="power-of-2 length, got 12"):
        fast_walsh_hadamard(torch.ones(12))


def test_hadamard_rows_are_orthogonal_within_a_block_with_norm_sqrt_d():
    matrix = hadamard_random_matrix(40, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert matrix.shape == (40, 16)
    eye = torch.eye(16, dtype=torch.float64)
    for block in (matrix[:16], matrix[16:32]):
        torch.testing.assert_close(block @ block.t(), 16 * eye)
    torch.testing.assert_close(matrix[32:] @ matrix[32:].t(), 16 * eye[:8, :8])
    # Random signs: blocks differ, and the entries are not just +-1 (three rounds mix them).
    assert not torch.allclose(matrix[:16].abs(), matrix[16:32].abs())
    assert len(set(matrix.abs().round(decimals=6).flatten().tolist())) > 2
    again = hadamard_random_matrix(40, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(matrix, again)


def test_hadamard_pads_the_head_dim_and_keeps_unit_variance_entries():
    # Head dim 24 works in blocks of 32 truncated to 24 columns: rows no longer exactly orthogonal, but every
    # entry still has variance 1, so a row's mean squared norm is 24, as for a gaussian row.
    matrix = hadamard_random_matrix(4096, 24, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    squared_norms = matrix.square().sum(-1)
    assert abs(squared_norms.mean() - 24) < 0.3 and squared_norms.max() <= 32 + 1e-9
    assert abs(matrix.mean()) < 0.02
    # "chi" keeps the directions and redraws the norms.
    chi = hadamard_random_matrix(64, 16, scaling="chi", generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    plain = hadamard_random_matrix(64, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(F.normalize(chi, dim=-1), F.normalize(plain, dim=-1))
    assert chi.norm(dim=-1).std() > 0.1


def test_random_projection_names_the_bad_kind():
    with pytest.raises(ValueError, match="projection 'sorf' is not one of 'orthogonal', 'gaussian', 'hadamard'"):
        random_projection("sorf", 4, 4)


def test_causal_favor_equals_the_quadratic_reference_on_the_same_features():
    q, k = gaussians(2, 2, 37, 16, seed=1, scale=3.0), gaussians(2, 2, 37, 16, seed=2, scale=3.0)
    v = gaussians(2, 2, 37, 16, seed=3)
    projection = gaussian_orthogonal_random_matrix(24, 16, generator=torch.Generator().manual_seed(0), dtype=q.dtype)
    out = favor_attention(q, k, v, projection, is_causal=True, chunk_size=8, eps=1e-4)
    phi_q, _ = softmax_kernel_features(q, projection, is_query=True, eps=1e-4)
    phi_k, offset = softmax_kernel_features(k, projection, is_query=False, causal=True, eps=1e-4)
    expected = kernel_attention_reference(phi_q, phi_k, v, key_log_scale=offset, is_causal=True)
    torch.testing.assert_close(out, expected)
    assert_same(grads(out, (q, k, v)), grads(expected, (q, k, v)))


@pytest.mark.parametrize("options", [{}, {"kernel": "relu"}])
def test_causal_prefix_never_changes_with_the_future(options):
    attention = make(chunk_size=16, **options)
    x = inputs()
    changed = x.clone()
    changed[:, 20:] = torch.randn_like(changed[:, 20:]) * 40
    out, out_changed = attention(x, is_causal=True), attention(changed, is_causal=True)
    torch.testing.assert_close(out[:, :20], out_changed[:, :20], atol=1e-6, rtol=0)
    assert not torch.allclose(out[:, 20:], out_changed[:, 20:])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reference", [False, True])
def test_one_sample_never_changes_another(causal, reference):
    attention = make(reference=reference)
    x = inputs()
    changed = x.clone()
    # Large-norm keys: a stabiliser shared over the batch would underflow sample 0's features.
    changed[1] = changed[1] * 60 + 5
    torch.testing.assert_close(
        attention(x, is_causal=causal)[0], attention(changed, is_causal=causal)[0], atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("options", [{}, {"reference": True}, {"kernel": "relu"}])
def test_padding_equals_the_unpadded_sequence_and_padded_values_never_leak(options, causal):
    attention = make(**options)
    x = inputs()
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[1, 25:] = False
    out = attention(x, attn_mask=keep, is_causal=causal)
    unpadded = attention(x[1:, :25], is_causal=causal)
    torch.testing.assert_close(out[1, :25], unpadded[0], atol=1e-6, rtol=1e-5)
    changed = x.clone()
    changed[1, 25:] = torch.randn(12, DIM) * 50
    torch.testing.assert_close(
        attention(changed, attn_mask=keep, is_causal=causal)[keep], out[keep], atol=1e-6, rtol=1e-5
    )
    # A sample whose every key is padded gives a finite (zero) output.
    keep[0] = False
    assert torch.isfinite(attention(x, attn_mask=keep, is_causal=causal)).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("precision", ["module", "autocast"])
def test_bf16_large_norm_long_sequence_equals_the_reference(precision, causal):
    """4K tokens of 30 times a block's scale, the module in bf16 or under autocast, against
    `favor_attention_reference` in float32 between the same projections: the features are stabilised and summed in
    float32, so only bf16's roundings of the inputs and outputs remain (bounds: `builders.BF16_ROUNDOFF`); an
    overflow of the features in bf16 would err by order 1."""
    torch.manual_seed(0)
    attention = zoo.create_attention("performer", 64, 1, nb_features=64).train()
    x = torch.randn(1, 4096, 64, generator=torch.Generator().manual_seed(0)) * 30
    if precision == "module":
        attention, x = attention.to(torch.bfloat16), x.to(torch.bfloat16)
    out, x_grad, params = builders.bf16_against(
        attention,
        x,
        lambda module, x: favor_module_reference(module, x, causal),
        autocast=precision == "autocast",
        is_causal=causal,
    )
    assert out <= 4 * builders.BF16_ROUNDOFF, out
    bound = 12 * builders.BF16_ROUNDOFF  # log2(4096) roundings
    assert x_grad <= bound and all(error <= bound for error in params.values()), (x_grad, params)


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_redraws_count_optimizer_steps_and_are_identical_across_replicas(projection):
    attention = make(redraw_interval=2, projection=projection)
    initial = attention.random_features.clone()
    on_optimizer_step(attention)
    assert torch.equal(attention.random_features, initial) and int(attention.step) == 1
    on_optimizer_step(attention)
    assert not torch.equal(attention.random_features, initial) and int(attention.step) == 2
    # A replica built from another RNG state but sharing the seed buffer (as data parallelism broadcasts it).
    torch.manual_seed(123)
    replica = zoo.create_attention("performer", DIM, HEADS, nb_features=24, redraw_interval=2, projection=projection)
    assert not torch.equal(replica.random_features, initial)
    replica.seed.copy_(attention.seed)
    replica.random_features.copy_(replica.draw_features(0))
    assert torch.equal(replica.random_features, initial)
    for _ in range(2):
        on_optimizer_step(replica)
    assert torch.equal(replica.random_features, attention.random_features)
    # Resuming from the state dict continues identically.
    resumed = make(redraw_interval=2, projection=projection)
    resumed.load_state_dict(attention.state_dict())
    for module in (attention, resumed):
        for _ in range(2):
            on_optimizer_step(module)
    assert torch.equal(resumed.random_features, attention.random_features)


def test_no_redraws_when_the_interval_is_zero():
    attention = make()
    initial = attention.random_features.clone()
    for _ in range(5):
        on_optimizer_step(attention)
    assert torch.equal(attention.random_features, initial)


def test_blocked_favor_refuses_double_backward_and_keys_longer_than_queries_take_the_reference_path():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 37, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 60, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    projection = torch.randn(16, 8, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(
        favor_attention(q, k, v, projection), favor_attention(q, k, v, projection, reference=True)
    )
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(favor_attention(q, q, q, projection).square().sum(), q, create_graph=True)
