"""The contract every registered attention variant keeps, driven by the registry alone.

Each variant is built with its class's `test_options` (B=2, N=37, dim 32, 2 heads; a 2-D variant's options put its
grid and prefix tokens at 37 positions), so a new variant needs one file and one import line, and no edit here:
`test_a_new_variant_is_picked_up_with_no_test_edit` registers one at runtime and runs every check on it.

Checks: shapes, a gradient for every parameter, weights that copy from softmax, timm's shared arguments reaching
the base class, samples that never mix, padded keys that get no weight, a causal prefix that never sees the future,
a finite bf16 forward and backward at 4K tokens of large norm, and at a block's scale one within a bf16 tolerance
of float32; for variants with a `reference` option, the fast path against the reference on outputs and every
gradient, also with small kernel blocks and every unwritten buffer poisoned with NaN; for variants that decode,
`decode_step` against the causal forward.
"""

import contextlib
import copy
import importlib
import math
from functools import partial
from typing import ClassVar

import builders
import pytest
import torch
from torch import nn

import zoo
from zoo.attention import _registry, _workspace, attention_options, get_attention, list_attentions
from zoo.attention.softmax import SoftmaxAttention

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37
ALL = list_attentions()


def supports_causal(name: str) -> bool:
    return get_attention(name).supports_causal


def has_reference(name: str) -> bool:
    return "reference" in attention_options(name)


def decodes(name: str) -> bool:
    return hasattr(get_attention(name), "decode_step")


# Variant `name` with its class's test options (and overrides), eval mode, seed 0.
build = partial(builders.make, dim=DIM, heads=HEADS, with_test_options=True)


def long_options(name: str, length: int) -> tuple[dict, int]:
    """Options for a sequence of about `length` tokens, and its exact length: a 2-D variant gets a square grid of
    `length` patches after its prefix tokens; a variant with a `max_seq_len` gets one that fits."""
    options, cls = {}, get_attention(name)
    if cls.needs_grid:
        side = round(length**0.5)
        options["grid_size"] = (side, side)
        length = cls.test_options.get("num_prefix_tokens", 0) + side * side
    if "max_seq_len" in attention_options(name):
        options["max_seq_len"] = length
    return options, length


def inputs(batch: int = BATCH, length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    return builders.tokens(batch, length, DIM, seed)


def padding() -> torch.Tensor:
    return builders.padded_tails(LENGTH, (30, 20))


# The contract, one function per property, so that a variant registered at runtime can run all of them.


def check_shape_and_every_parameter_gets_a_gradient(name: str) -> None:
    attention = build(name, qkv_bias=True).train()
    out = attention(inputs())
    assert out.shape == (BATCH, LENGTH, DIM)
    out.square().mean().backward()
    for param_name, param in attention.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, param_name


def check_weights_copy_from_softmax(name: str) -> None:
    source, target = build("softmax", qkv_bias=True), build(name, qkv_bias=True)
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    assert not unexpected
    assert all(not key.startswith(("qkv", "proj")) for key in missing)
    torch.testing.assert_close(target.qkv.weight, source.qkv.weight)


def check_timm_arguments_reach_the_base_class(name: str) -> None:
    shared = {"attn_head_dim": 8, "dim_out": 24, "qkv_bias": True, "qk_norm": True, "scale_norm": True}
    shared |= {"proj_bias": False, "gated": True, "proj_drop": 0.25, "norm_layer": nn.LayerNorm}
    attention = build(name, **shared, dtype=torch.float64)
    assert attention.head_dim == 8 and attention.qkv.out_features == 3 * HEADS * 8
    assert attention.qkv.bias is not None and attention.proj.bias is None and attention.proj.out_features == 24
    assert isinstance(attention.q_norm, nn.LayerNorm) and isinstance(attention.norm, nn.LayerNorm)
    assert attention.gate is not None and attention.proj_drop.p == 0.25
    tensors = [*attention.parameters(), *attention.buffers()]
    assert all(t.dtype == torch.float64 for t in tensors if t.is_floating_point())
    assert attention(inputs().double()).shape == (BATCH, LENGTH, 24)
    if get_attention(name).has_attention_weights:
        assert build(name, attn_drop=0.5).attn_drop.p == 0.5
    else:
        with pytest.raises(ValueError, match="attn_drop=0.5"):
            build(name, attn_drop=0.5)


def check_one_sample_never_changes_another(name: str) -> None:
    attention = build(name)
    x = inputs()
    changed = x.clone()
    changed[1] = changed[1] * 50 + 3
    torch.testing.assert_close(attention(x)[0], attention(changed)[0], rtol=1e-5, atol=1e-5)


def check_padded_keys_get_no_weight(name: str, mask_form: str = "bool") -> None:
    attention = build(name)
    x, keep = inputs(), padding()
    mask = {
        "bool": keep,
        "timm4d": keep[:, None, None, :],
        "additive": torch.zeros(BATCH, 1, 1, LENGTH).masked_fill(~keep[:, None, None, :], float("-inf")),
    }[mask_form]
    changed = x.clone()
    changed[~keep] = torch.randn_like(changed[~keep]) * 40
    out, out_changed = attention(x, attn_mask=mask), attention(changed, attn_mask=mask)
    torch.testing.assert_close(out[keep], out_changed[keep], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()


def check_causal(name: str) -> None:
    """A causal prefix never changes with the future; a variant without a causal mode refuses `is_causal`."""
    attention = build(name)
    x = inputs()
    if not supports_causal(name):
        with pytest.raises(ValueError, match="no causal mode"):
            attention(x, is_causal=True)
        return
    changed = x.clone()
    changed[:, 20:] = torch.randn_like(changed[:, 20:]) * 40
    torch.testing.assert_close(
        attention(x, is_causal=True)[:, :20], attention(changed, is_causal=True)[:, :20], rtol=1e-5, atol=1e-5
    )


# Functions whose results are discrete choices that one rounding flips at a near tie (a token's LSH bucket), name:
# dotted paths; the float32 run takes the bf16 run's choices, so that the comparison measures rounding alone.
DISCRETE_CHOICES = {"reformer": ["zoo.attention.reformer.lsh_buckets"]}


@contextlib.contextmanager
def replayed_choices(name: str):
    """Yields `replay()`: before it, each call of the variant's `DISCRETE_CHOICES` functions is recorded; after it,
    they return the recorded results in the same order."""
    recorded, replaying = {target: [] for target in DISCRETE_CHOICES.get(name, [])}, []

    def wrap(target, original):
        def choose(*args, **kwargs):
            if not replaying:
                recorded[target].append(original(*args, **kwargs))
                return recorded[target][-1]
            return recorded[target].pop(0)

        return choose

    with pytest.MonkeyPatch.context() as patch:
        for target in recorded:
            module, _, attribute = target.rpartition(".")
            patch.setattr(target, wrap(target, getattr(importlib.import_module(module), attribute)))
        yield lambda: replaying.append(True)
    assert all(not calls for calls in recorded.values()), "the float32 run made fewer choices than the bf16 run"


def check_bf16_long_sequence_equals_float32(name: str) -> None:
    """At 4K tokens of a block's scale (after a LayerNorm), the bf16 module against the same module in float32
    (weights and input the bf16 values, widened), on the output and the gradients of the input and every parameter.

    Tolerances, relative norms in units of bf16's roundoff (`builders.BF16_ROUNDOFF`): 4 on the output, log2(N) =
    12 on a gradient. A wrong normaliser, an overflow or a mask misread in bf16 errs by order 1.
    """
    options, length = long_options(name, 4096)
    low = build(name, **options).to(torch.bfloat16).train()
    high = copy.deepcopy(low).float()
    x = builders.tokens(1, length, DIM, seed=0).to(torch.bfloat16)
    results = []
    with replayed_choices(name) as replay:
        for attention, dtype in ((low, torch.bfloat16), (high, torch.float32)):
            x_in = x.to(dtype, copy=True).requires_grad_()
            torch.manual_seed(1)
            out = attention(x_in)
            assert out.dtype == dtype
            weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
            (out.float() * weight).sum().backward()
            results.append((out, x_in.grad, [param.grad for _, param in attention.named_parameters()]))
            replay()

    relative = builders.relative_error
    (out, x_grad, grads), (expected, expected_x_grad, expected_grads) = results
    assert relative(out, expected) <= 4 * builders.BF16_ROUNDOFF, relative(out, expected)
    bound = math.log2(length) * builders.BF16_ROUNDOFF
    assert relative(x_grad, expected_x_grad) <= bound, relative(x_grad, expected_x_grad)
    for (param_name, _), got, want in zip(low.named_parameters(), grads, expected_grads, strict=True):
        assert relative(got, want) <= bound, (param_name, relative(got, want))


def check_bf16_long_sequence_is_finite(name: str) -> None:
    """Inputs 30 times a block's scale: logits in the hundreds, where bf16 steps by whole units and one rounding
    changes a softmax weight by a factor e, so no float32 result is within a bf16 tolerance of it: what this checks
    is that nothing overflows or divides by zero (the comparison with float32: at a block's scale, above)."""
    options, length = long_options(name, 4096)
    attention = build(name, **options).to(torch.bfloat16).train()
    x = (torch.randn(1, length, DIM) * 30).to(torch.bfloat16).requires_grad_()
    out = attention(x)
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


# Knobs that cut the hand-written kernels into many small blocks at N = 37, so that ragged last blocks, online
# maxima across blocks and the flash-parts path (blocks of 64 and more by default) all run.
SMALL_BLOCKS = {
    "zoo.attention._kernels.flash_parts.FLASH_MIN_BLOCK": 1,
    "zoo.attention._kernels.flash_parts.FLASH_KEY_TILE": 1,
    "zoo.attention._kernels.flash_parts.PIECE_BYTES": 1,
    "zoo.attention._kernels.blocked_linear.FAVOR_BLOCK_BYTES": 16 * 2 * 2 * 24 * 8,
    "zoo.attention._kernels.blocked_linear.LINEAR_BLOCK_BYTES": 8 * 2 * 2 * 17 * 8,
    "zoo.attention._kernels.blocked_softmax._BLOCK_BYTES": 8 * 2 * 2 * 7 * 8,
    "zoo.attention._kernels.blocked_softmax._MAX_KEY_BLOCK": 7,
    "zoo.attention._kernels.reformer.BLOCK_SCORES": 2 * 8 * 16,
    "zoo.attention._kernels.gau._PASS_BYTES": 1,
}


@contextlib.contextmanager
def small_poisoned_blocks():
    """Small kernel blocks, and every buffer a kernel allocates unwritten filled with NaN: a stray read of memory
    a kernel never wrote then shows up in the outputs or gradients (flash-linear-attention's tests do the same)."""
    with pytest.MonkeyPatch.context() as patch, _workspace.poison_unwritten():
        for target, value in SMALL_BLOCKS.items():
            patch.setattr(target, value)
        yield


def check_fast_path_equals_reference(name: str, causal: bool, masked: bool) -> None:
    """Outputs and the gradients of the input and every parameter, in float64, rows of padded queries aside."""
    fast = build(name, qkv_bias=True).double()
    reference = build(name, qkv_bias=True, reference=True).double()
    reference.load_state_dict(fast.state_dict())
    keep = padding() if masked else torch.ones(BATCH, LENGTH, dtype=torch.bool)
    mask = keep if masked else None
    results = []
    for attention in (fast, reference):
        x = inputs().double().requires_grad_()
        out = attention(x, attn_mask=mask, is_causal=causal)
        results.append((out[keep], builders.grads(out, (x, *attention.parameters()), keep, allow_unused=True)))
    (out, grads), (expected, expected_grads) = results
    torch.testing.assert_close(out, expected)
    names = ["input", *(param_name for param_name, _ in fast.named_parameters())]
    for param_name, got, want in zip(names, grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, msg=lambda message, param=param_name: f"gradient of {param}: {message}")


def check_decode_step_equals_the_causal_forward(name: str) -> None:
    """Token by token, left padding and a hole skipped like the key padding mask, equals the causal forward."""
    attention = build(name, qkv_bias=True, gated=True)
    x = inputs()
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[0, :4] = False
    keep[1, 10] = False
    for mask in (None, keep):
        full = attention(x, attn_mask=mask, is_causal=True)
        state, steps = None, []
        for t in range(LENGTH):
            out, state = attention.decode_step(x[:, t], state, keep=None if mask is None else mask[:, t])
            steps.append(out)
        rows = torch.ones_like(keep) if mask is None else keep
        torch.testing.assert_close(torch.stack(steps, dim=1)[rows], full[rows], atol=1e-5, rtol=1e-5)


CONTRACT = [
    check_shape_and_every_parameter_gets_a_gradient,
    check_weights_copy_from_softmax,
    check_timm_arguments_reach_the_base_class,
    check_one_sample_never_changes_another,
    check_padded_keys_get_no_weight,
    check_causal,
    check_bf16_long_sequence_is_finite,
    check_bf16_long_sequence_equals_float32,
]


@pytest.mark.parametrize("name", ALL)
def test_shape_and_every_parameter_gets_a_gradient(name):
    check_shape_and_every_parameter_gets_a_gradient(name)


@pytest.mark.parametrize("name", ALL)
def test_weights_copy_from_softmax(name):
    check_weights_copy_from_softmax(name)


@pytest.mark.parametrize("name", ALL)
def test_timm_arguments_reach_the_base_class(name):
    check_timm_arguments_reach_the_base_class(name)


@pytest.mark.parametrize("name", ALL)
def test_one_sample_never_changes_another(name):
    check_one_sample_never_changes_another(name)


@pytest.mark.parametrize("mask_form", ["bool", "timm4d", "additive"])
@pytest.mark.parametrize("name", ALL)
def test_padded_keys_get_no_weight(name, mask_form):
    check_padded_keys_get_no_weight(name, mask_form)


@pytest.mark.parametrize("name", ALL)
def test_causal_never_sees_the_future_or_is_refused(name):
    check_causal(name)


@pytest.mark.parametrize("name", ALL)
def test_bf16_long_sequence_is_finite(name):
    check_bf16_long_sequence_is_finite(name)


@pytest.mark.parametrize("name", ALL)
def test_bf16_long_sequence_equals_float32(name):
    check_bf16_long_sequence_equals_float32(name)


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize(
    "name,causal",
    # causal only where the variant has a causal mode (the others refuse it: test_causal_never_sees_the_future_...)
    [
        pytest.param(name, causal, id=f"{name}-{'causal' if causal else 'bidirectional'}")
        for name in ALL
        if has_reference(name)
        for causal in (False, True)
        if supports_causal(name) or not causal
    ],
)
def test_fast_path_equals_reference_in_small_poisoned_blocks(name, causal, masked):
    with small_poisoned_blocks():
        check_fast_path_equals_reference(name, causal, masked)


@pytest.mark.parametrize("name", [name for name in ALL if decodes(name)])
def test_decode_step_equals_the_causal_forward(name):
    check_decode_step_equals_the_causal_forward(name)


def test_every_variant_with_a_fast_path_names_its_switch_reference():
    for name in ALL:
        options = attention_options(name)
        assert "fused" not in options, name
        if "reference" in options:
            assert options["reference"] is False, f"{name}: the fast path is the default"


def test_poisoning_catches_a_kernel_that_reads_unwritten_memory():
    # A kernel that forgets to write part of its output: invisible with fresh memory that happens to hold zeros,
    # NaN under poisoning.
    def forgetful(like: torch.Tensor) -> torch.Tensor:
        out = _workspace.unwritten(like, like.shape)
        out[:-1] = like[:-1]
        return out

    like = torch.ones(4, 3)
    with _workspace.poison_unwritten():
        assert torch.isnan(forgetful(like)[-1]).all()
        assert _workspace.unwritten(like, (2,), dtype=torch.int64).eq(torch.iinfo(torch.int64).max).all()
    assert not _workspace._POISON


def test_a_new_variant_is_picked_up_with_no_test_edit():
    """One class registered under a new name (here a copy of softmax, as a new family file would do on import) is
    listed by the registry, and every check above runs on it from its class attributes alone."""

    @zoo.register_attention("throwaway_softmax")
    class ThrowawayAttention(SoftmaxAttention):
        test_options: ClassVar[dict] = {}

    try:
        assert "throwaway_softmax" in list_attentions() and has_reference("throwaway_softmax")
        for check in CONTRACT:
            check("throwaway_softmax")
        with small_poisoned_blocks():
            for causal, masked in ((False, False), (True, True)):
                check_fast_path_equals_reference("throwaway_softmax", causal, masked)
    finally:
        _registry._ATTENTIONS.unregister("throwaway_softmax")
    assert "throwaway_softmax" not in list_attentions()
