"""zoo attention in timm's NaFlex ViT (`zoo.models.naflex`): a packed batch of images of different sizes gives each
image the attention outputs, features and input gradients it gets alone; padding never reaches a valid token; the
fixed-length variants keep their meaning; timm's own NaFlex weights load."""

import pytest
import timm
import torch
from timm.data.naflex_transforms import patchify_image
from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg

import zoo
from zoo.attention._common import AttentionBase
from zoo.models.naflex import load_naflex_weights, ragged_grids

PATCH = 8
# (rows, cols) in patches: wide, tall, small, so the batch pads two of them and every grid differs
SIZES = ((3, 5), (6, 2), (2, 2))
ACCEPTED = zoo.list_attentions()  # every variant: none is refused


def images(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(3, rows * PATCH, cols * PATCH, generator=generator) for rows, cols in SIZES]


def pack(batch: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm's per-image patchify, padded to the longest image (what the NaFlex collator does)."""
    items = [patchify_image(image, (PATCH, PATCH)) for image in batch]
    n = max(len(patches) for patches, _, _ in items)
    out = {
        "patches": torch.zeros(len(items), n, items[0][0].shape[1]),
        "patch_coord": torch.zeros(len(items), n, 2, dtype=torch.long),
        "patch_valid": torch.zeros(len(items), n, dtype=torch.bool),
    }
    for i, item in enumerate(items):
        for key, value in zip(("patches", "patch_coord", "patch_valid"), item, strict=True):
            out[key][i, : len(value)] = value
    return out


def options(name: str) -> dict:
    opts = {
        k: v
        for k, v in zoo.attention.get_attention(name).test_options.items()
        if k not in ("grid_size", "num_prefix_tokens")
    }
    if name == "longformer":
        opts["global_indices"] = (0,)  # a register token: the same token in every grid
    if name == "window2d":
        opts["window"] = 2
    return opts


def model(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    net = timm.create_model(
        "zoo_naflexvit_tiny_patch16_gap",
        attention=name,
        attention_options=options(name),
        patch_size=PATCH,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=4,
        init_values=1.0,
        fix_init=False,
        **kwargs,
    ).eval()
    # larger query/key weights: peaked attention, so that a wrong key set changes the output visibly
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, AttentionBase):
                module.qkv.weight.mul_(4.0)
                module.proj.weight.mul_(4.0)
    return net


def run(net, batch: dict[str, torch.Tensor]):
    """The features `[b, n, c]`, every attention's output, and the gradient of a fixed projection of the valid
    features with respect to the patches."""
    outputs = []
    hooks = [
        m.register_forward_hook(lambda m, a, out: outputs.append(out))
        for m in net.modules()
        if isinstance(m, AttentionBase)
    ]
    patches = batch["patches"].clone().requires_grad_(True)
    features = net.forward_features(patches, batch["patch_coord"], batch["patch_valid"])
    features = features["patches"] if isinstance(features, dict) else features
    for hook in hooks:
        hook.remove()
    p = net.num_prefix_tokens
    keep = torch.cat([torch.ones(len(patches), p, dtype=torch.bool), batch["patch_valid"]], 1)
    weight = torch.randn(features.shape[1:], generator=torch.Generator().manual_seed(3))
    (grad,) = torch.autograd.grad((features * weight * keep[..., None]).sum(), patches)
    return features, outputs, grad


def assert_close(packed, alone, what: str) -> None:
    scale = alone.abs().max().clamp(min=1e-3)
    error = ((packed - alone).abs().max() / scale).item()
    assert error < 1e-4, f"{what}: relative error {error:.2e}"


@pytest.mark.parametrize("name", ACCEPTED)
def test_packed_batch_gives_each_image_its_own_result(name):
    net = model(name, **({"global_blocks": [1]} if name == "window2d" else {}))
    batch = images()
    features, outputs, grad = run(net, pack(batch))
    p = net.num_prefix_tokens
    for i, image in enumerate(batch):
        f, outs, g = run(net, pack([image]))
        n = f.shape[1]
        assert_close(features[i, :n], f[0], f"{name} image {i} features")
        for block, (packed, alone) in enumerate(zip(outputs, outs, strict=True)):
            assert_close(packed[i, :n], alone[0], f"{name} image {i} attention {block}")
        assert_close(grad[i, : n - p], g[0], f"{name} image {i} gradient")
        assert not grad[i, n - p :].any(), f"{name}: padded patches got a gradient"


def test_the_check_sees_a_wrong_key_set():
    """The equality above is not vacuous: a softmax that attends to padded keys too (no mask) fails it."""
    net = model("softmax")
    batch = images()
    for module in net.modules():
        if isinstance(module, AttentionBase):
            module.prepare_mask = lambda attn_mask, b, n: None
    features, _, _ = run(net, pack(batch))
    f, _, _ = run(net, pack([batch[2]]))
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(features[2, : f.shape[1]], f[0], "unmasked")


@pytest.mark.parametrize("name", ["softmax", "linear", "window2d", "neighborhood", "performer"])
@pytest.mark.parametrize("poison", [float("nan"), 1e6])
def test_poisoned_padding_never_reaches_a_valid_token(name, poison):
    net = model(name)
    batch = pack(images())
    clean, _, _ = run(net, batch)
    poisoned = dict(batch, patches=batch["patches"].masked_fill(~batch["patch_valid"][..., None], poison))
    dirty, _, _ = run(net, poisoned)
    keep = torch.cat([torch.ones(3, net.num_prefix_tokens, dtype=torch.bool), batch["patch_valid"]], 1)
    assert torch.equal(clean[keep], dirty[keep])


@pytest.mark.parametrize("name", ACCEPTED)
def test_every_attention_masks_large_padded_keys(name):
    """At the attention itself (the model zeroes padded tokens before the blocks, which would hide a leak): keys
    of 1e4 at padded positions leave every valid output as it was."""
    torch.manual_seed(0)
    opts = {**zoo.attention.get_attention(name).test_options}
    if zoo.attention.get_attention(name).needs_grid:
        opts = {**opts, "grid_size": (6, 6), "num_prefix_tokens": 1}
    attn = zoo.create_attention(name, 32, 2, **opts).eval()
    n = 37
    x = torch.nn.functional.layer_norm(torch.randn(2, n, 32, generator=torch.Generator().manual_seed(1)), (32,))
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[1, 5:12] = False  # cells of the grid: masked like NaFlex padding
    clean = attn(x, attn_mask=keep)
    dirty = attn(x.masked_fill(~keep[..., None], 1e4), attn_mask=keep)
    assert_close(dirty[keep], clean[keep], name)


def test_grids_come_from_the_coordinates_and_must_be_raster():
    batch = pack(images())
    assert ragged_grids(batch["patch_coord"], batch["patch_valid"]) == list(SIZES)
    shuffled = dict(batch, patch_coord=batch["patch_coord"].flip(1))
    with pytest.raises(ValueError, match=r"samples \[0, 1, 2\] .* raster order"):
        ragged_grids(shuffled["patch_coord"], shuffled["patch_valid"])


def test_grad_checkpointing_and_intermediates_match():
    net = model("window2d")
    batch = pack(images())
    reference, _, grad = run(net, batch)
    net.set_grad_checkpointing(True)
    net.train()
    again, _, grad_again = run(net, batch)
    assert torch.allclose(again, reference, atol=1e-6) and torch.allclose(grad_again, grad, atol=1e-6)
    net.eval()
    final, inter = net.forward_intermediates(batch, indices=[0, 1], output_fmt="NLC")
    assert torch.allclose(final, reference, atol=1e-6)
    assert len(inter) == 2 and inter[1].shape == (3, reference.shape[1] - net.num_prefix_tokens, 32)


def test_timm_naflex_weights_load(tmp_path):
    """A checkpoint saved from timm's own NaFlexVit loads into the zoo model with softmax, which then computes what
    timm's model computes."""
    cfg = NaFlexVitCfg(patch_size=PATCH, embed_dim=32, depth=2, num_heads=2, reg_tokens=4, global_pool="avg",
                       fc_norm=True, init_values=1e-5)  # fmt: skip
    torch.manual_seed(1)
    stock = NaFlexVit(cfg, num_classes=4).eval()
    torch.save(stock.state_dict(), tmp_path / "naflex.pth")
    net = model("softmax")
    load_naflex_weights(net, tmp_path / "naflex.pth")
    batch = pack(images())
    assert torch.allclose(net(batch), stock(batch), atol=1e-5)
    performer = model("performer")
    load_naflex_weights(performer, tmp_path / "naflex.pth")  # every weight of timm's attention fits
    assert torch.equal(performer.blocks[0].attn.qkv.weight, stock.blocks[0].attn.qkv.weight)


@pytest.mark.parametrize("name", ["window2d", "neighborhood"])
def test_an_image_batch_and_its_patch_dict_agree(name):
    """The grid from an image batch (`[B, C, H, W]`, timm's features_only route) and from the patch coordinates of
    the same images give the same features."""
    net = model(name)
    batch = torch.randn(2, 3, 4 * PATCH, 6 * PATCH, generator=torch.Generator().manual_seed(5))
    from_image = net.forward_features(batch)
    packed = pack(list(batch))
    from_dict = net.forward_features(packed["patches"], packed["patch_coord"], packed["patch_valid"])["patches"]
    assert torch.allclose(from_image, from_dict, atol=1e-5)
    features = timm.create_model(
        "zoo_naflexvit_tiny_patch16_gap", features_only=True, out_indices=(1,), attention=name,
        attention_options=options(name), patch_size=PATCH, embed_dim=32, depth=2, num_heads=2, init_values=1.0,
        fix_init=False,
    ).eval()  # fmt: skip
    features.model.load_state_dict({k: v for k, v in net.state_dict().items() if k in features.model.state_dict()})
    (fmap,) = features(batch)
    assert fmap.shape == (2, 32, 4, 6)
    tokens = from_image[:, net.num_prefix_tokens :].reshape(2, 4, 6, 32).permute(0, 3, 1, 2)
    assert torch.allclose(fmap, tokens, atol=1e-5)
