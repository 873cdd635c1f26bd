"""The attention interface: the registry's errors, key padding masks, exact softmax against timm and its reference.

The contract every registered variant keeps runs over the whole registry in `test_attention_registry.py`.
"""

import inspect
from functools import partial

import builders
import pytest
import torch
from torch import nn

import zoo
from zoo.attention import AttentionBase, key_padding_mask, list_attentions

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37
ALL = list_attentions()


make = partial(builders.make, dim=DIM, heads=HEADS, with_test_options=True)


def inputs(batch: int = BATCH, length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    return builders.tokens(batch, length, DIM, seed)


def test_registry_lists_the_baselines():
    assert {"softmax", "performer"} <= set(ALL)


def test_registry_errors_name_the_value():
    with pytest.raises(ValueError, match="'sofmax'.*did you mean 'softmax'"):
        zoo.create_attention("sofmax", DIM, HEADS)
    with pytest.raises(ValueError, match="no option 'nb_feature'.*did you mean 'nb_features'"):
        zoo.create_attention("performer", DIM, HEADS, nb_feature=3)
    with pytest.raises(ValueError, match="already registered"):
        zoo.register_attention("softmax")(type("Again", (nn.Module,), {}))


def test_key_padding_mask_rejects_what_is_not_a_padding_mask():
    with pytest.raises(ValueError, match="not a key padding mask"):
        key_padding_mask(torch.ones(2, 1, 5, 5, dtype=torch.bool), 2, 5)
    with pytest.raises(ValueError, match="bias"):
        key_padding_mask(torch.full((2, 5), 0.5), 2, 5)


def test_softmax_fast_path_equals_reference():
    fast = make("softmax")
    reference = make("softmax", reference=True)
    reference.load_state_dict(fast.state_dict())
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[1, 25:] = False
    for causal in (False, True):
        torch.testing.assert_close(fast(inputs(), keep, causal), reference(inputs(), keep, causal))


def test_softmax_matches_timm_attention():
    from timm.layers import Attention

    ours = make("softmax", qkv_bias=True)
    timm_attention = Attention(DIM, HEADS, qkv_bias=True).eval()
    timm_attention.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(inputs()), timm_attention(inputs()))


def test_the_base_class_takes_every_timm_attention_argument():
    """timm builds a block's attention with keywords from its own `Attention` signature: each has a parameter of
    the same name and default here."""
    from timm.layers import Attention

    ours = inspect.signature(AttentionBase.__init__).parameters
    for name, param in inspect.signature(Attention.__init__).parameters.items():
        assert name in ours and ours[name].default == param.default, name


@pytest.mark.parametrize("name", ALL)
def test_a_variant_passes_timms_arguments_through(name):
    """`__init__(self, dim, num_heads=8, *, <own options>, **timm_args)`: a variant does not copy timm's argument
    list, and none of its own options shadows one of timm's."""
    params = list(inspect.signature(zoo.attention.get_attention(name).__init__).parameters.values())
    assert [(p.name, p.default) for p in params[1:3]] == [("dim", inspect.Parameter.empty), ("num_heads", 8)]
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[3:-1])
    timm_arguments = set(inspect.signature(AttentionBase.__init__).parameters)
    assert not set(zoo.attention.attention_options(name)) & timm_arguments


def test_variants_refuse_attention_dropout_they_cannot_apply():
    with pytest.raises(ValueError, match="attn_drop"):
        zoo.create_attention("performer", DIM, HEADS, attn_drop=0.1)


def test_reference_switch_is_checked():
    with pytest.raises(ValueError, match="reference='yes' must be True or False"):
        zoo.create_attention("softmax", DIM, HEADS, reference="yes")
