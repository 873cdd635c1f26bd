"""A recipe copied out of recipes/ keeps working, as a user starts their own: its relative `base:` found in the
project, a changed dataset, attention or model kind starting that section's options from empty, errors naming the
file the user wrote; and every shipped recipe, copied to a folder of its own with its dataset changed, trains a
step."""

from __future__ import annotations

import logging
import math
import random
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, reset_accelerate, shrink_1d

from zoo.config import RecipeError, load_recipe

RECIPES = ROOT / "recipes"
SHIPPED = sorted(p.name for p in RECIPES.glob("*.yaml"))


def copy_out(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(RECIPES / name, folder / name))


def test_copied_base_is_found_in_the_project_with_a_warning(tmp_path, caplog):
    copy = copy_out("vit_linear_1024.yaml", tmp_path)
    with caplog.at_level(logging.WARNING, logger="zoo.config._files"):
        recipe = load_recipe(copy)
    assert recipe.model.attention.name == "linear"
    assert recipe.data.options["canvas_size"] == 1024
    shipped = RECIPES / "base" / "vit_megamnist_1024.yaml"
    assert f"base base/vit_megamnist_1024.yaml is not beside it: using the project's {shipped}" in caplog.text


def test_a_base_beside_the_copy_wins(tmp_path):
    copy = copy_out("vit_linear_1024.yaml", tmp_path)
    own = tmp_path / "base" / "vit_megamnist_1024.yaml"
    own.parent.mkdir()
    own.write_text((RECIPES / "base" / "vit_megamnist_1024.yaml").read_text().replace("seed: 0", "seed: 11"))
    assert load_recipe(copy).seed == 11


def test_changed_dataset_starts_its_options_from_empty(tmp_path):
    copy = copy_out("vit_linear_1024.yaml", tmp_path)
    (tmp_path / "mine.yaml").write_text("base: vit_linear_1024.yaml\ndata: {name: folder, root: imgs}\n")
    recipe = load_recipe(tmp_path / "mine.yaml")
    # folder's own defaults, none of MegaMNIST's canvas options
    assert (recipe.data.name, recipe.data.options) == ("folder", {})
    # the same dataset keeps the base's options
    (tmp_path / "same.yaml").write_text("base: vit_linear_1024.yaml\ndata: {name: megamnist}\n")
    assert load_recipe(tmp_path / "same.yaml").data.options["canvas_size"] == 1024
    assert copy.is_file()


def test_changed_attention_and_kind_start_their_options_from_empty(tmp_path):
    copy_out("vit_performer_1024.yaml", tmp_path)
    (tmp_path / "a.yaml").write_text("base: vit_performer_1024.yaml\nmodel: {attention: {name: linear}}\n")
    assert load_recipe(tmp_path / "a.yaml").model.attention.options == {}
    copy_out("quickstart.yaml", tmp_path)
    (tmp_path / "k.yaml").write_text(
        "base: quickstart.yaml\nmodel: {kind: sequence, embed_dim: 16, num_heads: 2, sequence: {input: tokens}}\n"
        "data: {name: mqar}\nmetrics: [top1]\n"
        "task: token_classification\n"
    )
    model = load_recipe(tmp_path / "k.yaml").model
    # the ViT's img_size and patch_size are gone (they would be unknown keys); the shared embed_dim stays the child's
    assert (model.kind, model.embed_dim, model.attention.name) == ("sequence", 16, "performer")


def test_explicit_empty_mapping_empties_the_section(tmp_path):
    copy_out("vit_performer_1024.yaml", tmp_path)
    (tmp_path / "e.yaml").write_text("base: vit_performer_1024.yaml\nmodel: {attention: {options: {}}}\n")
    assert load_recipe(tmp_path / "e.yaml").model.attention.options == {}


def test_unknown_key_from_a_base_names_the_users_file(tmp_path):
    copy_out("vit_linear_1024.yaml", tmp_path)
    # a key of the base's dataset that megamnist_seg would not take, kept because the name did not change
    (tmp_path / "mine.yaml").write_text("base: vit_linear_1024.yaml\ndata: {options: {canvass_size: 3}}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(tmp_path / "mine.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'mine.yaml'}: data.options.canvass_size: unknown key")


def _own_data(root: Path) -> dict[str, Path]:
    """A tiny data set of each kind a user brings (as README's own-data example writes): images, DNA, series,
    a load curve."""
    random.seed(0)
    from PIL import Image

    for split in ("train", "val", "test"):
        for shape, colour in (("circle", "orange"), ("square", "blue")):
            folder = root / "images" / split / shape
            folder.mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (40, 40), colour).save(folder / f"{i}.png")
        (root / "dna" / split).mkdir(parents=True)
        for name, letters in (("gc", "GGGCCCAT"), ("at", "AAATTTGC")):
            records = [f">{name}{i}\n" + "".join(random.choices(letters, k=2100)) for i in range(2)]
            (root / "dna" / split / f"{name}.fa").write_text("\n".join(records) + "\n")
        header = "label," + ",".join(f"t{t}" for t in range(64))
        rows = [f"{lab},{','.join(f'{math.sin(t / p):.3f}' for t in range(64))}" for lab, p in (("a", 3), ("b", 9))]
        rows = [header, *rows, *rows]
        (root / "series").mkdir(exist_ok=True)
        (root / "series" / f"{split}.csv").write_text("\n".join(rows) + "\n")
    rows = ["time,demand"] + [f"t{t},{3 + math.sin(t / 8):.3f}" for t in range(400)]
    (root / "load.csv").write_text("\n".join(rows) + "\n")
    return {"images": root / "images", "dna": root / "dna", "series": root / "series", "load": root / "load.csv"}


# a recipe's dataset -> the one its copy trains on (name, root key of _own_data or None, options)
_CHANGES = {
    "megamnist": ("folder", "images", None),
    "native_megamnist": ("native_folder", "images", None),
    "genomes": ("fasta", "dna", {"window": 2048}),
    "splice": ("fasta", "dna", {"window": 60}),
    "ucr": ("csv", "series", None),
    "elecdemand": ("forecast_csv", "load", {"lookback": 48, "horizon": 12, "targets": ["demand"]}),
    "listops": ("pathfinder", None, {"resolution": 32, "cache": False}),
    "pathfinder": ("listops", None, {"min_length": 40, "max_length": 60}),
    "mqar": ("induction_heads", None, None),
    "induction_heads": ("mqar", None, {"vocab_size": 256, "seq_len": 128, "num_kv_pairs": 8}),
    "selective_copying": ("mqar", None, {"vocab_size": 256, "seq_len": 128, "num_kv_pairs": 8}),
}


@pytest.mark.slow
def test_every_shipped_recipe_copied_with_another_dataset_trains_a_step(tmp_path):
    from zoo.train.loop import Trainer

    roots = _own_data(tmp_path / "data")
    trained, skipped = [], []
    for name in SHIPPED:
        tree = yaml.safe_load((RECIPES / name).read_text())
        loaded = load_recipe(RECIPES / name)
        change = _CHANGES.get(loaded.data.name)
        if change is None or (loaded.data.name == "mqar" and loaded.model.kind != "sequence"):
            skipped.append(name)
            continue
        dataset, root, options = change
        copy = copy_out(name, tmp_path / "mine" / name.removesuffix(".yaml"))
        data = {k: v for k, v in (tree.get("data") or {}).items() if k != "options"}
        data.update(name=dataset, root=str(roots[root]) if root else None, options=options)
        data.update(train_samples=None, val_samples=None, test_samples=None) if root else data.update(
            train_samples=8, val_samples=4, test_samples=4
        )
        tree["data"] = {k: v for k, v in data.items() if v is not None or k.endswith("_samples")}
        copy.write_text(yaml.safe_dump(tree))
        tiny = [*shrink_1d(1), "data.batch_size=2", "data.eval_batch_size=2", "train.compile=false"]
        if loaded.model.kind == "vit":
            # the recipe's depth stays (window2d_global's global blocks are indices into it)
            tiny = ["model.img_size=32", "model.patch_size=8", "model.embed_dim=32", *tiny[3:]]
            tiny += ["model.num_heads=2", "model.pretrained=false"]
        if loaded.model.kind == "naflex":  # the folder's patches are the model's
            tiny += [f"data.options.patch_size={loaded.model.naflex.patch_size}"]
        recipe = load_recipe(copy, tiny)
        assert recipe.data.name == dataset, name
        reset_accelerate()
        Trainer(recipe, tmp_path / "runs" / name).fit()
        reset_accelerate()
        assert (tmp_path / "runs" / name / "train_summary.json").is_file(), name
        trained.append(name)
    # every dataset the shipped recipes use has a change above, but the segmentation masks (megamnist_seg, recall2d)
    # no user dataset here carries their labels: masks (segmentation), per-nucleotide labels (yeast_coding)
    unchanged = [n for n in skipped if load_recipe(RECIPES / n).task != "segmentation" and "yeast" not in n]
    assert not unchanged, f"no dataset to change to for {unchanged}"
    assert len(trained) >= 30, trained
