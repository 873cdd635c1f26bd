"""The contract every registered attention variant keeps, run over the whole registry."""
import pytest
import torch
from torch import nn

import zoo
from zoo.attention import key_padding_mask, list_attentions

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37

# Options that make a variant fit the tiny test sizes (lengths, projected sizes).
SMALL_OPTIONS: dict[str, dict] = {
    "synthesizer": {"max_seq_len": 4096},
    "reformer": {"bucket_size": 8},
    "vq": {"codebook_size": 16, "block_len": 8},
    "banded_conv": {"radius": 8},
    "gau": {"group_size": 8},
}
ALL = list_attentions()
CAUSAL = [name for name in ALL if zoo.attention.get_attention(name).supports_causal]


def make(name: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    return zoo.create_attention(name, DIM, HEADS, **{**SMALL_OPTIONS.get(name, {}), **overrides}).eval()


def inputs(batch: int = BATCH, length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return nn.functional.layer_norm(torch.randn(batch, length, DIM, generator=generator), (DIM,))


def test_registry_lists_the_baselines():
    assert {"softmax", "performer"} <= set(ALL)


def test_registry_errors_name_the_value():
    with pytest.raises(ValueError, match="'sofmax'.*did you mean 'softmax'"):
        zoo.create_attention("sofmax", DIM, HEADS)
    with pytest.raises(ValueError, match="no option 'nb_feature'.*did you mean 'nb_features'"):
        zoo.create_attention("performer", DIM, HEADS, nb_feature=3)
    with pytest.raises(ValueError, match="already registered"):
        zoo.register_attention("softmax")(type("Again", (nn.Module,), {}))


@pytest.mark.parametrize("name", ALL)
def test_shape_and_every_parameter_gets_a_gradient(name):
    attention = make(name, qkv_bias=True).train()
    out = attention(inputs())
    assert out.shape == (BATCH, LENGTH, DIM)
    out.square().mean().backward()
    for param_name, param in attention.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("name", ALL)
def test_weights_copy_from_softmax(name):
    source, target = make("softmax", qkv_bias=True), make(name, qkv_bias=True)
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    assert not unexpected
    assert all(not key.startswith(("qkv", "proj")) for key in missing)
    torch.testing.assert_close(target.qkv.weight, source.qkv.weight)


@pytest.mark.parametrize("name", ALL)
def test_one_sample_never_changes_another(name):
    attention = make(name)
    x = inputs()
    changed = x.clone()
    changed[1] = changed[1] * 50 + 3
    torch.testing.assert_close(attention(x)[0], attention(changed)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_form", ["bool", "timm4d", "additive"])
@pytest.mark.parametrize("name", ALL)
def test_padded_keys_get_no_weight(name, mask_form):
    attention = make(name)
    x = inputs()
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[0, 30:] = False
    keep[1, 20:] = False
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


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_never_sees_the_future(name):
    attention = make(name)
    x = inputs()
    changed = x.clone()
    changed[:, 20:] = torch.randn_like(changed[:, 20:]) * 40
    torch.testing.assert_close(attention(x, is_causal=True)[:, :20], attention(changed, is_causal=True)[:, :20],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in ALL if n not in CAUSAL])
def test_non_causal_variants_refuse_is_causal(name):
    with pytest.raises(ValueError, match="no causal mode"):
        make(name)(inputs(), is_causal=True)


@pytest.mark.parametrize("name", ALL)
def test_bf16_long_sequence_is_finite(name):
    attention = make(name).to(torch.bfloat16).train()
    x = (torch.randn(1, 4096, DIM) * 30).to(torch.bfloat16).requires_grad_()
    out = attention(x)
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_key_padding_mask_rejects_what_is_not_a_padding_mask():
    with pytest.raises(ValueError, match="not a key padding mask"):
        key_padding_mask(torch.ones(2, 1, 5, 5, dtype=torch.bool), 2, 5)
    with pytest.raises(ValueError, match="bias"):
        key_padding_mask(torch.full((2, 5), 0.5), 2, 5)


def test_softmax_fused_equals_reference():
    fused = make("softmax")
    reference = make("softmax", fused=False)
    reference.load_state_dict(fused.state_dict())
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[1, 25:] = False
    for causal in (False, True):
        torch.testing.assert_close(fused(inputs(), keep, causal), reference(inputs(), keep, causal))


def test_softmax_matches_timm_attention():
    from timm.layers import Attention

    ours = make("softmax", qkv_bias=True)
    timm_attention = Attention(DIM, HEADS, qkv_bias=True).eval()
    timm_attention.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(inputs()), timm_attention(inputs()))


def test_variants_refuse_attention_dropout_they_cannot_apply():
    with pytest.raises(ValueError, match="attn_drop"):
        zoo.create_attention("performer", DIM, HEADS, attn_drop=0.1)
