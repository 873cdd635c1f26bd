"""save_pretrained / load_model round trips, timm reading the files back, and one-line errors for weights that do not
fit or are not weights at all (generated in tmp_path: tiny models, depth 2, width 64, 32 px)."""

import json
import os
import pickle
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.data import create_transform, resolve_data_config
from torch import nn

import zoo
from zoo.hub.load import WeightsError, check_state_dict, load_model, read_weights, save_pretrained

TINY = {"embed_dim": 64, "depth": 2, "num_heads": 2, "img_size": 32, "num_classes": 3, "in_chans": 1}
PERFORMER = {"attention": "performer", "attention_options": {"nb_features": 16}}
ARCH = "vit_tiny_patch16_224"


def tiny(**changes):
    torch.manual_seed(0)
    return zoo.create_model(ARCH, **{**PERFORMER, **TINY, **changes})


@pytest.fixture
def saved(tmp_path):
    folder = save_pretrained(tiny(), tmp_path / "tiny", class_names=["cat", "dog", "eel"])
    return folder


def outputs(model, size=32, channels=1):
    torch.manual_seed(1)
    with torch.no_grad():
        return model.eval()(torch.randn(2, channels, size, size))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"attention": "linear", "attention_options": {}, "global_blocks": [1], "global_attention": "softmax"},
        {"reversible": True, "dynamic_img_size": True},
    ],
    ids=["performer", "global-blocks", "reversible-dynamic"],
)
def test_save_then_load_gives_the_same_model(tmp_path, options):
    model = tiny(**options)
    loaded = load_model(save_pretrained(model, tmp_path / "m"))
    assert type(loaded) is type(model) and not loaded.training
    torch.testing.assert_close(outputs(loaded), outputs(model), rtol=0, atol=0)
    assert [b.attn.attention_name for b in loaded.blocks] == [b.attn.attention_name for b in model.blocks]


def test_config_records_what_rebuilds_the_model(saved):
    config = json.loads((saved / "config.json").read_text())
    assert config["architecture"] == "zoo_vit_tiny_patch16_224" and config["label_names"] == ["cat", "dog", "eel"]
    args = config["model_args"]
    assert args["attention"] == "performer" and args["attention_options"] == {"nb_features": 16}
    assert (args["img_size"], args["patch_size"], args["embed_dim"], args["depth"]) == ([32, 32], [16, 16], 64, 2)
    assert (args["num_heads"], args["num_classes"], args["in_chans"], args["global_blocks"]) == (2, 3, 1, [])
    cfg = config["pretrained_cfg"]
    assert cfg["input_size"] == [1, 32, 32] and cfg["num_classes"] == 3 and len(cfg["mean"]) == 1
    assert "hf_hub_id" not in cfg and "file" not in cfg


def test_loaded_model_carries_its_own_preprocessing_and_class_names(tmp_path):
    stats = {"mean": [0.1307], "std": [0.3081], "interpolation": "bilinear", "crop_pct": 1.0}
    model = load_model(save_pretrained(tiny(), tmp_path / "m", class_names=["a", "b", "c"], data_config=stats))
    data = resolve_data_config(model=model)
    assert data["input_size"] == (1, 32, 32) and data["mean"] == (0.1307,) and data["std"] == (0.3081,)
    assert data["interpolation"] == "bilinear" and model.pretrained_cfg["label_names"] == ("a", "b", "c")
    from PIL import Image

    image = create_transform(**data)(Image.new("L", (100, 70), 128))
    assert image.shape == (1, 32, 32) and model(image[None]).shape == (1, 3)


def test_state_changed_after_construction_is_saved(tmp_path):
    model = tiny()
    model.reset_classifier(5)
    loaded = load_model(save_pretrained(model, tmp_path / "m"))
    assert loaded.num_classes == 5
    torch.testing.assert_close(outputs(loaded), outputs(model), rtol=0, atol=0)


def test_attention_swapped_by_hand_without_the_record_is_refused(tmp_path):
    model, other = tiny(), tiny(attention="linear", attention_options={})
    model.blocks[1].attn = other.blocks[1].attn
    with pytest.raises(ValueError, match="block 1 uses attention 'linear' but the model's record"):
        save_pretrained(model, tmp_path / "m")


def test_timm_reads_the_saved_file_back(saved):
    args = json.loads((saved / "config.json").read_text())["model_args"]
    model = timm.create_model(
        "zoo_vit_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay={"file": str(saved / "model.safetensors")},
        **args,
    )  # fmt: skip
    torch.testing.assert_close(outputs(model), outputs(load_model(saved)), rtol=0, atol=0)


def test_timm_loads_the_folder_by_its_own_local_dir_route(saved):
    model = timm.create_model(f"local-dir:{saved}", pretrained=True)
    assert model.pretrained_cfg["input_size"] == (1, 32, 32)
    torch.testing.assert_close(outputs(model), outputs(load_model(saved)), rtol=0, atol=0)


def test_load_model_accepts_the_folder_or_its_files(saved):
    reference = outputs(load_model(saved))
    for source in (saved / "model.safetensors", saved / "config.json", str(saved)):
        torch.testing.assert_close(outputs(load_model(source)), reference, rtol=0, atol=0)


def test_load_model_overrides_adapt_the_weights(saved, caplog):
    larger = load_model(saved, img_size=64)
    assert larger.pos_embed.shape == (1, 1 + 16, 64) and outputs(larger, size=64).shape == (2, 3)
    swapped = load_model(saved, attention="linear", attention_options={})
    torch.testing.assert_close(swapped.blocks[0].attn.qkv.weight, load_model(saved).blocks[0].attn.qkv.weight)
    assert "attention parameters of another variant or shape left out" in caplog.text
    assert load_model(saved, num_classes=7).head.out_features == 7


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"embed_dim": 128}, r"width \(embed_dim\) 64 in the file, 128 in the model"),
        ({"depth": 4}, r"depth \(blocks\) 2 in the file, 4 in the model"),
        ({"patch_size": 8}, r"patch size 16x16 in the file, 8x8 in the model"),
        ({"mlp_ratio": 2.0}, r"MLP width 256 in the file, 128 in the model"),
        ({"num_classes": 5}, r"number of classes \(head\) 3 in the file, 5 in the model"),
        ({"num_classes": 0}, r"number of classes \(head\) 3 in the file, 0 in the model"),
        ({"in_chans": 3}, r"input channels \(in_chans\) 1 in the file, 3 in the model"),
        ({"img_size": 64}, r"pos_embed tokens \(image size or prefix tokens\) 5 in the file, 17 in the model"),
        ({"attention": "linear", "attention_options": {}}, r"attention parameters random_features, seed, step in the"),
        ({"attention_options": {"nb_features": 8}}, r"shapes differ: blocks.\*.attn.random_features \(16, 32\) in the"),
        ({"reg_tokens": 2}, r"pos_embed tokens \(image size or prefix tokens\) 5 in the file, 7 in the model"),
    ],
)
def test_a_checkpoint_that_does_not_fit_names_the_file_and_the_difference(saved, changes, message):
    path = saved / "model.safetensors"
    with pytest.raises(WeightsError, match=rf"^{path}: weights do not fit zoo_vit_tiny_patch16_224 .*{message}") as e:
        check_state_dict(tiny(**changes), read_weights(path), path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"embed_dim": 128}, r"width \(embed_dim\) 64 in the file, 128"),
        ({"depth": 4}, r"depth \(blocks\) 2 in the file, 4"),
        ({"in_chans": 3}, r"input channels \(in_chans\) 1 in the file, 3 in the model: only 3 channels adapt"),
    ],
)
def test_pretrained_weights_that_cannot_be_adapted_are_one_line_errors(saved, changes, message):
    path = saved / "model.safetensors"
    with pytest.raises(WeightsError, match=rf"^{path}: .*{message}"):
        zoo.create_model(ARCH, pretrained_file=path, **{**PERFORMER, **TINY, **changes})
    with pytest.raises(WeightsError, match=message):
        timm.create_model(
            f"zoo_{ARCH}", pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **{**TINY, **changes}
        )


def test_pretrained_weights_of_another_patch_size_are_resampled_with_a_warning(saved, caplog):
    model = zoo.create_model(
        ARCH, pretrained_file=saved / "model.safetensors", **{**PERFORMER, **TINY, "patch_size": 8}
    )
    assert model.patch_embed.proj.weight.shape == (64, 1, 8, 8) and model.pos_embed.shape == (1, 17, 64)
    assert "patch embedding resampled from patch size (16, 16) to (8, 8)" in caplog.text


def test_weights_of_another_architecture_name_the_foreign_keys(tmp_path):
    for name, family in (("resnet18", "a ResNet"), ("convnext_atto", "a ConvNeXt")):
        path = tmp_path / f"{name}.safetensors"
        save_file(timm.create_model(name, num_classes=3).state_dict(), str(path))
        with pytest.raises(WeightsError, match=rf"{name}.safetensors: .*another architecture \(it looks like {family}"):
            zoo.create_model(ARCH, pretrained_file=path, **TINY)
    with pytest.raises(WeightsError, match=r"another architecture.*layer1.*expects cls_token, pos_embed"):
        check_state_dict(tiny(), read_weights(tmp_path / "resnet18.safetensors"), "resnet18")


def test_missing_and_unexpected_keys_are_listed_by_name():
    state = {k: v for k, v in tiny().state_dict().items() if k != "norm.bias"}
    with pytest.raises(WeightsError, match=r"trimmed.pth: .*: missing from the file: norm.bias$"):
        check_state_dict(tiny(), state, "trimmed.pth")
    extra = {
        **tiny().state_dict(),
        "blocks.0.adapter.weight": torch.zeros(1),
        "blocks.1.adapter.weight": torch.zeros(1),
    }
    with pytest.raises(WeightsError, match=r"in the file but not the model: blocks.\*.adapter.weight$"):
        check_state_dict(tiny(), extra, "extra.pth")


def test_a_prefix_on_every_key_is_named(tmp_path):
    state = {f"backbone.{k}": v for k, v in tiny().state_dict().items()}
    with pytest.raises(WeightsError, match=r"every key carries the prefix 'backbone.'.*strip it"):
        check_state_dict(tiny(), state, "prefixed.pth")


def test_wrapped_checkpoints_are_unwrapped(tmp_path):
    model = tiny()
    torch.save(
        {"epoch": 3, "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, tmp_path / "w.pth"
    )
    state = read_weights(tmp_path / "w.pth")
    check_state_dict(model, state, "w.pth")
    assert state.keys() == model.state_dict().keys()


def test_tied_weights_saved_once_fit():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.out = nn.Linear(4, 4), nn.Linear(4, 4)
            self.out.weight = self.embed.weight

    model = Tied()
    state = {k: v for k, v in model.state_dict().items() if k != "out.weight"}
    check_state_dict(model, state, "tied.safetensors")
    with pytest.raises(WeightsError, match=r"missing from the file: embed.bias"):
        check_state_dict(model, {k: v for k, v in state.items() if k != "embed.bias"}, "tied.safetensors")


def _truncated_safetensors(tmp_path) -> bytes:
    save_file({"w": torch.zeros(1000)}, str(tmp_path / "whole.safetensors"))
    return (tmp_path / "whole.safetensors").read_bytes()[:2000]


def _truncated_torch(tmp_path) -> bytes:
    torch.save({"w": torch.zeros(1000)}, tmp_path / "whole.pth")
    return (tmp_path / "whole.pth").read_bytes()[:1500]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.safetensors", b"", "it is empty"),
        ("notes.safetensors", b"these are not weights\n", "it is a text file"),
        ("page.pth", b"\n<!DOCTYPE html><html><body>Sign in</body></html>", "it is an HTML page"),
        (
            "lfs.safetensors",
            b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n",
            r"git-lfs pointer.*run `git lfs pull`",
        ),
        ("noise.bin", bytes(range(7, 250)), "neither safetensors nor a torch checkpoint"),
        ("cut.safetensors", _truncated_safetensors, "truncated safetensors file: 2000 bytes, its header describes"),
        ("cut.pth", _truncated_torch, "truncated or corrupt torch checkpoint"),
        ("list.pth", lambda tmp: _saved_bytes(tmp, [torch.zeros(2)]), "holds no state dict"),
        ("jax.npz", b"PK\x03\x04", r"\.npz \(JAX\) checkpoints are not supported"),
    ],
)
def test_a_file_that_is_not_weights_says_what_it_is(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content(tmp_path) if callable(content) else content)
    with pytest.raises(WeightsError, match=rf"^{path}: .*{message}") as caught:
        zoo.create_model(ARCH, pretrained_file=path, **TINY)
    assert "\n" not in str(caught.value)


def _saved_bytes(tmp_path, obj) -> bytes:
    torch.save(obj, tmp_path / "obj.pth")
    return (tmp_path / "obj.pth").read_bytes()


class Payload:
    """Unpickling this runs a shell command: the test checks that it never runs."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_pickle_that_runs_code_is_refused_unread(tmp_path, writer):
    path, marker = tmp_path / "evil.pth", tmp_path / "pwned"
    payload = {"blocks.0.attn.qkv.weight": torch.zeros(2), "x": Payload(marker)}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(WeightsError, match=rf"^{path}: refused: unpickling it needs torch.load\(weights_only=False\)"):
        read_weights(path)
    with pytest.raises(WeightsError, match="refused"):
        zoo.create_model(ARCH, pretrained_file=path, **TINY)
    assert not marker.exists()


def test_load_model_says_what_it_reads(tmp_path, saved):
    run = tmp_path / "run"
    (run / "checkpoints" / "best").mkdir(parents=True)
    (run / "recipe.yaml").write_text("name: x\n")
    # a run directory whose checkpoint holds no weights: the one-line error names the missing file
    with pytest.raises(FileNotFoundError, match=r"checkpoints/best/model.safetensors do not exist") as error:
        load_model(run)
    assert "\n" not in str(error.value)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(tmp_path / "nowhere")
    config = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**config, "architecture": "zoo_vit_tiny_patch16_22"}))
    with pytest.raises(ValueError, match=r"unknown architecture.*'zoo_vit_tiny_patch16_22'.*did you mean"):
        load_model(saved)
    (saved / "config.json").write_text("{")
    with pytest.raises(ValueError, match=r"config.json: not valid JSON \(line 1"):
        load_model(saved)
    (saved / "config.json").write_text(json.dumps({"architecture": "zoo_vit_tiny_patch16_224"}))
    with pytest.raises(ValueError, match=r"config.json: not a save_pretrained config: missing model_args, pretrained"):
        load_model(saved)


def test_save_pretrained_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="2 class_names for a head of 3 classes"):
        save_pretrained(tiny(), tmp_path / "m", class_names=["a", "b"])
    with pytest.raises(ValueError, match="unknown data_config key 'means'.*did you mean 'mean'"):
        save_pretrained(tiny(), tmp_path / "m", data_config={"means": [0.5]})
    with pytest.raises(ValueError, match="mean has 2 values for a model of 1 input channels"):
        save_pretrained(tiny(), tmp_path / "m", data_config={"mean": [0.5, 0.5]})
    with pytest.raises(ValueError, match="extra key 'model_args' would replace"):
        save_pretrained(tiny(), tmp_path / "m", extra={"model_args": {}})
    assert not (tmp_path / "m" / "config.json").exists()


# One fresh interpreter (the hub client reads its environment at import) where the hub's host never resolves
# (.invalid), the cache is empty, and the client is told so through its own switch, HF_HUB_OFFLINE (without it the
# client retries for a long while, printing "Retrying in ..."). Each call prints one line, "<what>: <error>", or
# "<what>: loaded"; last, with a timm checkpoint put into the cache in the hub's layout, a pretrained model loads.
OFFLINE_CHILD = """
import os, shutil, sys, torch, zoo
from pathlib import Path
calls = {
    'load_model': lambda: zoo.load_model('hf-hub:someone/tiny'),
    'push_to_hub': lambda: zoo.push_to_hub(None, 'someone/tiny'),
    'create_model': lambda: zoo.create_model('vit_tiny_patch16_224', pretrained=True),
}
for what, call in calls.items():
    try:
        call()
    except Exception as error:
        print(f'{what}: {type(error).__name__}: {error}')
    else:
        print(f'{what}: loaded')
snapshot = Path(os.environ['SNAPSHOT'])
snapshot.mkdir(parents=True)
(snapshot.parent.parent / 'refs').mkdir()
(snapshot.parent.parent / 'refs' / 'main').write_text('0' * 40)
shutil.copy(os.environ['STOCK'], snapshot / 'model.safetensors')
m = zoo.create_model('vit_tiny_patch16_224', attention='linear', pretrained=True)
torch.save(m.state_dict()['blocks.0.attn.qkv.weight'], os.environ['OUT'])
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> dict:
    """The child's lines by call (`lines`), its stderr, the stock weights and what it loaded."""
    folder = tmp_path_factory.mktemp("offline")
    cache = folder / "hub"
    stock_model = timm.create_model(ARCH)
    repo, stock = stock_model.pretrained_cfg["hf_hub_id"], stock_model.state_dict()
    save_file(stock, folder / "stock.safetensors")
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_OFFLINE"}
    env.update(
        HF_HUB_CACHE=str(cache),
        HF_ENDPOINT="https://hub.invalid",
        HF_HUB_OFFLINE="1",
        SNAPSHOT=str(cache / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)),
        STOCK=str(folder / "stock.safetensors"),
        OUT=str(folder / "loaded.pt"),
    )
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE_CHILD], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())
    return {"lines": lines, "stderr": result.stderr, "stock": stock, "loaded": folder / "loaded.pt"}


def test_the_hub_offline_fails_at_once_naming_the_file_route(offline):
    loading, pushing = offline["lines"]["load_model"], offline["lines"]["push_to_hub"]
    assert loading.startswith(("FileNotFoundError", "ConnectionError")), loading
    assert "hf-hub:someone/tiny" in loading and "offline (HF_HUB_OFFLINE=1)" in loading
    assert "zoo.load_model(DIR)" in loading
    assert pushing.startswith(("FileNotFoundError", "ConnectionError")), pushing
    assert "offline (HF_HUB_OFFLINE=1)" in pushing and "zoo.save_pretrained(model, DIR)" in pushing
    assert "Retrying" not in offline["stderr"]


def test_an_unreachable_hub_fails_at_once_with_the_file_route_and_loads_what_is_cached(offline):
    failed = offline["lines"]["create_model"]
    assert "the hub is not reachable" in failed and "pretrained_file=" in failed
    torch.testing.assert_close(torch.load(offline["loaded"]), offline["stock"]["blocks.0.attn.qkv.weight"])


def test_push_to_hub_hands_timm_what_save_pretrained_writes(tmp_path, monkeypatch):
    import zoo.hub.load as pretrained

    calls = []
    monkeypatch.setattr(pretrained, "is_offline_mode", lambda: False)
    monkeypatch.setattr(
        pretrained, "push_to_hf_hub", lambda model, repo, **kwargs: calls.append((repo, kwargs)) or "c1"
    )
    model = tiny()
    assert zoo.push_to_hub(model, "someone/tiny", class_names=["a", "b", "c"], private=True) == "c1"
    ((repo, kwargs),) = calls
    written = json.loads(
        (save_pretrained(model, tmp_path / "m", class_names=["a", "b", "c"]) / "config.json").read_text()
    )
    assert repo == "someone/tiny" and kwargs["private"] and kwargs["safe_serialization"] is True
    assert kwargs["model_args"] == written["model_args"]
    assert kwargs["model_config"]["label_names"] == written["label_names"] == ["a", "b", "c"]
    handed = json.loads(json.dumps(kwargs["model_config"]["pretrained_cfg"]))
    assert handed["input_size"] == [1, 32, 32] and handed.items() <= written["pretrained_cfg"].items()
