"""Users' own files, read strictly: each class of malformed input, generated small, fails with one line that names
the file and where in it (or is read correctly: 16-bit, palette, alpha, CMYK and GIF images; IUPAC codes)."""

import gzip
import logging

import numpy as np
import pytest
import torch
import yaml
from helpers import reset_accelerate, tiny_sequence_model
from PIL import Image

from zoo.config import load_recipe
from zoo.data import DataContext, build_dataset
from zoo.data.dna.fasta import FastaDataset, GenomicBenchmarksDataset
from zoo.data.dna.nucleotides import read_fasta
from zoo.data.images.folder import BadImageError, ImageFolderDataset
from zoo.data.series.classification import CsvSeriesDataset, TsFileDataset
from zoo.data.series.forecast import ForecastWindows
from zoo.train.loop import Trainer

pytestmark = pytest.mark.usefixtures("no_network")


# --------------------------------------------------------------------------------------------- forecast CSV
def forecast_csv(tmp_path, cell_at=None, cell="", name="load.csv", steps=200):
    """`date,load,temp` over `steps` rows; `cell_at=(row, column)` replaces one cell (row 0 is file line 2)."""
    rows = [[f"2024-01-{i:04d}", f"{np.sin(i / 5):.4f}", f"{i % 7}"] for i in range(steps)]
    if cell_at is not None:
        rows[cell_at[0]][cell_at[1]] = cell
    path = tmp_path / name
    path.write_text("date,load,temp\n" + "\n".join(",".join(row) for row in rows) + "\n")
    return path


def windows(path, split="train", **options):
    return ForecastWindows.from_csv(path, split, lookback=16, horizon=4, targets=["load"], **options)


@pytest.mark.parametrize(
    "cell, column, expected",
    [
        ("n/a", 1, r"line 12, column 2 \('load'\): missing value \(1 in this series\); set data.options.nan"),
        ("", 1, r"line 12, column 2 \('load'\): missing value"),
        ("NaN", 2, r"line 12, column 3 \('temp'\): missing value"),
        ("#REF!", 1, r"line 12, column 2 \('load'\): cannot read '#REF!' as a number"),
        ("12,5", 2, r"line 12 has 4 cells, the header 3"),
        ("inf", 2, r"line 12, column 3 \('temp'\): cannot read 'inf' as a number"),
    ],
    ids=["na", "empty", "nan", "ref", "comma", "inf"],
)
def test_a_bad_forecast_cell_is_named_by_file_line_and_column(tmp_path, cell, column, expected):
    path = forecast_csv(tmp_path, (10, column), cell if cell != "12,5" else "12,5")
    with pytest.raises(ValueError, match=expected) as info:
        windows(path)
    assert "load.csv" in str(info.value) and "\n" not in str(info.value)


def test_a_target_column_with_a_bad_cell_is_reported_as_such_not_as_absent(tmp_path):
    path = forecast_csv(tmp_path, (3, 1), "#REF!")
    with pytest.raises(ValueError, match=r"line 5, column 2 \('load'\): cannot read '#REF!'"):
        windows(path)
    with pytest.raises(ValueError, match=r"targets column 'lod' is not a column of .*did you mean 'load'"):
        ForecastWindows.from_csv(path, "train", lookback=16, horizon=4, targets=["lod"])
    with pytest.raises(ValueError, match=r"targets column 'date' holds no numbers: .* line 2, column 1"):
        ForecastWindows.from_csv(path, "train", lookback=16, horizon=4, targets=["date"])


def test_text_columns_are_left_out_and_a_column_the_recipe_leaves_out_is_not_read(tmp_path, caplog):
    path = forecast_csv(tmp_path, (10, 2), "#REF!")
    assert windows(path, inputs=["load"]).columns == ("load",)
    with caplog.at_level(logging.INFO):
        dataset = windows(forecast_csv(tmp_path, name="clean.csv"))
    assert dataset.columns == ("load", "temp") and "left out the columns of text 'date'" in caplog.text


def test_forecast_nan_policies(tmp_path):
    path = forecast_csv(tmp_path, (20, 1), "NA")
    interpolated = windows(path, nan="interpolate")
    clean = windows(forecast_csv(tmp_path, name="clean.csv"))
    assert len(interpolated) == len(clean)
    # row 20 is half way between its neighbours
    raw = interpolated.scaled[:, 0] * interpolated.std[0] + interpolated.mean[0]
    assert raw[20] == pytest.approx((np.sin(19 / 5) + np.sin(21 / 5)) / 2, abs=1e-3)
    masked = windows(path, nan="mask")
    # windows whose horizon holds step 20 are left out (4 of them); those whose look-back holds it mask it
    assert len(masked) == len(clean) - 4
    assert masked.starts[:2].tolist() == [0, 5]
    sample = masked[1]
    assert not sample["mask"][15] and sample["mask"].sum() == 15 and torch.isfinite(sample["values"]).all()
    assert all(torch.isfinite(masked[i]["target"]).all() for i in range(len(masked)))


def test_a_file_that_is_not_utf8_csv(tmp_path):
    path = tmp_path / "load.csv"
    path.write_bytes(b"date,load\n\xff\xfe,1\n")
    with pytest.raises(ValueError, match=r"load.csv' is not UTF-8 text \(byte 0xff"):
        windows(path)


# --------------------------------------------------------------------------------------- series CSV and .ts
def test_series_csv_cells(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("label,t0,t1,t2,t3\na,1,2,3,4\nb,5,abc,7,8\n")
    with pytest.raises(ValueError, match=r"train.csv' line 3, column 3 \('t1'\): cannot read 'abc' as a number"):
        CsvSeriesDataset(path)
    path.write_text("label,t0,t1,t2,t3\na,1,2,3,4\nb,5,,7,8\nb,1,2\n")
    with pytest.raises(ValueError, match=r"line 3, column 3 \('t1'\): missing value.*data.options.nan"):
        CsvSeriesDataset(path)
    masked = CsvSeriesDataset(path, nan="mask")
    assert masked[1]["mask"].tolist() == [True, False, True, True] and masked[2]["values"].shape == (2, 1)
    filled = CsvSeriesDataset(path, nan="interpolate")
    assert filled[1]["values"][:, 0].tolist() == [5, 6, 7, 8] and filled[1]["mask"].all()
    path.write_text("label,t0,t1\na,1,2\n,3,4\n")
    with pytest.raises(ValueError, match=r"line 3, column 1 \('label'\): the label is empty"):
        CsvSeriesDataset(path)


def test_ts_missing_and_bad_values(tmp_path):
    head = "@problemName t\n@missing true\n@univariate true\n@classLabel true a b\n@data\n"
    path = tmp_path / "train.ts"
    path.write_text(head + "1,2,3:a\n4,?,6:b\n")
    with pytest.raises(ValueError, match=r"train.ts' line 7, dimension 1, value 2: missing value"):
        TsFileDataset(path)
    assert TsFileDataset(path, nan="interpolate")[1]["values"][:, 0].tolist() == [4, 5, 6]
    path.write_text(head + "1,2,3:a\n4,x5,6:b\n")
    with pytest.raises(ValueError, match=r"line 7, dimension 1, value 2: cannot read 'x5' as a number"):
        TsFileDataset(path, nan="mask")


def test_the_nan_option_is_checked_by_the_recipe(tmp_path):
    recipe = {"name": "x", "task": "forecast", "model": {"kind": "sequence", "sequence": {"input": "series"}}}
    recipe["data"] = {"name": "forecast_csv", "root": "x.csv", "options": {"targets": ["a"], "nan": "drop"}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(ValueError, match=r"data.options.nan: expected one of 'error', 'mask', 'interpolate'"):
        load_recipe(tmp_path / "x.yaml")


# ------------------------------------------------------------------------------------------------------- DNA
def fasta(tmp_path, text, name="dna.fa", folder="train"):
    path = tmp_path / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_iupac_codes_lowercase_rna_and_gaps_are_nucleotides(tmp_path):
    path = fasta(tmp_path, ">one\nACGTN\nacgtn\n>two rna, gapped\nAC-GU.NRY\n")
    records = read_fasta(path)
    assert [h for h, _ in records] == ["one", "two rna, gapped"]
    # A=0 C=1 G=2 T=3 other=4; U is T, gaps dropped, ambiguity codes are N
    assert records[0][1].tolist() == [0, 1, 2, 3, 4] * 2 and records[1][1].tolist() == [0, 1, 2, 3, 4, 4, 4]


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            ">sp|P69905|HBA_HUMAN\nMVLSPADKTNVKAAWGKVGAHAGEYGAEALERMFLSFPTTKTYFPHF\n",
            r"'L' at position 3 is not a nucleotide",
        ),
        (b">junk\n\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", r"'\\x89' at position 1 is not a nucleotide"),
        (">pep\nMKWVHHSRDK\n", r"record 2 \('>pep'\): 10 of its 10 letters are ambiguity codes"),
        (">ok\nACGT\n>amb\nRYKMSWRYKMACG\n", r"record 2 \('>amb'\): 10 of its 13 letters are ambiguity codes"),
    ],
    ids=["protein", "binary", "short-protein", "mostly-ambiguous"],
)
def test_what_is_not_dna_is_an_error_naming_file_and_record(tmp_path, text, expected):
    fasta(tmp_path, ">good\nACGTACGT\n" + text if isinstance(text, str) and "amb" not in text else text)
    with pytest.raises(ValueError, match=expected) as info:
        FastaDataset(tmp_path, "train", window=4)
    assert "dna.fa' record" in str(info.value) and "\n" not in str(info.value)


def test_a_truncated_fasta_gz_is_one_line_naming_the_file(tmp_path):
    whole = gzip.compress(b">r\n" + b"ACGT" * 5000 + b"\n")
    path = fasta(tmp_path, whole[: len(whole) // 2], name="dna.fa.gz")
    with pytest.raises(ValueError, match=r"dna\.fa\.gz': gzip file truncated"):
        FastaDataset(tmp_path, "train", window=4)
    path.write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    with pytest.raises(ValueError, match=r"dna\.fa\.gz': gzip file corrupt"):
        FastaDataset(tmp_path, "train", window=4)


def test_genomic_benchmarks_files_are_checked_too(tmp_path):
    for split in ("train", "test"):
        folder = tmp_path / split / "a"
        folder.mkdir(parents=True)
        (folder / "1.txt").write_text("ACGTNacgt\n")
    (tmp_path / "test" / "a" / "2.txt").write_text("MEEPQSDPSV\n")
    assert len(GenomicBenchmarksDataset(tmp_path, "train")) == 1
    with pytest.raises(ValueError, match=r"2\.txt': 'E' at position 2 is not a nucleotide"):
        GenomicBenchmarksDataset(tmp_path, "test")


# ---------------------------------------------------------------------------------------------------- images
@pytest.fixture
def images(tmp_path):
    """train/a: an 8-bit RGB PNG, a 16-bit grey PNG, a palette GIF, an RGBA PNG, a CMYK JPEG; train/b: two PNGs
    and a notes.txt; one of b's PNGs truncated."""
    rng = np.random.default_rng(0)
    a, b = tmp_path / "train" / "a", tmp_path / "train" / "b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(a / "rgb.png")
    Image.fromarray(np.full((20, 20), 20000, dtype=np.uint16)).save(a / "deep.png")
    Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).convert("P").save(a / "anim.gif")
    Image.fromarray(rng.integers(0, 256, (20, 20, 4), dtype=np.uint8)).save(a / "alpha.png")
    Image.new("CMYK", (20, 20), (10, 20, 30, 0)).save(a / "print.jpg")
    for name in ("ok.png", "cut.png"):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(b / name)
    (b / "cut.png").write_bytes((b / "cut.png").read_bytes()[:300])
    (b / "notes.txt").write_text("not an image")
    return tmp_path


def test_every_format_pil_reads_is_listed_and_other_files_are_counted(images, caplog):
    dataset = ImageFolderDataset(images, "train", img_size=16, is_training=False, in_chans=1, mean=[0], std=[1])
    names = sorted(path.rsplit("/", 1)[1] for path, _ in dataset.samples)
    assert names == ["alpha.png", "anim.gif", "cut.png", "deep.png", "ok.png", "print.jpg", "rgb.png"]
    assert "left out 1 files that are not images (1 .txt)" in caplog.text
    deep = {path.rsplit("/", 1)[1]: i for i, (path, _) in enumerate(dataset.samples)}["deep.png"]
    # a 16-bit grey of 20000 is 20000 / 65535 of white, not white
    assert float(dataset[deep][0].mean()) == pytest.approx(20000 / 65535, abs=0.01)


def test_a_truncated_image_is_named_by_path_never_replaced(images):
    dataset = ImageFolderDataset(images, "train", img_size=16, is_training=False)
    cut = next(i for i, (path, _) in enumerate(dataset.samples) if path.endswith("cut.png"))
    with pytest.raises(BadImageError, match=r"cut\.png: .*on_bad_image: skip") as info:
        dataset[cut]
    assert "\n" not in str(info.value)
    assert all(dataset[i][0].shape == (3, 16, 16) for i in range(len(dataset)) if i != cut)


def test_on_bad_image_skip_leaves_unreadable_images_out_with_a_count(images, caplog):
    context = DataContext("train", is_training=False, root=str(images), img_size=16)
    dataset = build_dataset("folder", context, on_bad_image="skip")
    assert len(dataset) == 6 and not any(path.endswith("cut.png") for path, _ in dataset.samples)
    assert "left out 1 unreadable image(s) of 7 (on_bad_image: skip), e.g." in caplog.text
    assert "cut.png" in caplog.text


# ------------------------------------------------------------------------------------------------ split sizes
def test_a_split_without_samples_says_so(tmp_path):
    fasta(tmp_path, ">short\nACGT\n")
    with pytest.raises(ValueError, match=r"dataset 'fasta' at .* has no samples in its 'train' split"):
        build_dataset("fasta", DataContext("train", is_training=True, root=str(tmp_path)), window=8, min_length=8)


def test_fewer_training_samples_than_a_batch_says_so(tmp_path):
    for split in ("train", "val"):
        (tmp_path / f"{split}.csv").write_text("label,t0,t1,t2\na,1,2,3\nb,4,5,6\na,7,8,9\n")
    recipe = {
        "name": "few",
        "model": tiny_sequence_model(sequence={"input": "series", "patch_len": 2, "patch_stride": 1}),
        "data": {"name": "csv", "root": str(tmp_path), "batch_size": 8, "num_workers": 0},
    }
    (tmp_path / "few.yaml").write_text(yaml.safe_dump(recipe))
    reset_accelerate()
    with pytest.raises(ValueError, match=r"'csv' has 3 training samples, .*lower data.batch_size to at most 3"):
        Trainer(load_recipe(tmp_path / "few.yaml"), tmp_path / "run")
