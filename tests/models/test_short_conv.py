"""The short convolution before every attention (`zoo.models.blocks.ShortConv`, `model.sequence.short_conv`): a
float64 reference, causality, masked positions that never leak, the identity at initialisation, and the recipe key
that reaches every block."""

import pytest
import torch

from zoo.config import RecipeError, load_recipe
from zoo.data import DataContext, build_dataset
from zoo.kinds import get_model_kind, sizes_of
from zoo.models import create_sequence_model
from zoo.models.blocks import Block, ShortConv
from zoo.models.generation import supports_recurrent

B, N, C = 2, 37, 8


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """out[b, i, c] = bias[c] + sum_t weight[c, t] * x[b, i - k + 1 + t, c], zero before the start."""
    k = weight.shape[1]
    out = bias.expand_as(x).clone()
    for i in range(x.shape[1]):
        for t in range(k):
            j = i - k + 1 + t
            if j >= 0:
                out[:, i] += weight[:, t] * x[:, j]
    return out


def randomised(kernel: int) -> ShortConv:
    conv = ShortConv(C, kernel).double()
    torch.manual_seed(0)
    with torch.no_grad():
        conv.conv.weight.normal_()
        conv.conv.bias.normal_()
    return conv


@pytest.mark.parametrize("kernel", [1, 3, 4])
def test_matches_a_float64_reference(kernel):
    conv = randomised(kernel)
    x = torch.randn(B, N, C, dtype=torch.float64)
    expected = reference(x, conv.conv.weight[:, 0], conv.conv.bias)
    torch.testing.assert_close(conv(x), expected)


def test_is_causal_and_masked_positions_never_leak():
    conv = randomised(3)
    x = torch.randn(B, N, C, dtype=torch.float64)
    later = x.clone()
    later[:, 20:] = torch.randn_like(later[:, 20:])
    torch.testing.assert_close(conv(later)[:, :20], conv(x)[:, :20])
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, 10] = mask[1, 30:] = False
    changed = x.clone()
    changed[~mask] = 1e6
    torch.testing.assert_close(conv(changed, mask)[mask], conv(x, mask)[mask])
    # without the mask the masked token reaches its two successors: the test can fail
    assert not torch.allclose(conv(changed)[0, 11], conv(x)[0, 11])


def test_starts_bound_to_the_previous_token_and_learns():
    x = torch.randn(B, N, C)
    shifted = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
    torch.testing.assert_close(ShortConv(C, 3)(x), x + shifted)
    torch.testing.assert_close(ShortConv(C, 1)(x), x)
    torch.manual_seed(0)
    plain, with_conv = Block(C, 2), Block(C, 2, short_conv=3)
    missing, unexpected = with_conv.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing) == ["short_conv.conv.bias", "short_conv.conv.weight"] and not unexpected
    with_conv(x).square().sum().backward()
    assert with_conv.short_conv.conv.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="short_conv=-1"):
        Block(C, 2, short_conv=-1)


def test_timms_initialisation_keeps_the_start():
    # timm's init_weights_vit_timm resets every Conv1d it meets: the backbone must end with the documented start
    model = create_sequence_model("token_classification", input="tokens", num_classes=5, dim=C, depth=2, short_conv=3)
    for block in model.backbone.blocks:
        expected = torch.zeros(C, 1, 3)
        expected[:, 0, 1:] = 1.0
        torch.testing.assert_close(block.short_conv.conv.weight.detach(), expected)


@pytest.mark.parametrize("task", ["token_classification", "causal_token_classification"])
def test_sequence_model_puts_one_before_every_attention(task):
    kwargs = {"input": "tokens", "vocab_size": 11, "num_classes": 11, "dim": 16, "depth": 2, "num_heads": 2}
    model = create_sequence_model(task, short_conv=3, **kwargs)
    assert all(block.short_conv.kernel_size == 3 for block in model.backbone.blocks)
    assert all(block.short_conv is None for block in create_sequence_model(task, **kwargs).backbone.blocks)
    # each attention reads its block's convolution's output: hooks record the order of the calls and what
    # each attention was given
    calls, handles = [], []
    for i, block in enumerate(model.backbone.blocks):
        handles.append(block.short_conv.register_forward_hook(lambda m, args, out, i=i: calls.append(("conv", i, out))))
        handles.append(block.attn.register_forward_hook(lambda m, args, out, i=i: calls.append(("attn", i, args[0]))))
    tokens = torch.randint(0, 11, (B, N))
    out = model(tokens)
    for handle in handles:
        handle.remove()
    assert [(kind, i) for kind, i, _ in calls] == [("conv", 0), ("attn", 0), ("conv", 1), ("attn", 1)]
    for (_, _, conv_out), (_, _, attn_in) in zip(calls[0::2], calls[1::2], strict=True):
        assert attn_in is conv_out
    assert out.shape == (B, N, 11)
    if model.task.causal:
        later = tokens.clone()
        later[:, 25:] = (later[:, 25:] + 1) % 11
        torch.testing.assert_close(model(later)[:, :25], out[:, :25])


def test_recurrent_decoding_is_refused_with_a_short_convolution():
    kwargs = {"attention": "linear", "dim": 16, "depth": 1, "num_heads": 2}
    assert supports_recurrent(create_sequence_model("causal_lm", **kwargs))
    assert not supports_recurrent(create_sequence_model("causal_lm", short_conv=3, **kwargs))


def test_recipe_key_reaches_the_model():
    recipe = load_recipe("recipes/recall_mqar_quick.yaml")
    assert recipe.model.sequence.short_conv == 3
    kind = get_model_kind(recipe.model.kind)
    train_set = build_dataset(
        recipe.data.name, DataContext("train", is_training=True, num_samples=4), **recipe.data.options
    )
    model = kind.build(recipe, sizes_of(recipe, train_set), kind.task(recipe))
    assert [block.short_conv.kernel_size for block in model.backbone.blocks] == [3, 3]
    with pytest.raises(RecipeError, match=r"model\.sequence\.short_conv"):
        load_recipe("recipes/recall_mqar_quick.yaml", ["model.sequence.short_conv=-2"])
