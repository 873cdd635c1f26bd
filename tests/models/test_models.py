"""timm ViTs with zoo attention: construction, 1024-px forward/backward, pretrained weights across variants."""

import pytest
import timm
import torch
from safetensors.torch import save_file

import zoo
from zoo.hub.load import WeightsError
from zoo.models import VIT_ARCHITECTURES, ReversibleVisionTransformer, ZooVisionTransformer
from zoo.models.vit import LoadReport

TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10, "in_chans": 1}


@pytest.mark.parametrize("attention", ["softmax", "performer"])
def test_1024_px_forward_and_backward(attention):
    model = zoo.create_model("vit_tiny_patch16_224", attention=attention, img_size=1024, **TINY)
    assert model.patch_embed.num_patches == 4096
    logits = model(torch.randn(1, 1, 1024, 1024))
    assert logits.shape == (1, 10)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_every_block_uses_the_chosen_attention_with_its_options():
    model = zoo.create_model(
        "vit_tiny_patch16_224", attention="performer", attention_options={"nb_features": 16}, img_size=64, **TINY
    )
    for block in model.blocks:
        assert block.attn.attention_name == "performer"
        assert block.attn.bound_options == {"nb_features": 16}


def test_registered_timm_names_pick_the_attention():
    model = timm.create_model("zoo_vit_tiny_patch16_224", attention="performer", img_size=64, **TINY)
    assert model.blocks[0].attn.attention_name == "performer"
    assert "zoo_vit_small_patch16_224" in timm.list_models("zoo_*")


def test_timm_model_api_is_kept():
    model = zoo.create_model("vit_tiny_patch16_224", attention="performer", img_size=64, dynamic_img_size=True, **TINY)
    features = model.forward_features(torch.randn(2, 1, 96, 80))
    assert features.shape == (2, 1 + 6 * 5, 32)
    assert model.forward_head(features).shape == (2, 10)
    model.reset_classifier(3)
    model.set_grad_checkpointing(True)
    model.train()
    model(torch.randn(2, 1, 64, 64)).sum().backward()
    assert model(torch.randn(2, 1, 64, 64)).shape == (2, 3)


def test_timm_weights_load_into_any_variant_with_pos_embed_resampled(tmp_path):
    stock = timm.create_model("vit_tiny_patch16_224", embed_dim=32, depth=2, num_heads=2, num_classes=5)
    path = tmp_path / "stock.safetensors"
    save_file(stock.state_dict(), str(path))
    model = zoo.create_model("vit_tiny_patch16_224", attention="performer", img_size=128, pretrained_file=path, **TINY)
    assert model.pos_embed.shape == (1, 1 + 64, 32)
    torch.testing.assert_close(model.blocks[1].attn.qkv.weight, stock.blocks[1].attn.qkv.weight)
    # three input channels summed into one, as timm adapts a first convolution
    torch.testing.assert_close(model.patch_embed.proj.weight, stock.patch_embed.proj.weight.sum(1, keepdim=True))


def test_load_report_names_what_was_left_out(tmp_path):
    source = zoo.create_model("vit_tiny_patch16_224", img_size=64, **{**TINY, "num_classes": 3})
    path = tmp_path / "w.pth"
    torch.save({"state_dict": source.state_dict()}, path)
    target = zoo.create_model("vit_tiny_patch16_224", attention="performer", img_size=64, **TINY)
    report = zoo.load_timm_weights(target, path)
    assert isinstance(report, LoadReport)
    assert set(report.dropped_keys) == {"head.weight", "head.bias"}
    assert report.missing_attention_keys and all(".attn." in key for key in report.missing_attention_keys)


@pytest.mark.parametrize("base", VIT_ARCHITECTURES)
def test_each_entry_point_is_its_timm_architecture_with_its_weights(base):
    ours, theirs = (timm.create_model(name, device="meta") for name in (f"zoo_{base}", base))
    assert isinstance(ours, ZooVisionTransformer)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    for key in ("hf_hub_id", "input_size", "mean", "std", "crop_pct", "interpolation", "num_classes", "classifier"):
        assert ours.pretrained_cfg[key] == theirs.pretrained_cfg[key], key


def test_timm_file_route_loads_into_a_variant_with_its_own_parameters(tmp_path, caplog):
    stock = timm.create_model("vit_tiny_patch16_224", embed_dim=32, depth=2, num_heads=2)
    path = tmp_path / "stock.safetensors"
    save_file(stock.state_dict(), str(path))
    model = timm.create_model(
        "zoo_vit_tiny_patch16_224", attention="linformer", attention_options={"k": 8, "max_seq_len": 65},
        pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **{**TINY, "img_size": 128},
    )  # fmt: skip
    assert model.pos_embed.shape == (1, 65, 32) and model.head.out_features == 10
    torch.testing.assert_close(model.blocks[1].attn.qkv.weight, stock.blocks[1].attn.qkv.weight)
    assert "attention parameters not in the checkpoint keep their initialisation" in caplog.text


@pytest.mark.parametrize("route", ["zoo", "timm"])
def test_timm_data_config_reports_the_models_own_input(route, tmp_path):
    """timm's `resolve_data_config(model=...)` gives the size and channels the model was built for, as it does for
    a loaded run: with timm's 224-px default every image would be shrunk to 224 px for a 1024-px model."""
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    if route == "zoo":
        model = zoo.create_model("vit_tiny_patch16_224", attention="performer", img_size=1024, **TINY)
    else:
        model = timm.create_model("zoo_vit_tiny_patch16_224", attention="performer", img_size=1024, **TINY)
    config = resolve_data_config(model=model)
    assert config["input_size"] == (1, 1024, 1024) and len(config["mean"]) == len(config["std"]) == 1
    assert create_transform(**config)(Image.new("L", (1500, 1200), 90)).shape == (1, 1024, 1024)
    loaded = zoo.load_model(zoo.save_pretrained(model, tmp_path / "saved"))
    assert tuple(resolve_data_config(model=loaded)["input_size"]) == config["input_size"]
    model.set_input_size((512, 256))
    assert resolve_data_config(model=model)["input_size"] == (1, 512, 256)


@pytest.mark.parametrize("in_chans", [2, 4])
def test_a_model_of_any_channel_count_builds_and_saves(in_chans, tmp_path):
    """ImageNet's three means say nothing of a 2-channel (microscopy) or 4-channel (satellite) input: each channel
    gets their mean, and the model builds, runs and loads back as a 1- or 3-channel one does."""
    from timm.data import resolve_data_config

    model = zoo.create_model("vit_tiny_patch16_224", attention="linear", img_size=32, **{**TINY, "in_chans": in_chans})
    config = resolve_data_config(model=model)
    assert config["input_size"] == (in_chans, 32, 32) and len(config["mean"]) == len(config["std"]) == in_chans
    assert model(torch.randn(1, in_chans, 32, 32)).shape == (1, 10)
    loaded = zoo.load_model(zoo.save_pretrained(model, tmp_path / "saved"))
    assert tuple(resolve_data_config(model=loaded)["mean"]) == tuple(config["mean"])


def test_reversible_model_is_built_as_its_class_not_patched():
    model = zoo.create_model("vit_tiny_patch16_224", reversible=True, img_size=32, **TINY)
    assert type(model) is ReversibleVisionTransformer and model.pretrained_cfg["architecture"].startswith("zoo_")


def test_only_zoo_architectures_are_built():
    with pytest.raises(ValueError, match="unknown model 'deit_small_patch16_224'.*known: vit_base_patch16_224"):
        zoo.create_model("deit_small_patch16_224")


def test_weights_of_another_architecture_are_refused(tmp_path):
    other = timm.create_model("vit_tiny_patch16_224", embed_dim=32, depth=3, num_heads=2)
    path = tmp_path / "other.safetensors"
    save_file(other.state_dict(), str(path))
    with pytest.raises(WeightsError, match=r"other.safetensors: .*depth \(blocks\) 3 in the file, 2 in the model$"):
        zoo.create_model("vit_tiny_patch16_224", img_size=64, pretrained_file=path, **TINY)


def test_missing_pretrained_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        zoo.create_model("vit_tiny_patch16_224", pretrained_file=tmp_path / "nope.safetensors", **TINY)


def test_unknown_architecture_suggests_close_names():
    with pytest.raises(ValueError, match="did you mean 'vit_small_patch16_224'"):
        zoo.create_model("vit_smal_patch16_224")
