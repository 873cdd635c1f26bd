"""NaFlex ViTs as folders: `save_pretrained` -> `load_model`, timm's own routes (a file overlay, `local-dir:`) and
`push_to_hub`, for classifiers and segmentation models built by hand and for trained NaFlex runs: the same outputs,
bit for bit, on packed batches of images of their own sizes, and a run's predictions from its saved folder (tiny
models generated in tmp_path; hand-built models predicting from a folder: test_naflex_predict.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import yaml
from helpers import moved_off_init, reset_accelerate
from PIL import Image
from safetensors.torch import load_model as load_safetensors
from timm.data import resolve_data_config
from timm.data.naflex_transforms import patchify_image

import zoo
from zoo.config import load_recipe
from zoo.kinds import build_model, sizes_of
from zoo.predict import predict
from zoo.splits import build_split
from zoo.train.loop import Trainer

pytestmark = pytest.mark.usefixtures("no_network")

ARCH = "zoo_naflexvit_tiny_patch16_gap"
PATCH = 8
TINY = {"patch_size": PATCH, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 4, "in_chans": 1}
VARIANTS = {
    "window2d-global-block": {"attention": "window2d", "attention_options": {"window": 2}, "global_blocks": [1]},
    "performer": {"attention": "performer", "attention_options": {"nb_features": 16}},
    "neighborhood-segmentation": {"attention": "neighborhood", "attention_options": {"kernel": 3},
                                  "decoder": "pyramid", "decoder_options": {"channels": 8}},
}  # fmt: skip
# (height, width) in px of two packed batches: three shapes padded to the longest, then two others
SIZES = (((24, 40), (48, 16), (16, 16)), ((32, 8), (8, 56)))


def pack(images: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm's per-image patchify, padded to the longest image (what the NaFlex collator does)."""
    items = [patchify_image(image, (PATCH, PATCH)) for image in images]
    keys = ("patches", "patch_coord", "patch_valid")
    return {key: torch.nn.utils.rnn.pad_sequence([item[i] for item in items], batch_first=True) for i, key in
            enumerate(keys)}  # fmt: skip


def batches(channels: int = 1) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [pack([torch.randn(channels, h, w, generator=generator) for h, w in sizes]) for sizes in SIZES]


def outputs(model: torch.nn.Module) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model.eval()(batch) for batch in batches(model.in_chans)]


def assert_same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def tiny(variant: str) -> torch.nn.Module:
    """A tiny NaFlex model whose weights and running statistics are moved off their initialisation, so that only
    weights read from the file reproduce its outputs."""
    torch.manual_seed(0)
    return moved_off_init(timm.create_model(ARCH, **TINY, **VARIANTS[variant]))


@pytest.fixture(params=list(VARIANTS))
def saved(request, tmp_path) -> tuple[torch.nn.Module, Path]:
    model = tiny(request.param)
    return model, zoo.save_pretrained(model, tmp_path / "saved", class_names=["a", "b", "c", "d"])


def test_save_then_load_gives_the_same_outputs(saved):
    model, folder = saved
    loaded = zoo.load_model(folder)
    assert type(loaded) is type(model) and not loaded.training
    assert_same(outputs(loaded), outputs(model))
    assert [b.attn.attention_name for b in loaded.blocks] == [b.attn.attention_name for b in model.blocks]
    assert loaded.pretrained_cfg["label_names"] == ("a", "b", "c", "d")


def test_the_config_records_no_input_size(saved):
    """A NaFlex model reads every image at its own size: model_args name no image size, and timm's data config
    says the size is not fixed, with the model's own channels."""
    model, folder = saved
    config = json.loads((folder / "config.json").read_text())
    args = config["model_args"]
    assert config["architecture"] == ARCH and not {"img_size", "dynamic_img_size"} & set(args)
    assert args["attention"] == model.zoo_args["attention"] and args["num_classes"] == 4 and args["in_chans"] == 1
    assert args.get("decoder") == model.zoo_args.get("decoder")
    data = resolve_data_config(model=zoo.load_model(folder))
    assert data["input_size"][0] == 1 and len(data["mean"]) == 1
    assert config["pretrained_cfg"]["fixed_input_size"] is False


def test_timm_reads_the_saved_file_back(saved):
    """timm.create_model with the saved weights as a file overlay, and timm's own local-dir route."""
    model, folder = saved
    args = json.loads((folder / "config.json").read_text())["model_args"]
    overlay = timm.create_model(
        ARCH, pretrained=True, pretrained_cfg_overlay={"file": str(folder / "model.safetensors")}, **args
    )
    assert_same(outputs(overlay), outputs(model))
    assert_same(outputs(timm.create_model(f"local-dir:{folder}", pretrained=True)), outputs(model))


def test_overrides_rebuild_with_a_new_head(saved):
    model, folder = saved
    wider = zoo.load_model(folder, num_classes=7)
    torch.testing.assert_close(wider.embeds.proj.weight, model.embeds.proj.weight, rtol=0, atol=0)
    assert outputs(wider)[0].shape[1] == 7 and wider.pretrained_cfg.get("label_names") is None


def test_push_to_hub_hands_timm_what_save_pretrained_writes(saved, monkeypatch):
    import zoo.hub.load as pretrained

    model, folder = saved
    calls = []
    monkeypatch.setattr(pretrained, "is_offline_mode", lambda: False)
    monkeypatch.setattr(pretrained, "push_to_hf_hub", lambda m, repo, **kwargs: calls.append(kwargs) or "c1")
    assert zoo.push_to_hub(model, "someone/naflex", class_names=["a", "b", "c", "d"]) == "c1"
    written = json.loads((folder / "config.json").read_text())
    ((handed,),) = [calls]
    assert handed["model_args"] == written["model_args"]
    assert json.loads(json.dumps(handed["model_config"]["pretrained_cfg"])).items() <= written["pretrained_cfg"].items()


# --- trained runs ---------------------------------------------------------------------------------------------------

NATIVE = {"patch_size": PATCH, "max_tokens": 16, "sides": [16, 24], "max_stretch": 1.5, "digit_size": 8,
          "num_target": 1, "num_other": 0, "num_clutter": 0}  # fmt: skip


def run_recipe(task: str) -> dict:
    """A NaFlex run of two steps on generated native-size MegaMNIST canvases (classification or segmentation)."""
    segmentation = task == "segmentation"
    model = {"kind": "naflex", "naflex": {"name": "naflexvit_tiny_patch16_gap", "patch_size": PATCH}, "embed_dim": 16,
             "depth": 1, "num_heads": 2, "attention": {"name": "window2d", "options": {"window": 2}}}  # fmt: skip
    if segmentation:
        model.update(decoder="pyramid", decoder_channels=8)
    return {
        "name": f"naflex_{task}", "seed": 0, "task": task, "model": model,
        "data": {"name": "native_megamnist_seg" if segmentation else "native_megamnist", "options": NATIVE,
                 "train_samples": 16, "val_samples": 8, "test_samples": 8, "batch_size": 8, "num_workers": 0},
        "train": {"epochs": 1, "mixed_precision": "no"}, "metrics": ["miou"] if segmentation else ["top1"],
    }  # fmt: skip


@pytest.fixture(scope="module", params=["classification", "segmentation"])
def naflex_run(request, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(run_recipe(request.param)))
    reset_accelerate()
    Trainer(load_recipe(folder / "recipe.yaml"), folder / "run").fit()
    reset_accelerate()
    return folder / "run"


def test_a_naflex_run_goes_through_save_pretrained(naflex_run, tmp_path):
    """The run's model (built from its recipe and training split, its best weights loaded), `load_model(run)`,
    and the folder saved from that: the same outputs; the run's normalisation and class names are saved."""
    recipe = load_recipe(naflex_run / "recipe.yaml")
    reference = build_model(recipe, sizes_of(recipe, build_split(recipe, "train")))
    load_safetensors(reference, str(naflex_run / "checkpoints" / "best" / "model.safetensors"))
    run_model = zoo.load_model(naflex_run)
    assert_same(outputs(run_model), outputs(reference))
    folder = zoo.save_pretrained(run_model, tmp_path / "saved")
    assert_same(outputs(zoo.load_model(folder)), outputs(reference))
    config = json.loads((folder / "config.json").read_text())
    native = json.loads((naflex_run / "model.json").read_text())["naflex"]
    assert config["pretrained_cfg"]["mean"] == native["mean"] and config["pretrained_cfg"]["std"] == native["std"]
    assert config["label_names"] == json.loads((naflex_run / "model.json").read_text())["label_names"]


def test_a_folder_saved_from_a_run_predicts_as_the_run_does(naflex_run, tmp_path):
    """The run's reading settings (model.json's `naflex`: budget, resize, normalisation) go into config.json, so
    zoo.predict gives the folder's model the run's rows, and a segmentation the run's masks, each at its file's size."""
    run_model = zoo.load_model(naflex_run)
    loaded = zoo.load_model(zoo.save_pretrained(run_model, tmp_path / "saved"))
    assert loaded.zoo_run["naflex"] == json.loads((naflex_run / "model.json").read_text())["naflex"]
    generator = np.random.default_rng(3)
    images = []
    for name, size in (("wide.png", (24, 40)), ("tall.png", (72, 20))):  # (height, width): within and over budget
        Image.fromarray(generator.integers(0, 256, size, dtype=np.uint8)).save(tmp_path / name)
        images.append(tmp_path / name)
    got, want = (predict(m, images, mask_dir=tmp_path / f"masks_{i}") for i, m in enumerate((loaded, run_model)))
    for row, expected in zip(got.rows, want.rows, strict=True):
        if "mask" in row:
            mask, expected_mask = (np.asarray(Image.open(r.pop("mask"))) for r in (row, expected))
            assert np.array_equal(mask, expected_mask)
            assert mask.shape == np.asarray(Image.open(row["input"])).shape
        assert row == expected
