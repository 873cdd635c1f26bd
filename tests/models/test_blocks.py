"""Backbone options: timm / GAU blocks, reversible couplings, chunked feed-forward, and their wiring."""

import pytest
import timm
import torch
from timm.models.vision_transformer import Block as TimmBlock

import zoo
from zoo.attention import attention_class
from zoo.config import RecipeError, recipe_from_dict
from zoo.models import Block, ReversibleSequence, ReversibleVisionTransformer, block_class

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37
TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10, "in_chans": 1, "img_size": 32}


def inputs(dtype=torch.float32, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, LENGTH, DIM, generator=generator, dtype=dtype)


def build(
    depth: int,
    attention: str = "softmax",
    attention_options=None,
    *,
    reversible: bool = False,
    drop_path_rate: float = 0.0,
    **options,
) -> torch.nn.Module:
    """`depth` blocks of `block_class` as a model builds them, drop path rising to `drop_path_rate`."""
    block_options = {key: options.pop(key) for key in ("block", "block_options", "ff_chunks") if key in options}
    cls = block_class(attention=attention, attention_options=attention_options, **block_options)
    attn_layer = attention_class(attention, **(attention_options or {}))
    rates = torch.linspace(0, drop_path_rate, depth).tolist()
    blocks = [
        cls(dim=DIM, num_heads=HEADS, attn_layer=attn_layer, drop_path=rate, depth=i, **options)
        for i, rate in enumerate(rates)
    ]
    return ReversibleSequence(*blocks) if reversible else torch.nn.Sequential(*blocks)


def stack(reversible: bool, block: str = "timm", **options) -> torch.nn.Module:
    torch.manual_seed(0)
    attention = "gau" if block == "gau" else "softmax"
    gau = {"attention_options": {"group_size": 8}, "block_options": {"z_dim": 8}} if block == "gau" else {}
    return build(3, attention, block=block, reversible=reversible, **gau, **options)


def outputs_and_grads(blocks: torch.nn.Module, x: torch.Tensor, seed: int = 3, **call) -> tuple[list, torch.Tensor]:
    x = x.clone().requires_grad_()
    torch.manual_seed(seed)
    out = blocks(x, **call)
    out.square().sum().backward()
    return [out, x.grad] + [p.grad for p in blocks.parameters()], out


def test_block_is_timm_block_with_branches():
    ours, theirs = Block(DIM, HEADS, qkv_bias=True), TimmBlock(DIM, HEADS, qkv_bias=True)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    torch.testing.assert_close(ours(inputs()), theirs(inputs()))


def test_ff_chunks_give_identical_outputs_and_gradients():
    plain = Block(DIM, HEADS)
    chunked = Block(DIM, HEADS, ff_chunks=3)
    chunked.load_state_dict(plain.state_dict())
    want, _ = outputs_and_grads(plain, inputs())
    got, _ = outputs_and_grads(chunked, inputs())
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("block", ["timm", "gau"])
@pytest.mark.parametrize("call", [{}, {"is_causal": True}, {"attn_mask": "padding"}], ids=["full", "causal", "mask"])
def test_reversible_recompute_equals_plain_autograd(block, call):
    # fp64, training mode with dropout and drop path on: the backward must replay the random state exactly.
    options = {"proj_drop": 0.1, "drop_path_rate": 0.2, "ff_chunks": 2 if block == "timm" else 0}
    fast = stack(True, block, **options).double().train()
    reference = stack(True, block, **options).double().train()
    reference.recompute = False
    if call.get("attn_mask") == "padding":
        keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
        keep[1, 25:] = False
        call = {"attn_mask": keep}
    got, _ = outputs_and_grads(fast, inputs(torch.float64), **call)
    want, _ = outputs_and_grads(reference, inputs(torch.float64), **call)
    assert all(g is not None for g in got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_reversible_under_autocast_replays_the_precision():
    fast, reference = stack(True), stack(True)
    reference.recompute = False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = outputs_and_grads(fast, inputs())
        want, _ = outputs_and_grads(reference, inputs())
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_reversible_supports_autograd_grad():
    # torch.autograd.grad through the recomputing stack gives the gradients of the stack that stores activations
    blocks, reference = stack(True), stack(True)
    reference.recompute = False
    grads = {}
    for name, module in (("fast", blocks), ("reference", reference)):
        x = inputs().requires_grad_()
        torch.manual_seed(3)
        grads[name] = torch.autograd.grad(module(x).sum(), [x, *module.parameters()])
    assert len(grads["fast"]) == len(list(blocks.parameters())) + 1
    for got, want in zip(grads["fast"], grads["reference"], strict=True):
        assert want.abs().sum() > 0
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _saved_bytes(blocks: torch.nn.Module, x: torch.Tensor) -> int:
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        blocks(x.requires_grad_())
    return total


def test_reversible_activation_memory_does_not_grow_with_depth():
    def saved(depth: int, reversible: bool) -> int:
        torch.manual_seed(0)
        return _saved_bytes(build(depth, reversible=reversible), inputs())

    assert saved(1, True) == saved(4, True) == 2 * BATCH * LENGTH * DIM * 4
    assert saved(4, False) > 3 * saved(1, False)


def test_reversible_sequence_needs_branches():
    with pytest.raises(TypeError, match="branch1"):
        ReversibleSequence(TimmBlock(DIM, HEADS))


def test_unknown_block_and_bad_ff_chunks_name_the_value():
    with pytest.raises(ValueError, match="unknown block 'gua'.*did you mean 'gau'"):
        block_class("gua")
    with pytest.raises(ValueError, match="ff_chunks=-1"):
        block_class(ff_chunks=-1)
    with pytest.raises(ValueError, match="takes no block_options"):
        block_class(block_options={"z_dim": 4})


@pytest.mark.parametrize(
    "options",
    [
        {"block": "gau", "attention": "gau", "attention_options": {"group_size": 8}, "block_options": {"z_dim": 8}},
        {"reversible": True, "attention": "performer"},
        {"ff_chunks": 3},
        {"block": "gau", "attention": "gau", "reversible": True},
    ],
    ids=["gau", "reversible", "ff_chunks", "gau-reversible"],
)
def test_create_model_with_each_option_runs_forward_and_backward(options):
    model = zoo.create_model("vit_tiny_patch16_224", drop_path_rate=0.1, **options, **TINY).train()
    logits = model(torch.randn(2, 1, 32, 32))
    assert logits.shape == (2, 10)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert model.zoo_args["reversible"] == options.get("reversible", False)


def test_reversible_vit_keeps_timm_api_and_weight_names():
    plain = zoo.create_model("vit_tiny_patch16_224", **TINY)
    model = zoo.create_model("vit_tiny_patch16_224", reversible=True, **TINY)
    assert isinstance(model, ReversibleVisionTransformer) and isinstance(model.blocks, ReversibleSequence)
    model.load_state_dict(plain.state_dict(), strict=True)
    x = torch.randn(2, 1, 32, 32)
    features = model.forward_features(x)
    assert model.forward_head(features).shape == (2, 10)
    model.set_grad_checkpointing(True)
    torch.testing.assert_close(model.forward_features(x), features)
    # a mask goes through the reversible stack too, not block by block
    keep = torch.ones(2, features.shape[1], dtype=torch.bool)
    torch.testing.assert_close(model.forward_features(x, attn_mask=keep), features)
    assert "zoo_vit_tiny_patch16_224" in timm.list_models("zoo_*")


def test_create_model_refuses_a_gau_block_with_another_attention():
    with pytest.raises(ValueError, match="attention must be 'gau'"):
        zoo.create_model("vit_tiny_patch16_224", block="gau", **TINY)


def test_recipe_with_gau_blocks_validates():
    model = {
        "block": "gau",
        "attention": {"name": "gau", "options": {"group_size": 64}},
        "reversible": True,
        "block_options": {"z_dim": 64},
    }
    recipe = recipe_from_dict({"name": "x", "model": model})
    assert recipe.model.block == "gau" and recipe.model.reversible and recipe.model.ff_chunks == 0
    with pytest.raises(RecipeError, match="model.attention.name: must be 'gau' when block is 'gau'"):
        recipe_from_dict({"name": "x", "model": {"block": "gau"}})
    with pytest.raises(RecipeError, match="model.ff_chunks"):
        recipe_from_dict({"name": "x", "model": {"ff_chunks": -1}})
    with pytest.raises(RecipeError, match="model.block"):
        recipe_from_dict({"name": "x", "model": {"block": "flash"}})


def test_engine_passes_the_block_options(monkeypatch):
    from zoo.data._sizes import ModelSizes
    from zoo.kinds import get_model_kind
    from zoo.kinds import vit as vit_kind

    seen = {}
    monkeypatch.setattr(vit_kind, "create_model", lambda name, **kwargs: seen.update(kwargs) or torch.nn.Linear(1, 1))
    recipe = recipe_from_dict({"name": "x", "model": {"reversible": True, "ff_chunks": 2}})
    kind = get_model_kind("vit")
    kind.build(recipe, ModelSizes(num_classes=3, in_chans=1), kind.task(recipe))
    assert seen["block"] == "timm" and seen["reversible"] is True and seen["ff_chunks"] == 2
    assert seen["block_options"] == {}
