"""timm's model contract for every registered zoo architecture (`timm.list_models("zoo_*")`) with every registered
attention (`zoo.list_attentions()`): a variant or architecture added later is covered with no edit here.

What timm documents for a ViT and its users rely on: `features_only=True` with `out_indices` and `feature_info`;
`forward_intermediates` (NCHW and NLC, `indices`, `stop_early`, `intermediates_only`, prefix tokens);
`prune_intermediate_layers`; timm's fx feature extraction; `set_grad_checkpointing`; `reset_classifier`; the
`pretrained_cfg` fields timm's own tests read; `torch.export` and `torch.compile`. Each is checked against values
computed independently: the tokens after each block, from the model's pieces run by hand (`block_tokens`).

Models are tiny (32 wide, 2 blocks of 2 heads, a 6 x 6 patch grid at the architecture's own patch size: the
suite's 37 tokens, which every variant's `test_options` are sized for). At that size the architectures differ
only in their patch size. Pairs: each attention with one architecture, in turn, so every attention and every
architecture is in the fast set; each attention again at the other patch size, and export per attention, are
marked slow. Compilation: the model here with softmax; each attention's own, through AOTAutograd, in
tests/models/test_graph_breaks.py.
"""

from __future__ import annotations

import copy
import functools

import pytest
import timm
import torch
from einops import rearrange
from timm.models import create_feature_extractor
from torch import nn

from zoo.attention import get_attention, list_attentions

# the NaFlex models take patch dicts, not image batches: their contract is tests/models/test_naflex.py
ARCHITECTURES = [arch for arch in timm.list_models("zoo_*") if not arch.startswith("zoo_naflexvit")]
ATTENTIONS = list_attentions()
DIM, DEPTH, HEADS, CLASSES, GRID, BATCH = 32, 2, 2, 5, 6, 2
ATOL = 1e-5


def fast_pairs() -> list[tuple[str, str]]:
    """Attention i with architecture i (mod their count), then any architecture left over with softmax: every
    attention and every architecture once."""
    pairs = [(ARCHITECTURES[i % len(ARCHITECTURES)], name) for i, name in enumerate(ATTENTIONS)]
    return pairs + [(arch, "softmax") for arch in ARCHITECTURES[len(ATTENTIONS) :]]


def params(pairs: list[tuple[str, str]]) -> list:
    return [pytest.param(arch, name, id=f"{arch}-{name}") for arch, name in pairs]


def other_pairs() -> list[tuple[str, str]]:
    """Each attention once more, with the first architecture of another patch size than its fast pair's. At the
    tests' size the architectures differ only in their patch size (the grid, width and depth are the tests'), so
    this covers what the whole cross product would, at a ninth of its cost."""
    pairs = []
    for arch, name in fast_pairs()[: len(ATTENTIONS)]:
        other = next((a for a in ARCHITECTURES if patch_size(a) != patch_size(arch)), None)
        if other is not None:
            pairs.append((other, name))
    return pairs


@functools.cache
def patch_size(arch: str) -> int:
    """The architecture's own patch size, read from a one-block, 8-wide build of it (its name may not say)."""
    model = timm.create_model(arch, embed_dim=8, depth=1, num_heads=1, num_classes=0)
    size = model.patch_embed.patch_size
    assert size[0] == size[1], size
    return size[0]


def options(name: str) -> dict:
    """The variant's small test options; the model sets a 2-D variant's grid itself."""
    return {k: v for k, v in get_attention(name).test_options.items() if k not in ("grid_size", "num_prefix_tokens")}


def tiny(arch: str, name: str, **kwargs) -> dict:
    return {
        "attention": name, "attention_options": options(name), "img_size": GRID * patch_size(arch),
        "embed_dim": DIM, "depth": DEPTH, "num_heads": HEADS, "num_classes": CLASSES, **kwargs,
    }  # fmt: skip


def build(arch: str, name: str, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(arch, **tiny(arch, name, **kwargs)).eval()


def images(arch: str) -> torch.Tensor:
    size = GRID * patch_size(arch)
    return torch.randn(BATCH, 3, size, size, generator=torch.Generator().manual_seed(1))


def block_tokens(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Tokens `[b, n, c]` after each block, from the model's pieces run one after the other (timm's
    `forward_features` order), not through `forward_intermediates`."""
    x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
    tokens = []
    for block in model.blocks:
        x = block(x)
        tokens.append(x)
    return tokens


def to_map(tokens: torch.Tensor, prefix: int) -> torch.Tensor:
    """`[b, n, c]` -> the patch tokens as `[b, c, h, w]` (h = w = GRID)."""
    return rearrange(tokens[:, prefix:], "b (h w) c -> b c h w", h=GRID)


def close(got: torch.Tensor, want: torch.Tensor, **tolerance) -> None:
    torch.testing.assert_close(got, want, **({"atol": ATOL, "rtol": 1e-4} | tolerance))


def counting_calls(module: nn.Module) -> list[int]:
    """A one-item list counting the runs of `module.forward` from now on (a forward hook would miss the runs of
    checkpointing's recomputation, which skips module hooks)."""
    calls, forward = [0], module.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    module.forward = counted
    return calls


@pytest.mark.parametrize(("arch", "name"), params(fast_pairs()))
def test_features_only_returns_the_blocks_as_feature_info_describes(arch, name):
    plain, x = build(arch, name), images(arch)
    want = [to_map(t, plain.num_prefix_tokens) for t in block_tokens(plain, x)]
    torch.manual_seed(0)
    features = timm.create_model(arch, features_only=True, out_indices=(0, 1), **tiny(arch, name)).eval()
    # the wrapped model was pruned (no final norm, no head): every weight it kept is the plain model's
    kept = features.model.state_dict()
    assert set(kept) <= set(plain.state_dict())
    features.model.load_state_dict({k: plain.state_dict()[k] for k in kept})
    info = features.feature_info
    assert info.channels() == [DIM, DIM]
    assert info.reduction() == [patch_size(arch)] * 2
    assert info.module_name() == ["blocks.0", "blocks.1"]
    maps = features(x)
    assert len(maps) == 2
    for got, expected, channels, reduction in zip(maps, want, info.channels(), info.reduction(), strict=True):
        assert got.shape == (BATCH, channels, x.shape[-2] // reduction, x.shape[-1] // reduction)
        close(got, expected)
    # the input timm's data config reads is the model's own, on the wrapper too
    assert features.pretrained_cfg["input_size"] == (3, *x.shape[-2:])


@pytest.mark.parametrize(("arch", "name"), params(fast_pairs()))
def test_forward_intermediates_in_every_format(arch, name):
    model, x = build(arch, name), images(arch)
    prefix = model.num_prefix_tokens
    tokens = block_tokens(model, x)
    final, inter = model.forward_intermediates(x, indices=2, output_fmt="NLC")
    # the final features are forward_features', and the last intermediate is the last block's output
    close(final, model.forward_features(x))
    close(final, model.norm(tokens[-1]))
    for got, want in zip(inter, tokens, strict=True):
        close(got, want[:, prefix:])
    maps = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    for got, want in zip(maps, tokens, strict=True):
        close(got, to_map(want, prefix))
    # with prefix tokens: (map, prefix tokens) per index; normed with norm=True
    ((patches, cls),) = model.forward_intermediates(
        x, indices=[1], norm=True, return_prefix_tokens=True, intermediates_only=True
    )
    close(patches, to_map(model.norm(tokens[1]), prefix))
    close(cls, model.norm(tokens[1])[:, :prefix])


@pytest.mark.parametrize(("arch", "name"), params(fast_pairs()))
def test_stop_early_and_pruning_skip_the_later_blocks(arch, name):
    model, x = build(arch, name), images(arch)
    prefix = model.num_prefix_tokens
    first = block_tokens(model, x)[0]
    later = counting_calls(model.blocks[1])
    final, (inter,) = model.forward_intermediates(x, indices=[0], stop_early=True)
    assert later == [0]
    close(final, model.norm(first))
    close(inter, to_map(first, prefix))
    pruned = copy.deepcopy(model)
    assert pruned.prune_intermediate_layers(indices=[0], prune_norm=True) == [0]
    assert len(pruned.blocks) == 1 and isinstance(pruned.norm, nn.Identity) and isinstance(pruned.head, nn.Identity)
    (got,) = pruned.forward_intermediates(x, indices=[0], intermediates_only=True)
    close(got, to_map(first, prefix))
    with pytest.raises(AssertionError):
        # timm's own check: an index past the pruned depth
        pruned.forward_intermediates(x, indices=[1], intermediates_only=True)


@pytest.mark.parametrize(("arch", "name"), params(fast_pairs()))
def test_timm_fx_feature_extraction(arch, name):
    model, x = build(arch, name), images(arch)
    tokens = block_tokens(model, x)
    extractor = create_feature_extractor(model, return_nodes={"blocks.0": "first", "norm": "last"})
    # each zoo attention is one leaf node of the traced graph
    leaves = [node.target for node in extractor.graph.nodes if node.op == "call_module"]
    assert "blocks.0.attn" in leaves and "blocks.1.attn" in leaves
    features = extractor(x)
    close(features["first"], tokens[0])
    close(features["last"], model.norm(tokens[1]))


@pytest.mark.parametrize(("arch", "name"), params(fast_pairs()))
def test_gradient_checkpointing_recomputes_to_the_same_gradients(arch, name):
    plain, x = build(arch, name), images(arch)
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    calls = counting_calls(checkpointed.blocks[0])
    grads = []
    for model in (plain, checkpointed):
        model(x).square().sum().backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    # once in forward, once recomputed in backward: checkpointing was on
    assert calls == [2]
    assert grads[0].keys() == grads[1].keys()
    for key, grad in grads[0].items():
        assert (grad is None) == (grads[1][key] is None), key
        if grad is not None:
            close(grads[1][key], grad, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize(("arch", "name"), params(fast_pairs()))
def test_reset_classifier(arch, name):
    model, x = build(arch, name), images(arch)
    features = model.forward_features(x)
    model.reset_classifier(3)
    assert model(x).shape == (BATCH, 3) and model.num_classes == 3
    close(model(x), model.head(features[:, 0]))
    # no classifier: the pooled features, the class token (timm's default pooling) or the mean of the patches
    model.reset_classifier(0)
    assert isinstance(model.head, nn.Identity) and model.num_features == DIM
    close(model(x), features[:, 0])
    model.reset_classifier(0, global_pool="avg")
    close(model(x), features[:, model.num_prefix_tokens :].mean(1))


@pytest.mark.parametrize(("arch", "name"), params(fast_pairs()))
def test_pretrained_cfg_fields_timm_reads(arch, name):
    model, x = build(arch, name), images(arch)
    cfg, state = model.pretrained_cfg, model.state_dict()
    assert cfg["architecture"] == arch
    assert f"{cfg['classifier']}.weight" in state and state[f"{cfg['classifier']}.weight"].shape == (CLASSES, DIM)
    assert f"{cfg['first_conv']}.weight" in state and state[f"{cfg['first_conv']}.weight"].shape[1] == 3
    # the model's own input, not the architecture's 224 or 384 px
    assert cfg["input_size"] == (3, *x.shape[-2:])
    assert timm.data.resolve_data_config(model=model)["input_size"] == (3, *x.shape[-2:])
    assert len(cfg["mean"]) == len(cfg["std"]) == 3
    # timm's test_model_default_cfgs_non_std: pooled features of num_features once the classifier is gone
    model.reset_classifier(0)
    assert model(x).shape == (BATCH, model.num_features)


def test_reversible_features_only_is_a_clear_error():
    with pytest.raises(ValueError, match="reversible"):
        timm.create_model(ARCHITECTURES[0], features_only=True, reversible=True, **tiny(ARCHITECTURES[0], "softmax"))


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "name"), params(other_pairs()))
def test_each_attention_at_the_other_patch_size(arch, name):
    # the checks above (fx tracing is the same graph whatever the patch size)
    for check in (
        test_features_only_returns_the_blocks_as_feature_info_describes,
        test_forward_intermediates_in_every_format,
        test_stop_early_and_pruning_skip_the_later_blocks,
        test_gradient_checkpointing_recomputes_to_the_same_gradients,
        test_reset_classifier,
        test_pretrained_cfg_fields_timm_reads,
    ):
        check(arch, name)


def one_arch_per_attention() -> list:
    return [pytest.param(arch, name, id=name) for arch, name in fast_pairs()[: len(ATTENTIONS)]]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "name"), one_arch_per_attention())
def test_torch_export_equals_eager(arch, name):
    # one block: tracing time grows with the graph, and every block is the same code
    model, x = build(arch, name, depth=1), images(arch)
    exported = torch.export.export(model, (x,))
    close(exported.module()(x), model(x))
    # another input through the same program: nothing of the first was baked in
    other = torch.randn_like(x)
    close(exported.module()(other), model(other))


@pytest.mark.slow
def test_torch_compile_forward_and_backward_equal_eager():
    # the model around the attention: each attention's own compilation through AOTAutograd (aot_eager, fullgraph,
    # every gradient against eager) is tests/models/test_graph_breaks.py's, at a fraction of a whole model's tracing
    arch, name = ARCHITECTURES[0], "softmax"
    model, x = build(arch, name, depth=1), images(arch)
    compiled_model = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, backend="aot_eager")
    results = []
    for forward, params in ((model, model), (compiled, compiled_model)):
        inputs = x.clone().requires_grad_()
        out = forward(inputs)
        out.square().sum().backward()
        results.append((out.detach(), inputs.grad, {k: p.grad for k, p in params.named_parameters()}))
    (want, want_input, want_grads), (got, got_input, got_grads) = results
    close(got, want)
    close(got_input, want_input)
    for key, grad in want_grads.items():
        close(got_grads[key], grad, msg=lambda m, k=key: f"{k}: {m}")
