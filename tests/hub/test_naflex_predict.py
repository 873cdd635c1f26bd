"""A NaFlex model saved by `zoo.save_pretrained` predicts as a NaFlex run does: config.json's `naflex` entry makes
`zoo.load_model` give it the run's description, so `zoo.predict`, `image_loader` and tools/predict.py read each
image at its own size within the token budget, and a segmentation's masks come at each file's size (tiny models and
images generated in tmp_path)."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from helpers import moved_off_init, run_tool_here
from PIL import Image
from timm.data.naflex_transforms import patchify_image

import zoo
from zoo.data.images.native import NativeLoader
from zoo.predict import image_loader, predict

pytestmark = pytest.mark.usefixtures("no_network")

ARCH = "zoo_naflexvit_tiny_patch16_gap"
PATCH = 8
TINY = {"patch_size": PATCH, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 4, "in_chans": 1}
WINDOW = {"attention": "window2d", "attention_options": {"window": 2}, "global_blocks": [1]}
SEGMENT = {"attention": "neighborhood", "attention_options": {"kernel": 3}, "decoder": "pyramid",
           "decoder_options": {"channels": 8}}  # fmt: skip
CLASSES = ["a", "b", "c", "d"]
BUDGET = 24
# the reading settings the test saves with: the budget above, a normalisation other than the architecture's
READING = {"patch_size": PATCH, "max_tokens": BUDGET, "resize": "native", "mean": [0.25], "std": [0.5]}
# (height, width) in px: a wide image within the budget (3 x 5 patches, read as it is), a tall one over it
SIZES = {"wide.png": (24, 40), "tall.png": (120, 30)}


def tiny(**variant) -> torch.nn.Module:
    """A tiny NaFlex model with its weights moved off their initialisation."""
    torch.manual_seed(0)
    return moved_off_init(timm.create_model(ARCH, **TINY, **variant))


def save(model: torch.nn.Module, folder: Path) -> Path:
    data = {"mean": READING["mean"], "std": READING["std"]}
    return zoo.save_pretrained(model, folder, class_names=CLASSES, data_config=data, naflex={"max_tokens": BUDGET})


@pytest.fixture
def images(tmp_path) -> dict[str, Path]:
    folder = tmp_path / "images"
    folder.mkdir()
    generator = np.random.default_rng(0)
    for name, (height, width) in SIZES.items():
        Image.fromarray(generator.integers(0, 256, (height, width), dtype=np.uint8)).save(folder / name)
    return {name: folder / name for name in SIZES}


def alone(model: torch.nn.Module, sample: dict[str, torch.Tensor]) -> torch.Tensor:
    """The in-memory model on one image's patches, no padding: `[k]` or `[k, H, W]`."""
    with torch.no_grad():
        return model.eval()({key: sample[key][None] for key in ("patches", "patch_coord", "patch_valid")})[0]


def test_the_config_holds_what_native_loader_reads(tmp_path):
    folder = save(tiny(**WINDOW), tmp_path / "saved")
    assert json.loads((folder / "config.json").read_text())["naflex"] == READING


def test_a_saved_classifier_predicts_each_image_at_its_own_size(tmp_path, images):
    model = tiny(**WINDOW)
    loaded = zoo.load_model(save(model, tmp_path / "saved"))
    # the wide image within the budget is read as it is: its 3 x 5 patches, normalised by the saved mean and std
    pixels = torch.from_numpy(np.asarray(Image.open(images["wide.png"]), dtype=np.float32) / 255)[None]
    patches, coord, _ = patchify_image((pixels - 0.25) / 0.5, (PATCH, PATCH))
    read = image_loader(loaded)(images["wide.png"])
    torch.testing.assert_close(read["patches"], patches, rtol=0, atol=1e-6)
    assert torch.equal(read["patch_coord"], coord) and coord.amax(0).tolist() == [2, 4]
    rows = {Path(row["input"]).name: row for row in predict(loaded, list(images.values()), top_k=4).rows}
    loader = NativeLoader(READING, in_chans=1)
    for name, path in images.items():
        sample = loader(path)
        grid_rows, grid_cols = (sample["patch_coord"].amax(0) + 1).tolist()
        height, width = SIZES[name]
        # each image keeps its shape: as it is within the budget, scaled down to fit it otherwise
        full = math.ceil(height / PATCH) * math.ceil(width / PATCH)
        assert grid_rows * grid_cols == full if full <= BUDGET else grid_rows * grid_cols <= BUDGET
        assert (grid_rows > grid_cols) == (height > width)
        probabilities, order = alone(model, sample).softmax(-1).sort(descending=True)
        assert rows[name]["classes"] == [CLASSES[i] for i in order.tolist()]
        np.testing.assert_allclose(rows[name]["probabilities"], probabilities.tolist(), rtol=0, atol=1e-5)


def test_tools_predict_reads_the_saved_folder(tmp_path, images):
    model = tiny(**WINDOW)
    folder = save(model, tmp_path / "saved")
    output = tmp_path / "preds.csv"
    proc = run_tool_here("tools/predict.py", folder, images["wide.png"], images["tall.png"], "--output", output,
                         "--top-k", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {Path(row["input"]).name: row for row in csv.DictReader(output.open())}
    loader = NativeLoader(READING, in_chans=1)
    for name, path in images.items():
        probabilities = alone(model, loader(path)).softmax(-1)
        assert rows[name]["class_1"] == CLASSES[int(probabilities.argmax())]
        assert abs(float(rows[name]["probability_1"]) - float(probabilities.max())) < 1e-5


def test_a_saved_segmentation_model_writes_masks_at_each_images_size(tmp_path, images):
    model = tiny(**SEGMENT)
    loaded = zoo.load_model(save(model, tmp_path / "saved"))
    result = predict(loaded, list(images.values()), mask_dir=tmp_path / "masks")
    masks = {Path(row["input"]).name: Path(row["mask"]) for row in result.rows}
    for name, (height, width) in SIZES.items():
        assert Image.open(masks[name]).size == (width, height)
    # the wide image is read as it is: its mask is the in-memory model's argmax on it
    want = alone(model, NativeLoader(READING, in_chans=1)(images["wide.png"])).argmax(0)[:24, :40]
    assert np.array_equal(np.asarray(Image.open(masks["wide.png"])), want.numpy())


def test_a_model_built_in_memory_predicts_as_its_saved_folder(tmp_path, images):
    """Without a run or a folder, a NaFlex model still reads each image at its own size (the default budget, its
    architecture's normalisation): its masks and its rows are those of the folder save_pretrained writes of it."""
    model = tiny(**SEGMENT).eval()
    loaded = zoo.load_model(zoo.save_pretrained(model, tmp_path / "saved"))
    paths = list(images.values())
    mine = predict(model, paths, mask_dir=tmp_path / "mine").rows
    theirs = predict(loaded, paths, mask_dir=tmp_path / "theirs").rows
    for row, want in zip(mine, theirs, strict=True):
        height, width = SIZES[Path(row["input"]).name]
        assert Image.open(row["mask"]).size == (width, height)
        assert np.array_equal(np.asarray(Image.open(row["mask"])), np.asarray(Image.open(want["mask"])))
    classifier = tiny(**WINDOW).eval()
    loaded = zoo.load_model(zoo.save_pretrained(classifier, tmp_path / "classifier"))
    rows = [predict(m, paths, top_k=4).rows for m in (classifier, loaded)]
    for row, want in zip(*rows, strict=True):
        assert row["classes"] == want["classes"]
        np.testing.assert_allclose(row["probabilities"], want["probabilities"], rtol=0, atol=1e-6)


def test_the_default_budget_is_the_position_table_and_old_folders_get_it(tmp_path):
    """Without naflex= the budget is as many patches as the position table holds (linformer: its max_seq_len less
    the prefix tokens); a folder saved before config.json held the entry loads with the same."""
    model = tiny(**WINDOW)
    folder = zoo.save_pretrained(model, tmp_path / "saved")
    config = json.loads((folder / "config.json").read_text())
    rows, cols = model.embeds.pos_embed.shape[1:3]
    assert config["naflex"]["max_tokens"] == rows * cols and config["naflex"]["patch_size"] == PATCH
    written = config.pop("naflex")
    (folder / "config.json").write_text(json.dumps(config))
    assert zoo.load_model(folder).zoo_run["naflex"] == written
    linformer = tiny(attention="linformer", attention_options={"k": 4, "max_seq_len": 40})
    saved = zoo.save_pretrained(linformer, tmp_path / "linformer")
    assert json.loads((saved / "config.json").read_text())["naflex"]["max_tokens"] == 40 - 4  # 4 registers


def test_overrides_keep_the_reading_settings(tmp_path):
    loaded = zoo.load_model(save(tiny(**WINDOW), tmp_path / "saved"), num_classes=7)
    assert loaded.zoo_run["naflex"] == READING and loaded.zoo_run["sizes"]["num_classes"] == 7
    assert loaded.zoo_run["label_names"] is None


def test_resaving_a_loaded_model_keeps_its_settings(tmp_path):
    loaded = zoo.load_model(save(tiny(**WINDOW), tmp_path / "saved"))
    again = zoo.save_pretrained(loaded, tmp_path / "again")
    assert json.loads((again / "config.json").read_text())["naflex"] == READING


def test_bad_reading_settings_are_named(tmp_path):
    model = tiny(**WINDOW)
    with pytest.raises(ValueError, match=r"unknown naflex key 'max_token'.*known: max_tokens, resize"):
        zoo.save_pretrained(model, tmp_path / "a", naflex={"max_token": 8})
    with pytest.raises(ValueError, match=r"max_tokens=0 must be an integer >= 1"):
        zoo.save_pretrained(model, tmp_path / "b", naflex={"max_tokens": 0})
    with pytest.raises(ValueError, match=r"extra key 'naflex' would replace a config.json entry"):
        zoo.save_pretrained(model, tmp_path / "c", extra={"naflex": {}})
    vit = zoo.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    with pytest.raises(ValueError, match=r"naflex=\{'max_tokens': 8\} sets how NaFlex models read images"):
        zoo.save_pretrained(vit, tmp_path / "d", naflex={"max_tokens": 8})
    folder = save(model, tmp_path / "e")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "naflex": {**READING, "resize": "stretch"}}))
    with pytest.raises(ValueError, match=r"config.json: naflex: resize='stretch' must be one of native, square"):
        zoo.load_model(folder)
    (folder / "config.json").write_text(json.dumps({**config, "naflex": [BUDGET]}))
    with pytest.raises(ValueError, match=r"config.json: naflex=\[24\] must be an object of max_tokens, resize"):
        zoo.load_model(folder)
