"""One weights route: a timm file loads through timm's `pretrained_cfg_overlay=dict(file=...)`, and every adaptation
(input channels, head, pos_embed, a variant's own parameters) happens in `checkpoint_filter_fn`, so each way in
gives the same weights."""

import pytest
import timm
import torch
from safetensors.torch import save_file

import zoo
from zoo.models.vit import checkpoint_filter_fn

TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2, "patch_size": 16}
TARGET = {"attention": "linformer", "attention_options": {"k": 8, "max_seq_len": 37}, "img_size": 96}


@pytest.fixture
def stock_file(tmp_path):
    torch.manual_seed(0)
    stock = timm.create_model("vit_tiny_patch16_224", **{**TINY, "patch_size": 16}, num_classes=5)
    path = tmp_path / "stock.safetensors"
    save_file(stock.state_dict(), str(path))
    return stock, path


@pytest.mark.parametrize("in_chans, num_classes", [(1, 5), (3, 7)])
def test_every_way_in_gives_the_same_weights(stock_file, in_chans, num_classes):
    stock, path = stock_file
    args = {**TINY, **TARGET, "in_chans": in_chans, "num_classes": num_classes}
    torch.manual_seed(1)
    by_zoo = zoo.create_model("vit_tiny_patch16_224", pretrained_file=path, **args)
    torch.manual_seed(1)
    by_timm = timm.create_model(
        "zoo_vit_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **args
    )
    torch.manual_seed(1)
    built = zoo.create_model("vit_tiny_patch16_224", **args)
    report = zoo.load_timm_weights(built, path)
    for model in (by_timm, built):
        assert model.state_dict().keys() == by_zoo.state_dict().keys()
        for key, value in by_zoo.state_dict().items():
            torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0, msg=key)
    # the file's blocks are in; its 5-class head only where the class count matches
    torch.testing.assert_close(by_zoo.blocks[1].attn.qkv.weight, stock.blocks[1].attn.qkv.weight)
    assert (num_classes == 5) == torch.equal(by_zoo.head.weight, stock.head.weight)
    assert ("head.weight" in report.dropped_keys) == (num_classes != 5)
    assert report.missing_attention_keys and all(".attn." in key for key in report.missing_attention_keys)


def test_the_filter_returns_a_state_that_fits_the_model_exactly(stock_file):
    stock, _ = stock_file
    model = zoo.create_model("vit_tiny_patch16_224", **TINY, **TARGET, in_chans=1, num_classes=3)
    state = checkpoint_filter_fn(stock.state_dict(), model)
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in model.state_dict().items()}
    # timm's rule for 3 -> 1 channel: the three summed; the head and linformer's projections from the model's init
    torch.testing.assert_close(state["patch_embed.proj.weight"], stock.patch_embed.proj.weight.sum(1, keepdim=True))
    for key in ("head.weight", "blocks.0.attn.compress_k"):
        torch.testing.assert_close(state[key], model.state_dict()[key], rtol=0, atol=0)
    assert state["pos_embed"].shape == (1, 1 + 36, 32)


def test_a_file_that_fits_nowhere_is_one_line_naming_it(tmp_path):
    wide = timm.create_model("vit_tiny_patch16_224", embed_dim=64, depth=2, num_heads=2)
    path = tmp_path / "wide.safetensors"
    save_file(wide.state_dict(), str(path))
    with pytest.raises(
        zoo.WeightsError, match=r"wide\.safetensors: weights do not fit .*width \(embed_dim\) 64"
    ) as info:
        zoo.create_model("vit_tiny_patch16_224", pretrained_file=path, **TINY)
    assert "\n" not in str(info.value)
