"""What happens to odd user inputs: each case spoils one valid file set (built in tmp_path by tests/data/odd_inputs.py)
the way users' files are spoilt, does what a user would (build the split, load the recipe or run, predict), and
checks the outcome docs/odd_inputs.md promises: it reads as it should, it reads with a warning that counts what was
left out, it stops with one line naming the file and the place, or the recipe is refused naming the key."""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import reset_accelerate, run_tool_here, tiny_sequence_recipe, write_recipe
from odd_inputs import (
    IMG_SIZE,
    csv_splits,
    fasta_tree,
    forecast_file,
    forecast_rows,
    genomic_benchmarks_tree,
    image_tree,
    mask_tree,
    ts_splits,
    write_csv,
    write_fasta,
    write_mask,
)
from PIL import Image

import zoo
from zoo.config import DataConfig, ScheduleConfig, load_recipe, recipe_from_dict
from zoo.data import DataContext, build_dataset
from zoo.data._registry import DEFAULT_NUM_SAMPLES
from zoo.data.images.decode import open_image
from zoo.predict import predict
from zoo.splits import build_split
from zoo.train._schedule import build_scheduler
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("no_network")

TRAIN = {"epochs": 1, "max_steps": 1, "mixed_precision": "no"}
# time steps of a CSV series (the series model's patches are 16 steps)
STEPS = 24


# --- what a user does -------------------------------------------------------------------------------------------


def folder(root: Path, split: str = "train", num_samples: int | None = None, **options) -> Any:
    context = DataContext(
        split, split == "train", root=str(root), img_size=IMG_SIZE, in_chans=3, num_samples=num_samples
    )
    dataset = build_dataset("folder", context, **options)
    for index in range(len(dataset)):
        dataset[index]
    return dataset


def mask_folder(root: Path, split: str = "train", **options) -> Any:
    options = {"num_classes": 3, **options}
    dataset = build_dataset("mask_folder", DataContext(split, False, root=str(root), img_size=IMG_SIZE), **options)
    return [dataset[index] for index in range(len(dataset))]


def fasta(root: Path, split: str = "train", num_samples: int | None = None, window: int = 16, **options) -> Any:
    context = DataContext(split, split == "train", root=str(root), num_samples=num_samples)
    return build_dataset("fasta", context, window=window, **options)


def series_csv(root: Path, split: str = "train", num_samples: int | None = None, **options) -> Any:
    return build_dataset(
        "csv", DataContext(split, split == "train", root=str(root), num_samples=num_samples), **options
    )


def forecast(path: Path, split: str = "train", num_samples: int | None = None, **options) -> Any:
    options = {"lookback": 24, "horizon": 4, "targets": ["demand"], **options}
    return build_dataset(
        "forecast_csv", DataContext(split, split == "train", root=str(path), num_samples=num_samples), **options
    )


def sequence_recipe(name: str, data: dict, task: str, source: str) -> dict:
    return tiny_sequence_recipe(name, data, task, source, train=TRAIN)


class Runs:
    """Tiny trained runs, each trained the first time a case asks for it (a CSV classifier, a forecaster)."""

    def __init__(self, home: Path) -> None:
        self.home, self.found = home, {}

    def _train(self, name: str, recipe: dict) -> Path:
        if name not in self.found:
            run_dir = self.home / name
            reset_accelerate()
            Trainer(recipe_from_dict(recipe), run_dir).fit()
            reset_accelerate()
            self.found[name] = run_dir
        return self.found[name]

    @property
    def csv(self) -> Path:
        data = {"name": "csv", "root": str(csv_splits(self.home / "csv_data"))}
        return self._train("csv", sequence_recipe("csv", data, "classification", "series"))

    @property
    def forecast(self) -> Path:
        options = {"lookback": 24, "horizon": 4, "targets": ["demand"]}
        data = {"name": "forecast_csv", "root": str(forecast_file(self.home / "series.csv")), "options": options}
        return self._train("forecast", sequence_recipe("forecast", data, "forecast", "series"))

    @property
    def fasta(self) -> Path:
        data = {"name": "fasta", "root": str(fasta_tree(self.home / "dna")), "options": {"window": 16}}
        return self._train("fasta", sequence_recipe("fasta", data, "classification", "dna"))

    @property
    def tokens(self) -> Path:
        data = {"name": "mqar", "options": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
                "train_samples": 8, "val_samples": 4, "test_samples": 4}  # fmt: skip
        return self._train("tokens", sequence_recipe("tokens", data, "token_classification", "tokens"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"))


# --- the cases --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """`act(tmp_path, runs)` does what a user would with one odd input; `outcome` is `reads` (no warning),
    `warns` (a warning matching `match` counts what was left out), `error` (one line matching `match`, naming the
    file and the place) or `refused` (one line matching `match`, naming the key)."""

    id: str
    kind: str
    act: Callable[[Path, Runs], Any]
    outcome: str
    match: str = ""


def _spoilt_image_tree(tmp: Path, spoil: Callable[[Path], None]) -> Path:
    root = image_tree(tmp / "images")
    spoil(root)
    return root


def _truncated_png(root: Path) -> None:
    path = root / "train" / "cat" / "0.png"
    path.write_bytes(path.read_bytes()[:60])


def _sixteen_bit(tmp: Path, runs: Runs) -> None:
    """A 16-bit ramp up to 59,500 keeps its shades (scaled by 65,535), where clipping to 8 bits makes it white."""
    root = image_tree(tmp / "images")
    ramp = (np.arange(12 * 10).reshape(10, 12) * 500).astype(np.uint16)
    Image.fromarray(ramp).save(root / "train" / "cat" / "0.png")
    folder(root)
    pixels = np.asarray(open_image(root / "train" / "cat" / "0.png", "L"))
    assert pixels.max() == round(59500 / 65535 * 255) and pixels[0, 1] == round(500 / 65535 * 255)


def _rgba(tmp: Path, runs: Runs) -> None:
    """A fully transparent white image is black (composited on black), not white."""
    root = image_tree(tmp / "images")
    Image.new("RGBA", (12, 10), (255, 255, 255, 0)).save(root / "train" / "cat" / "0.png")
    folder(root)
    assert np.asarray(open_image(root / "train" / "cat" / "0.png")).max() == 0


def _spoilt_masks(tmp: Path, spoil: Callable[[Path], None], **options) -> Any:
    root = mask_tree(tmp / "masks")
    spoil(root / "train")
    return mask_folder(root, **options)


def _mask_twice_as_large(tmp: Path, runs: Runs) -> None:
    """A mask of 24 x 20 for an image of 12 x 10, each class pixel a 2 x 2 block: resized, it is the original."""
    root = mask_tree(tmp / "masks")
    original = mask_folder(root)[0][1]
    path = root / "train" / "masks" / "0.png"
    write_mask(path, np.kron(np.asarray(Image.open(path)), np.ones((2, 2), np.uint8)))
    assert torch.equal(mask_folder(root, mask_size="resize")[0][1], original)


def _two_colour_mask(train: Path) -> None:
    """An RGB mask of a red left half and a green right half, as drawn in a paint program."""
    colours = np.zeros((10, 12, 3), np.uint8)
    colours[:, :6, 0], colours[:, 6:, 1] = 128, 128
    Image.fromarray(colours).save(train / "masks" / "0.png")


def _black_and_white(train: Path) -> None:
    """Every mask a grey PNG of 0 (left) and 255 (right), as binary masks are often saved."""
    for path in sorted((train / "masks").glob("*.png")):
        Image.fromarray(np.repeat(np.uint8([0, 255]), 6)[None].repeat(10, 0)).save(path)


def _black_and_white_mapped(tmp: Path, runs: Runs) -> None:
    """With `mask_values: {255: 1}` the white half is class 1: no pixel is unlabelled, both classes are read."""
    masks = _spoilt_masks(tmp, _black_and_white, mask_values={255: 1})
    for _, mask in masks:
        assert set(mask.unique().tolist()) == {0, 1}


def _user_set(name: str, root: Path, split: str = "train", num_samples: int | None = None, **options) -> Any:
    return build_dataset(name, DataContext(split, split == "train", root=str(root), num_samples=num_samples), **options)


def _spoilt(root: Path, spoil: Callable[[Path], None]) -> Path:
    spoil(root)
    return root


def _fasta_with(tmp: Path, spoil: Callable[[Path], None], **options) -> Any:
    root = fasta_tree(tmp / "dna")
    spoil(root)
    return fasta(root, **options)


def _csv_with(tmp: Path, rows: list[list] | None = None, header: list[str] | None = None, text: str | None = None,
              split: str = "train", **options) -> Any:  # fmt: skip
    root = csv_splits(tmp / "series")
    if text is not None:
        (root / "train.csv").write_bytes(text.encode("latin-1"))
    elif rows is not None:
        write_csv(root / "train.csv", header or ["label", *(f"t{i}" for i in range(STEPS))], rows)
    return series_csv(root, split, **options)


def _unknown_test_label(tmp: Path, runs: Runs) -> Any:
    root = csv_splits(tmp / "series")
    write_csv(root / "test.csv", ["label", "t0"], [["sideways", 1]])
    return series_csv(root, "test")


def _row(label: str, *cells) -> list:
    return [label, *cells, *[0.5] * (STEPS - len(cells))]


def _forecast_with(tmp: Path, edit: Callable[[list[list]], None], **options) -> Any:
    rows = forecast_rows()
    edit(rows)
    return forecast(write_csv(tmp / "series.csv", ["time", "demand", "temperature"], rows), **options)


def _cell(rows: list[list], row: int, column: int, value: Any) -> None:
    rows[row][column] = value


def _recipe_case(tmp: Path, data: dict, base: dict | None = None) -> Any:
    tree = sequence_recipe("odd", data, "classification", "series")
    if base is not None:
        write_recipe(tmp / "base.yaml", base)
        tree["base"] = "base.yaml"
    recipe = load_recipe(write_recipe(tmp / "odd.yaml", tree))
    return build_split(recipe, "train")


def _copied_recipe(tmp: Path, runs: Runs) -> Any:
    """A shipped recipe copied alone into a folder of the user's: its relative base is not beside it."""
    return load_recipe(shutil.copy(ROOT / "recipes" / "vit_linear_1024.yaml", tmp / "mine.yaml"))


def _every_series(dataset: Any) -> None:
    assert len(dataset) == 8


def _not_a_run(tmp: Path, runs: Runs) -> None:
    folder = tmp / "photos"
    folder.mkdir()
    result = run_tool_here("tools/eval.py", folder)
    assert result.returncode == 2 and list(folder.iterdir()) == [], (result.stderr, list(folder.iterdir()))
    raise ValueError(result.stderr.strip().splitlines()[-1])


def _copied_run(tmp: Path, run_dir: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp / "run"))


def _damaged_weights(tmp: Path, runs: Runs) -> None:
    weights = _copied_run(tmp, runs.csv) / "checkpoints" / "best" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    zoo.load_model(weights.parents[2])


def _lfs_pointer(tmp: Path, runs: Runs) -> None:
    """Weights cloned without `git lfs`: the file is the pointer."""
    pointer = tmp / "model.safetensors"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 4096\n")
    zoo.create_model("vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                     pretrained_file=str(pointer))  # fmt: skip


def _run_without_checkpoint(tmp: Path, runs: Runs) -> None:
    run_dir = _copied_run(tmp, runs.csv)
    shutil.rmtree(run_dir / "checkpoints")
    zoo.load_model(run_dir)


def _predict_files(tmp: Path, run_dir: Path, files: dict[str, str], **kwargs) -> Any:
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return predict(zoo.load_model(run_dir), [tmp / next(iter(files)).split("/")[0]], **kwargs)


def _series_text(rows: list[list]) -> str:
    return (
        "label," + ",".join(f"t{i}" for i in range(STEPS)) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)
    )


def _bad_row_six(tmp: Path, runs: Runs) -> None:
    rows = [_row("?") for _ in range(10)]
    rows[5][3] = "#REF!"
    result = _predict_files(tmp, runs.csv, {"q/good.csv": _series_text(rows[:2]), "q/bad.csv": _series_text(rows)})
    assert {Path(row["input"]).name for row in result.rows} == {"good.csv"}, result.rows
    assert [Path(name).name for name, _ in result.skipped] == ["bad.csv"]


def _forecast_gap_error(tmp: Path, runs: Runs) -> None:
    path = write_csv(tmp / "gap.csv", ["time", "demand", "temperature"], [*forecast_rows(39), ["t39", "", 20]])
    predict(zoo.load_model(runs.forecast), [path])


def _forecast_gap_set(tmp: Path, runs: Runs) -> None:
    path = write_csv(tmp / "gap.csv", ["time", "demand", "temperature"], [*forecast_rows(39), ["t39", "", 20]])
    result = run_tool_here("tools/predict.py", runs.forecast, path, "--set", "data.options.nan=interpolate")
    assert result.returncode == 0 and "wrote 4 predictions" in result.stderr, result.stderr[-2000:]
    # the command line's log records are in its stderr, not in caplog: a gap filled as asked warns of nothing
    assert not re.search(r"^(WARNING|ERROR) ", result.stderr, flags=re.MULTILINE), result.stderr[-2000:]


def _predict_set_other_key(tmp: Path, runs: Runs) -> None:
    predict(zoo.load_model(runs.forecast), [tmp], options={"lookback": 12})


CASES = [
    # image folders
    Case("image-txt-file", "image folder", lambda t, r: folder(_spoilt_image_tree(
        t, lambda root: (root / "train" / "cat" / "notes.txt").write_text("x"))), "warns", r"left out 1 .*\(1 \.txt\)"),
    Case("image-hidden-files", "image folder", lambda t, r: folder(_spoilt_image_tree(t, lambda root: (
        (root / "train" / "cat" / ".DS_Store").write_text("x"),
        (root / "train" / "dog" / ".ipynb_checkpoints").mkdir()))), "warns", r"left out 2 .*\(2 hidden\)"),
    Case("image-file-beside-classes", "image folder", lambda t, r: folder(_spoilt_image_tree(
        t, lambda root: (root / "train" / "README.md").write_text("x"))), "warns", r"1 beside the class folders"),
    Case("image-truncated", "image folder", lambda t, r: folder(_spoilt_image_tree(t, _truncated_png)), "error",
         r"0\.png: cannot decode.*on_bad_image: skip"),
    Case("image-truncated-skip", "image folder", lambda t, r: folder(_spoilt_image_tree(t, _truncated_png),
         on_bad_image="skip"), "warns", r"left out 1 unreadable image\(s\) of 8"),
    Case("image-not-an-image", "image folder", lambda t, r: folder(_spoilt_image_tree(
        t, lambda root: (root / "train" / "cat" / "0.png").write_text("<html>"))), "error", r"0\.png: not an image"),
    Case("image-16-bit", "image folder", _sixteen_bit, "reads"),
    Case("image-alpha", "image folder", _rgba, "reads"),
    Case("image-class-missing-from-train", "image folder", lambda t, r: folder(_spoilt_image_tree(
        t, lambda root: (root / "val" / "bird").mkdir()), "val"), "error", r"\['bird'\] of .*val.* missing from"),
    Case("image-empty-class", "image folder", lambda t, r: folder(_spoilt_image_tree(
        t, lambda root: (root / "train" / "bird").mkdir())), "warns", r"classes \['bird'\] have no image"),
    Case("image-split-missing", "image folder", lambda t, r: folder(_spoilt_image_tree(
        t, lambda root: shutil.rmtree(root / "test")), "test"), "error", r"split folder .*test' does not exist"),
    Case("image-train-samples", "image folder", lambda t, r: folder(image_tree(t / "images"), num_samples=3),
         "warns", r"data\.train_samples=3: 3 of the 8 images"),
    Case("image-train-samples-too-many", "image folder", lambda t, r: folder(image_tree(t / "images"), num_samples=50),
         "warns", r"data\.train_samples=50 asks for more than the 8 images .*all 8 kept"),
    # image masks
    Case("mask-missing", "image masks", lambda t, r: _spoilt_masks(t, lambda train: (
        train / "masks" / "3.png").unlink()), "warns", r"left out 1 images without a mask \(of 4\): images/3\.png"),
    Case("mask-without-image", "image masks", lambda t, r: _spoilt_masks(t, lambda train: (
        train / "images" / "2.png").unlink()), "warns", r"left out 1 masks without an image \(of 4\): masks/2\.png"),
    Case("mask-size-differs", "image masks", lambda t, r: _spoilt_masks(t, lambda train: write_mask(
        train / "masks" / "0.png", np.zeros((5, 6)))), "error",
         r"mask .*train/masks/0\.png is 6x5 pixels, its image .*train/images/0\.png 12x10; .*mask_size: resize"),
    Case("mask-size-resize", "image masks", _mask_twice_as_large, "reads"),
    Case("mask-unknown-class", "image masks", lambda t, r: _spoilt_masks(t, lambda train: write_mask(
        train / "masks" / "1.png", np.eye(10, 12) * 7)), "error",
         r"1\.png holds the value\(s\) 7 \(first at row 0, column 0\); allowed: the classes 0 to 2 and the ignore "
         r"value 255"),
    Case("mask-rgb", "image masks", lambda t, r: _spoilt_masks(t, _two_colour_mask), "error",
         r"0\.png is an RGB image of 2 colours, e\.g\. \(128, 0, 0\): save masks as palette \(P\) or grey \(L\)"),
    Case("mask-rgb-grey", "image masks", lambda t, r: _spoilt_masks(t, lambda train: Image.new(
        "RGB", (12, 10), (2, 2, 2)).save(train / "masks" / "0.png")), "reads"),
    Case("mask-not-an-image", "image masks", lambda t, r: _spoilt_masks(t, lambda train: (
        train / "masks" / "0.png").write_text("<html>")), "error",
         r"mask .*0\.png: not an image file PIL can read; data\.options\.on_bad_image: skip"),
    Case("mask-not-an-image-skip", "image masks", lambda t, r: _spoilt_masks(t, lambda train: (
        train / "masks" / "0.png").write_text("<html>"), on_bad_image="skip"), "warns",
         r"left out 1 image-mask pair\(s\) of 4 that do not read or fit"),
    Case("mask-black-and-white", "image masks", lambda t, r: _spoilt_masks(t, _black_and_white), "warns",
         r"first 4 masks \(.*0\.png, \.\.\.\) hold only 0 and 255, the ignore value: they label background alone\. "
         r".*data\.options\.mask_values: \{255: 1\}"),
    Case("mask-black-and-white-mapped", "image masks", _black_and_white_mapped, "reads"),
    Case("mask-values-not-a-class", "image masks", lambda t, r: mask_folder(mask_tree(t / "masks"),
         mask_values={255: 7}), "refused", r"data\.options\.mask_values: reads 255 as 7; allowed: a class "
         r"\(0 to 2\) or 255"),
    Case("mask-two-files-one-name", "image masks", lambda t, r: _spoilt_masks(t, lambda train: write_mask(
        train / "masks" / "0.tif", np.zeros((10, 12)))), "error", r"masks/0\.(png|tif)' and .*two files for '0'"),
    Case("mask-no-classes", "image masks", lambda t, r: mask_folder(mask_tree(t / "masks"), num_classes=None),
         "refused", r"needs data\.options\.num_classes .*classes\.txt"),
    # FASTA
    Case("fasta-empty-record", "FASTA", lambda t, r: _fasta_with(t, lambda root: write_fasta(
        root / "train" / "at_rich.fa", {"a": "ACGT" * 5, "nothing": ""})), "warns", r"left out 1 record.*>nothing"),
    Case("fasta-short-record", "FASTA", lambda t, r: _fasta_with(t, lambda root: write_fasta(
        root / "train" / "at_rich.fa", {"a": "ACGT" * 5, "tiny": "AC"}), min_length=4), "warns",
         r"left out 1 record.*min_length=4.*>tiny"),
    Case("fasta-notes-file", "FASTA", lambda t, r: _fasta_with(t, lambda root: (
        root / "train" / "notes.txt").write_text("x")), "warns", r"left out 1 entries that are not FASTA.*notes\.txt"),
    Case("fasta-empty-class-folder", "FASTA", lambda t, r: _fasta_with(t, lambda root: (
        root / "train" / "unused").mkdir()), "warns", r"unused/ \(no FASTA file\)"),
    Case("fasta-protein", "FASTA", lambda t, r: _fasta_with(t, lambda root: write_fasta(
        root / "train" / "at_rich.fa", {"p53": "MEEPQSDPSVEPPLSQETFSDLWKLL"})), "error",
         r"at_rich\.fa' record 1 \('>p53'\): 'E' at position 2 is not a nucleotide"),
    Case("fasta-truncated-gz", "FASTA", lambda t, r: _fasta_with(t, lambda root: (
        root / "train" / "at_rich.fa").write_bytes(
        write_fasta(root / "x.fa.gz", {"a": "ACGTTGCA" * 500}, compress=True).read_bytes()[:-20])), "error",
         r"at_rich\.fa': gzip file truncated"),
    Case("fasta-no-header", "FASTA", lambda t, r: _fasta_with(t, lambda root: (
        root / "train" / "gc_rich.fa").write_text(
        "GGCCGGCC\n")), "error", r"gc_rich\.fa' is not a FASTA file"),
    Case("fasta-rna-lowercase-gaps", "FASTA", lambda t, r: _fasta_with(t, lambda root: write_fasta(
        root / "train" / "at_rich.fa", {"rna": "acgu-uu..aaNN" * 3})), "reads"),
    Case("fasta-train-samples", "FASTA", lambda t, r: fasta(fasta_tree(t / "dna"), num_samples=5), "warns",
         r"data\.train_samples=5: 5 of the 18 windows"),
    Case("genomic-benchmarks-empty-file", "FASTA", lambda t, r: _user_set("genomic_benchmarks", _spoilt(
        genomic_benchmarks_tree(t / "gb"), lambda root: (root / "train" / "at_rich" / "9.txt").write_text(""))),
         "warns", r"left out 1 empty sequence file\(s\), e.g. at_rich/9\.txt"),
    Case("genomic-benchmarks-train-samples", "FASTA", lambda t, r: _user_set(
        "genomic_benchmarks", genomic_benchmarks_tree(t / "gb"), num_samples=4), "warns",
         r"data\.train_samples=4: 4 of the 6 sequences"),
    # CSV series
    Case("csv-bad-cell", "CSV", lambda t, r: _csv_with(t, [_row("up"), _row("flat", 1, "#REF!")]), "error",
         r"train\.csv' line 3, column 3 \('t1'\): cannot read '#REF!'"),
    Case("csv-missing-value", "CSV", lambda t, r: _csv_with(t, [_row("up"), _row("flat", 1, "NA", 2)]), "error",
         r"train\.csv' line 3, column 3 .*missing value .*set data\.options\.nan: mask or interpolate"),
    Case("csv-short-row", "CSV", lambda t, r: _csv_with(t, [_row("up"), ["flat", 1, 2, 3]]), "reads"),
    Case("csv-not-utf8", "CSV", lambda t, r: _csv_with(t, text="label,t0\ncaf\xe9,1\n"), "error",
         r"train\.csv' is not UTF-8 text \(byte 0xe9"),
    Case("csv-extra-cell", "CSV", lambda t, r: _csv_with(t, [_row("up"), [*_row("flat"), 9]]), "error",
         r"train\.csv' line 3 has 26 cells, the header 25"),
    Case("csv-decimal-comma", "CSV", lambda t, r: _csv_with(t, text="label,t0,t1\nup,1,5,2\n"), "error",
         r"line 2 has 4 cells, the header 3.*quote a cell that holds a comma"),
    Case("csv-semicolons", "CSV", lambda t, r: _csv_with(t, text="label;t0;t1\nup;1;2\n"), "error",
         r"label column 'label' is not a column of .*train\.csv'.*its header: label;t0;t1"),
    Case("csv-empty-label", "CSV", lambda t, r: _csv_with(t, [_row("up"), _row("")]), "error",
         r"line 3, column 1 \('label'\): the label is empty"),
    Case("csv-unknown-test-label", "CSV", _unknown_test_label, "error",
         r"labels \['sideways'\] of .*test\.csv' are not among the classes"),
    Case("csv-duplicate-column", "CSV", lambda t, r: _csv_with(t, [_row("up")], ["label", *["t0"] * STEPS]), "error",
         r"names the column\(s\) 't0' twice"),
    Case("csv-train-samples", "CSV", lambda t, r: _csv_with(t, num_samples=3), "warns",
         r"data\.train_samples=3: 3 of the 8 series"),
    Case("ts-train-samples", "CSV", lambda t, r: _user_set("ts", ts_splits(t / "ts"), num_samples=2), "warns",
         r"data\.train_samples=2: 2 of the 6 series of .*train\.ts"),
    # forecast CSV
    Case("forecast-text-target", "forecast CSV", lambda t, r: _forecast_with(t, lambda rows: _cell(rows, 7, 1, "n/a?")),
         "error", r"series\.csv' line 9, column 2 \('demand'\): cannot read 'n/a\?'"),
    Case("forecast-missing-target-masked", "forecast CSV", lambda t, r: _forecast_with(
        t, lambda rows: _cell(rows, 60, 1, ""), nan="mask"), "warns",
         r"train split: 4 of \d+ windows left out for a missing target"),
    Case("forecast-too-short", "forecast CSV", lambda t, r: forecast(forecast_file(t / "s.csv", 30)), "error",
         r"lookback=24 and horizon=4 leave no train window in a series of 30 steps"),
    Case("forecast-train-samples", "forecast CSV", lambda t, r: forecast(forecast_file(t / "s.csv"), num_samples=50),
         "refused", r"data\.train_samples=50: dataset 'forecast_csv' keeps every window"),
    # recipes
    Case("recipe-misspelt-key", "recipe", lambda t, r: _recipe_case(t, {"name": "csv", "root": str(t), "optons": {}}),
         "refused", r"data\.optons.*options"),
    Case("recipe-folder-without-root", "recipe", lambda t, r: load_recipe(write_recipe(t / "r.yaml", {
        "name": "r", "data": {"name": "folder"}})), "refused", r"data\.root: required when data\.name is 'folder'"),
    Case("recipe-fasta-without-window", "recipe", lambda t, r: load_recipe(write_recipe(t / "r.yaml", sequence_recipe(
        "r", {"name": "fasta", "root": str(t)}, "classification", "dna"))), "refused", r"window"),
    Case("recipe-inherited-samples", "recipe", lambda t, r: _recipe_case(
        t, {"name": "csv", "root": str(csv_splits(t / "series"))}, base={"data": {"train_samples": 5}}),
         "warns", r"data\.train_samples=5: 5 of the 8 series"),
    Case("recipe-samples-null", "recipe", lambda t, r: _every_series(_recipe_case(t, {
        "name": "csv", "root": str(csv_splits(t / "series")), "train_samples": None},
        base={"data": {"train_samples": 5}})),
         "reads"),
    Case("recipe-copied-without-its-base", "recipe", _copied_recipe, "warns",
         r"base base/vit_megamnist_1024\.yaml is not beside it: using the project's .*recipes/base/vit_megamnist_1024"),
    Case("recipe-base-of-another-dataset", "recipe", lambda t, r: _every_series(_recipe_case(
        t, {"name": "csv", "root": str(csv_splits(t / "series"))},
        base={"data": {"name": "megamnist", "options": {"canvas_size": 64}}})), "reads"),
    Case("recipe-unknown-key-in-base", "recipe", lambda t, r: _recipe_case(
        t, {"name": "csv", "root": str(csv_splits(t / "series"))}, base={"data": {"batch_sise": 4}}),
         "refused", r"odd\.yaml: data\.batch_sise: .*\(set in its base .*base\.yaml\)"),
    Case("schedule-warmup-beyond-run", "recipe", lambda t, r: build_scheduler(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3), ScheduleConfig(warmup_steps=40), 30),
         "warns", r"schedule\.warmup_steps 40 is at or beyond the run's 30 steps.*set schedule\.warmup_steps below 30"),
    # run folders and weights files
    Case("run-eval-on-a-plain-folder", "run folder", _not_a_run, "error", r"photos/recipe\.yaml does not exist"),
    Case("run-without-checkpoints", "run folder", _run_without_checkpoint, "error",
         r"run directory without a 'best' checkpoint"),
    Case("weights-truncated", "weights file", _damaged_weights, "error",
         r"best is damaged: model\.safetensors has \d+ bytes, \d+ when saved"),
    Case("weights-lfs-pointer", "weights file", _lfs_pointer, "error",
         r"model\.safetensors.*git-lfs pointer.*git lfs pull"),
    # prediction inputs
    Case("predict-csv-bad-row", "predict input", _bad_row_six, "warns",
         r"skipped .*bad\.csv: .*bad\.csv' line 7, column 4"),
    Case("predict-folder-litter", "predict input", lambda t, r: _predict_files(t, r.fasta, {
        "q/a.fa": ">a\nACGTACGT\n", "q/notes.txt": "x", "q/.DS_Store": "x"}), "warns",
         r"left out 2 files that are not FASTA files \(\.DS_Store, notes\.txt\)"),
    Case("predict-fasta-empty-record", "predict input", lambda t, r: _predict_files(t, r.fasta, {
        "q/a.fa": ">a\nACGT\n>none\n\n"}), "warns", r"left out 1 empty record.*>none"),
    Case("predict-tokens-header-blank-lines", "predict input", lambda t, r: _predict_files(t, r.tokens, {
        "q/ids.csv": "id_1,id_2,id_3\r\n3,17,5\r\n\r\n4,18,6\r\n"}), "warns", r"left out 1 blank line"),
    Case("predict-tokens-out-of-vocabulary", "predict input", lambda t, r: _predict_files(t, r.tokens, {
        "q/ids.txt": "3 17 5\n3 40 5\n", "q/more.txt": "1 2\n"}), "warns",
         r"skipped .*ids\.txt: line 2: token id 40 is outside the run's vocabulary \(0 to 31\)"),
    Case("predict-forecast-gap", "predict input", _forecast_gap_error, "error",
         r"gap\.csv' line 41, column 2 .*rerun with --set data\.options\.nan=mask"),
    Case("predict-forecast-gap-set", "predict input", _forecast_gap_set, "reads"),
    Case("predict-set-other-option", "predict input", _predict_set_other_key, "refused",
         r"data\.options\.lookback: predict reads series inputs as the run was trained; it takes only"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_odd_input(case: Case, tmp_path, runs, caplog):
    caplog.set_level(logging.WARNING)
    if case.outcome in ("error", "refused"):
        with pytest.raises((ValueError, OSError)) as caught:
            case.act(tmp_path, runs)
        message = str(caught.value)
        assert "\n" not in message.strip(), message
        assert re.search(case.match, message), message
        return
    case.act(tmp_path, runs)
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    if case.outcome == "reads":
        assert not warnings, warnings
    else:
        assert any(re.search(case.match, text) for text in warnings), warnings


def test_every_case_is_in_the_docs_table():
    text = (ROOT / "docs" / "odd_inputs.md").read_text()
    rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.MULTILINE))
    assert rows == {case.id for case in CASES}
    assert len(CASES) >= 30 and "```" not in text


def test_the_recipe_defaults_are_the_data_registry_s():
    """A set of your files keeps every item at the recipe's default count: both must name the same numbers."""
    defaults = DataConfig()
    assert DEFAULT_NUM_SAMPLES == {s: getattr(defaults, f"{s}_samples") for s in ("train", "val", "test")}


def test_a_subset_is_the_same_every_run_and_differs_by_seed(tmp_path):
    root = image_tree(tmp_path / "images", per_class=6)
    first, again = (folder(root, num_samples=5).samples for _ in range(2))
    other = build_dataset(
        "folder", DataContext("train", True, seed=1, num_samples=5, root=str(root), img_size=16)
    ).samples
    assert first == again and len(first) == 5 and first != other
    assert len(folder(root, num_samples=DEFAULT_NUM_SAMPLES["train"])) == 12


def test_forecast_split_keeps_its_windows_with_the_default_counts(tmp_path):
    path = forecast_file(tmp_path / "s.csv")
    context = dataclasses.replace(DataContext("val", False, root=str(path)), num_samples=DEFAULT_NUM_SAMPLES["val"])
    assert len(build_dataset("forecast_csv", context, lookback=24, horizon=4, targets=["demand"])) > 0
    assert torch.is_tensor(forecast(path)[0]["values"])
