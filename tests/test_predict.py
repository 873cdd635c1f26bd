"""zoo.predict and tools/predict.py on tiny runs trained in tmp_path: images of any size and mode (16-bit, palette,
alpha), FASTA windows and per-position labels, CSV series and forecasts; each prediction checked against the
model run on the dataset's own sample; unreadable inputs named and skipped."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import reset_accelerate, run_tool_here
from PIL import Image

import zoo
from zoo.config import load_recipe, recipe_from_dict
from zoo.data import _debian as debian
from zoo.data.dna.nucleotides import DNATokenizer, encode_nucleotides
from zoo.data.images.megamnist import MegaMNIST
from zoo.data.series.classification import CsvSeriesDataset
from zoo.data.series.forecast import ForecastWindows
from zoo.predict import image_loader, predict, write_predictions
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("no_network")

CANVAS = {"canvas_size": 32, "digit_size": 12, "num_target": 2, "num_other": 1, "num_clutter": 1}
VIT = {
    "name": "tiny",
    "seed": 3,
    "model": {"name": "vit_tiny_patch16_224", "img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1,
              "num_heads": 2, "attention": {"name": "softmax"}},
    "data": {"name": "megamnist", "options": CANVAS, "train_samples": 16, "val_samples": 8, "test_samples": 8,
             "batch_size": 8, "num_workers": 0},
    "train": {"epochs": 1, "mixed_precision": "no"},
}  # fmt: skip
SEQUENCE = {"embed_dim": 16, "depth": 1, "num_heads": 2}
TRAIN = {"epochs": 1, "max_steps": 2, "mixed_precision": "no"}


def train(recipe, run_dir: Path) -> torch.nn.Module:
    reset_accelerate()
    Trainer(recipe, run_dir).fit()
    reset_accelerate()
    return zoo.load_model(run_dir)


def sequence_recipe(name: str, data: dict, task: str, input: str, **model) -> object:
    return recipe_from_dict({
        "name": name, "task": task, "data": {"num_workers": 0, "batch_size": 4, **data},
        "model": {"kind": "sequence", **SEQUENCE, "sequence": {"input": input}, **model}, "train": TRAIN,
        "metrics": ["mse"] if task == "forecast" else ["top1"],
    })  # fmt: skip


def probabilities(logits: torch.Tensor) -> list[float]:
    return logits.softmax(-1).sort(descending=True).values.tolist()


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vit")
    (folder / "tiny.yaml").write_text(yaml.safe_dump(VIT))
    return train(load_recipe(folder / "tiny.yaml"), folder / "run"), folder / "run"


@pytest.fixture
def pictures(tmp_path) -> dict[str, Path]:
    """A test canvas as an 8-bit PNG and as a 16-bit TIFF, other sizes and modes, a broken file, a nested folder."""
    canvas, _ = MegaMNIST("test", num_samples=1, **CANVAS)[0]
    pixels = (canvas[0].numpy() * 255).round().astype(np.uint8)
    folder = tmp_path / "pictures"
    (folder / "nested").mkdir(parents=True)
    paths = {
        "png": folder / "canvas.png",
        "tif16": folder / "canvas16.tif",
        "rgb": folder / "nested" / "wide.jpg",
        "palette": folder / "nested" / "palette.gif",
        "rgba": folder / "rgba.png",
        "broken": folder / "broken.png",
    }
    Image.fromarray(pixels).save(paths["png"])
    Image.fromarray(pixels.astype(np.uint16) * 257).save(paths["tif16"])
    Image.new("RGB", (100, 70), (200, 30, 30)).save(paths["rgb"])
    Image.fromarray(pixels).convert("P").save(paths["palette"])
    Image.new("RGBA", (40, 40), (255, 255, 255, 128)).save(paths["rgba"])
    paths["broken"].write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    return {"folder": folder, "canvas": canvas, **paths}


def test_images_are_predicted_as_the_model_sees_its_own_data(vit, pictures):
    model, _ = vit
    result = predict(model, [pictures["png"], pictures["tif16"]], top_k=3)
    expected = probabilities(model(pictures["canvas"][None])[0])[:3]
    for row in result.rows:
        assert len(row["classes"]) == 3 and set(row["classes"]) <= {str(d) for d in range(10)}
        np.testing.assert_allclose(row["probabilities"], expected, atol=1e-5)


def test_a_folder_is_searched_and_unreadable_files_are_named_and_skipped(vit, pictures, tmp_path, caplog):
    model, _ = vit
    result = predict(model, [pictures["folder"], tmp_path / "missing.png"], batch_size=2)
    assert sorted(Path(row["input"]).name for row in result.rows) == sorted(
        ["canvas.png", "canvas16.tif", "wide.jpg", "palette.gif", "rgba.png"]
    )
    skipped = dict(result.skipped)
    assert set(skipped) == {str(pictures["broken"]), str(tmp_path / "missing.png")}
    assert (
        "cannot decode" in skipped[str(pictures["broken"])] and "no such file" in skipped[str(tmp_path / "missing.png")]
    )
    assert f"skipped {pictures['broken']}: cannot decode" in caplog.text
    with pytest.raises(ValueError, match="nothing to predict: no input could be read"):
        predict(model, [pictures["broken"]])


def test_the_cli_writes_csv_or_json_and_names_what_it_skipped(vit, pictures, tmp_path):
    _, run_dir = vit
    output = tmp_path / "preds.csv"
    proc = run_tool_here("tools/predict.py", run_dir, pictures["folder"], "--output", output, "--top-k", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(output.open()))
    assert len(rows) == 5 and list(rows[0]) == ["input", "class_1", "probability_1", "class_2", "probability_2"]
    warned = [line for line in proc.stderr.splitlines() if "broken.png" in line]
    assert len(warned) == 1 and "skipped" in warned[0]
    assert "wrote 5 predictions" in proc.stderr
    bad = run_tool_here("tools/predict.py", run_dir, pictures["png"], "--output", tmp_path / "preds.txt")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: output ")


def test_json_keeps_the_top_k_lists_and_the_skipped_inputs(vit, pictures, tmp_path):
    model, _ = vit
    write_predictions(predict(model, [pictures["png"], pictures["broken"]], top_k=2), tmp_path / "p.json")
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["task"] == "classification" and len(written["predictions"][0]["classes"]) == 2
    assert written["skipped"][0]["input"] == str(pictures["broken"])


def write_fasta(path: Path, records: dict[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f">{name}\n{sequence}\n" for name, sequence in records.items()))
    return path


def test_fasta_records_are_predicted_per_window(tmp_path):
    rng = np.random.default_rng(0)
    for split in ("train", "val", "test"):
        for name, letters in (("at_rich", "AAAT"), ("gc_rich", "GGCC")):
            records = {f"{name}{i}": "".join(rng.choice(list(letters), 50)) for i in range(3)}
            write_fasta(tmp_path / "data" / split / f"{name}.fa", records)
    recipe = sequence_recipe("fasta", {"name": "fasta", "root": str(tmp_path / "data"), "options": {"window": 20}},
                             "classification", "dna")  # fmt: skip
    model = train(recipe, tmp_path / "run")
    query = write_fasta(tmp_path / "query.fasta", {"long": "ACGT" * 11, "short": "GGGCCC"})
    (tmp_path / "bad.fa").write_text("this is not a FASTA file\n")
    result = predict(model, [query, tmp_path / "bad.fa"], top_k=1)
    assert [(r["record"], r["start"], r["end"]) for r in result.rows] == [
        ("long", 1, 20), ("long", 21, 40), ("long", 41, 44), ("short", 1, 6)
    ]  # fmt: skip
    assert result.skipped[0][0] == str(tmp_path / "bad.fa") and "not a FASTA file" in result.skipped[0][1]
    assert {r["classes"][0] for r in result.rows} <= {"at_rich", "gc_rich"}
    # the first window, tokenised as the training windows were
    tokens = DNATokenizer()(encode_nucleotides("ACGT" * 5))
    expected = probabilities(model(tokens[None], None)[0])[0]
    assert result.rows[0]["probabilities"][0] == pytest.approx(expected, abs=1e-5)


@pytest.mark.skipif(not debian.is_available("gbrowse-data"), reason="Debian data package gbrowse-data missing")
def test_a_per_position_task_labels_every_nucleotide(tmp_path):
    recipe = load_recipe(
        ROOT / "recipes" / "yeast_coding_quick.yaml",
        [*(f"model.{k}={v}" for k, v in SEQUENCE.items()), "data.options.window=64", "train.max_steps=2",
         "train.epochs=1", "model.attention.options.window=8"],
    )  # fmt: skip
    model = train(recipe, tmp_path / "run")
    query = write_fasta(tmp_path / "chr.fa", {"piece": "ATGC" * 40})
    rows = predict(model, [query]).rows
    assert [r["position"] for r in rows] == list(range(1, 161))
    assert {r["label"] for r in rows} <= {"non-coding", "coding+", "coding-"}
    logits = model(DNATokenizer()(encode_nucleotides("ATGC" * 16))[None], None)[0]  # the first window
    labels = [model.zoo_run["label_names"][i] for i in logits.argmax(-1).tolist()]
    assert [r["label"] for r in rows[:64]] == labels


def write_csv(path: Path, header: list[str], rows) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_csv_series_are_classified_one_row_each(tmp_path):
    rng = np.random.default_rng(1)
    for split in ("train", "val", "test"):
        rows = [[label, *(rng.normal(size=24) + 3 * (label == "up") * np.linspace(0, 1, 24)).round(3)]
                for label in ("up", "flat") * 4]  # fmt: skip
        write_csv(tmp_path / f"{split}.csv", ["label", *map(str, range(24))], rows)
    recipe = sequence_recipe("series", {"name": "csv", "root": str(tmp_path)}, "classification", "series")
    model = train(recipe, tmp_path / "run")
    query = write_csv(tmp_path / "query.csv", ["label", *map(str, range(24))], [["?", *range(24)], ["?", *[1] * 20]])
    result = predict(model, [query], top_k=2)
    assert [r["item"] for r in result.rows] == [1, 2] and set(result.rows[0]["classes"]) == {"up", "flat"}
    sample = CsvSeriesDataset(query, classes=["?"])[0]
    expected = probabilities(model(sample["values"][None], sample["mask"][None])[0])
    np.testing.assert_allclose(result.rows[0]["probabilities"], expected, atol=1e-5)


def test_a_forecast_continues_the_last_look_back_in_the_targets_units(tmp_path):
    steps = np.arange(400)
    demand = 50 + 10 * np.sin(steps * 2 * np.pi / 24)
    temperature = 20 + 5 * np.cos(steps * 2 * np.pi / 24)
    every = zip(steps, demand.round(4), temperature.round(4), strict=True)
    data = write_csv(tmp_path / "series.csv", ["time", "demand", "temperature"], [[f"t{t}", d, c] for t, d, c in every])
    options = {"lookback": 48, "horizon": 6, "targets": ["demand"]}
    recipe = sequence_recipe("forecast", {"name": "forecast_csv", "root": str(data), "options": options},
                             "forecast", "series")  # fmt: skip
    model = train(recipe, tmp_path / "run")
    windows = ForecastWindows.from_csv(data, "train", **options)
    first = zip(steps[:60], demand[:60].round(4), temperature[:60].round(4), strict=True)
    query = write_csv(tmp_path / "query.csv", ["time", "demand", "temperature"], [[f"t{t}", d, c] for t, d, c in first])
    rows = predict(model, [query]).rows
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and set(rows[0]) == {"input", "step", "demand"}
    sample = windows[60 - 48]
    scaled = model(sample["values"][None], sample["mask"][None])[0, :, 0].detach().numpy()
    at = windows.columns.index("demand")
    expected = scaled * windows.std[at] + windows.mean[at]
    np.testing.assert_allclose([r["demand"] for r in rows], expected, rtol=1e-4)
    short = write_csv(tmp_path / "short.csv", ["time", "demand", "temperature"], [["t0", 1, 2]] * 10)
    with pytest.raises(ValueError, match="nothing to predict.*10 time steps, the model looks back 48"):
        predict(model, [short])


def test_image_loader_is_predicts_reader_and_agrees_with_timm_on_8_bit_rgb(tmp_path):
    """`image_loader(model)` equals timm's route (resolve_data_config + create_transform on PIL's RGB) on an 8-bit RGB
    file; on a 16-bit file and a transparent one timm's route clips and drops alpha (README), zoo's does not."""
    from timm.data import create_transform, resolve_data_config

    model = zoo.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3
    ).eval()
    load, timm_transform = image_loader(model), create_transform(**resolve_data_config(model=model))
    rng = np.random.default_rng(4)
    paths = {name: tmp_path / f"{name}.png" for name in ("rgb", "sixteen", "alpha")}
    Image.fromarray(rng.integers(0, 256, (37, 45, 3), dtype=np.uint8)).save(paths["rgb"])
    Image.fromarray((np.arange(37 * 45).reshape(37, 45) * 2).astype(np.uint16)).save(paths["sixteen"])
    Image.new("RGBA", (45, 37), (255, 255, 255, 0)).save(paths["alpha"])

    def timm_route(path: Path) -> torch.Tensor:
        return timm_transform(Image.open(path).convert("RGB"))

    torch.testing.assert_close(load(paths["rgb"]), timm_route(paths["rgb"]), rtol=0, atol=0)
    for name in ("sixteen", "alpha"):
        assert (load(paths[name]) - timm_route(paths[name])).abs().max() > 1
    # predict reads through the same call
    rows = predict(model, [paths["rgb"], paths["alpha"]], top_k=3).rows
    for row, path in zip(rows, (paths["rgb"], paths["alpha"]), strict=True):
        with torch.no_grad():
            expected = probabilities(model(load(path)[None])[0])
        np.testing.assert_allclose(row["probabilities"], expected, atol=1e-6)


def test_predict_reads_a_csv_file_whole_or_skips_it_whole(tmp_path):
    rng = np.random.default_rng(5)
    for split in ("train", "val", "test"):
        rows = [[label, *rng.normal(size=24).round(3)] for label in ("a", "b") * 4]
        write_csv(tmp_path / f"{split}.csv", ["label", *map(str, range(24))], rows)
    model = train(sequence_recipe("series", {"name": "csv", "root": str(tmp_path)}, "classification", "series"),
                  tmp_path / "run")  # fmt: skip
    rows = [["?", *range(24)] for _ in range(40)]
    rows[5][3] = "#REF!"
    query = write_csv(tmp_path / "query.csv", ["label", *map(str, range(24))], rows)
    with pytest.raises(ValueError, match=r"nothing to predict.*query\.csv' line 7, column 4 \('2'\): cannot read"):
        predict(model, [query])
    rows[5][3] = ""
    write_csv(query, ["label", *map(str, range(24))], rows)
    with pytest.raises(ValueError, match=r"line 7, column 4 .*rerun with --set data\.options\.nan=mask"):
        predict(model, [query])
    result = predict(model, [query], options={"nan": "interpolate"})
    assert [row["item"] for row in result.rows] == list(range(1, 41)) and not result.skipped
    with pytest.raises(ValueError, match=r"data\.options\.nan must be one of error, mask, interpolate, got 'drop'"):
        predict(model, [query], options={"nan": "drop"})
    with pytest.raises(ValueError, match=r"data\.options\.window: predict reads series inputs as the run was trained"):
        predict(model, [query], options={"window": 3})


def test_token_ids_are_predicted_per_position_one_line_each(tmp_path, caplog):
    data = {"name": "mqar", "options": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
            "train_samples": 8, "val_samples": 4, "test_samples": 4}  # fmt: skip
    model = train(sequence_recipe("mqar", data, "token_classification", "tokens"), tmp_path / "run")
    query = tmp_path / "query.csv"
    query.write_text("t1,t2,t3\n3,17,5,20\n\n3 17 5\t20 5\r\n")
    (tmp_path / "letters.txt").write_text("1 2 x\n")
    (tmp_path / "large.tok").write_text("1 2\n1 32\n")
    with caplog.at_level("WARNING", logger="zoo.predict"):
        result = predict(model, [query, tmp_path / "letters.txt", tmp_path / "large.tok"])
    assert "read line 1 as a header" in caplog.text and "left out 1 blank line(s)" in caplog.text
    assert [(r["item"], r["position"]) for r in result.rows] == [(2, p) for p in range(1, 5)] + [
        (4, p) for p in range(1, 6)
    ]
    assert dict(result.skipped) == {
        str(tmp_path / "letters.txt"): "line 1: 'x' is not a token id (an integer from 0 to 31)",
        str(tmp_path / "large.tok"): "line 2: token id 32 is outside the run's vocabulary (0 to 31)",
    }
    logits = model(torch.tensor([[3, 17, 5, 20, 5]]), None)[0]
    assert [int(r["label"]) for r in result.rows[4:]] == logits.argmax(-1).tolist()
    assert result.rows[4]["probability"] == pytest.approx(logits[0].softmax(-1).max().item(), abs=1e-5)
