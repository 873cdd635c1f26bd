"""Builders of users' files for the odd-input tests: a small valid set of each kind (image folder, FASTA tree, CSV
splits, forecast CSV), made in a test's tmp_path, that a case then spoils in one way."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
from PIL import Image

IMG_SIZE = 16


def image_tree(root: Path, *, per_class: int = 4, classes: tuple[str, ...] = ("cat", "dog")) -> Path:
    """`root/<split>/<class>/<k>.png`: `per_class` 8-bit RGB images of 12 x 10 pixels per class and split."""
    rng = np.random.default_rng(0)
    for split in ("train", "val", "test"):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(per_class):
                Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    return root


def write_fasta(path: Path, records: dict[str, str], *, compress: bool = False) -> Path:
    """A FASTA file of `records` (header -> sequence), gzipped when `compress`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f">{name}\n{sequence}\n" for name, sequence in records.items()).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


def fasta_tree(root: Path) -> Path:
    """`root/<split>/{at_rich,gc_rich}.fa`, three records of 40 nucleotides each."""
    rng = np.random.default_rng(1)
    for split in ("train", "val", "test"):
        for name, letters in (("at_rich", "AAAT"), ("gc_rich", "GGCC")):
            records = {f"{name}{i}": "".join(rng.choice(list(letters), 40)) for i in range(3)}
            write_fasta(root / split / f"{name}.fa", records)
    return root


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def series_rows(count: int = 8, length: int = 24, seed: int = 2) -> list[list]:
    """Labelled rows `label, t0, t1, ...`: `up` series rise, `flat` ones do not."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, length)
    return [
        [label, *(rng.normal(size=length) + 3 * (label == "up") * ramp).round(3)]
        for label in ("up", "flat") * (count // 2)
    ]


def csv_splits(root: Path, length: int = 24) -> Path:
    """`root/{train,val,test}.csv`: series classification files, one series per row."""
    for number, split in enumerate(("train", "val", "test")):
        rows = series_rows(length=length, seed=number)
        write_csv(root / f"{split}.csv", ["label", *(f"t{i}" for i in range(length))], rows)
    return root


def forecast_rows(steps: int = 200) -> list[list]:
    """`time, demand, temperature` rows of a daily cycle of 24 steps."""
    t = np.arange(steps)
    demand = 50 + 10 * np.sin(t * 2 * np.pi / 24)
    temperature = 20 + 5 * np.cos(t * 2 * np.pi / 24)
    return [[f"t{i}", round(d, 4), round(c, 4)] for i, d, c in zip(t, demand, temperature, strict=True)]


def forecast_file(path: Path, steps: int = 200) -> Path:
    return write_csv(path, ["time", "demand", "temperature"], forecast_rows(steps))


def genomic_benchmarks_tree(root: Path) -> Path:
    """`root/<split>/<class>/<k>.txt`, one sequence per file, two classes of three files per split."""
    rng = np.random.default_rng(3)
    for split in ("train", "test"):
        for name, letters in (("at_rich", "AAAT"), ("gc_rich", "GGCC")):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for k in range(3):
                (root / split / name / f"{k}.txt").write_text("".join(rng.choice(list(letters), 30)) + "\n")
    return root


def ts_splits(root: Path, count: int = 6) -> Path:
    """`root/{train,val,test}.ts`: UCR-format series classification files of `count` cases of 20 steps."""
    rng = np.random.default_rng(4)
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        lines = ["@problemName odd", "@timeStamps false", "@univariate true", "@classLabel true up flat", "@data"]
        for label in ("up", "flat") * (count // 2):
            values = rng.normal(size=20) + 3 * (label == "up") * np.linspace(0, 1, 20)
            lines.append(",".join(f"{v:.3f}" for v in values) + f":{label}")
        (root / f"{split}.ts").write_text("\n".join(lines) + "\n")
    return root


def write_mask(path: Path, classes: np.ndarray, *, palette: bool = True) -> Path:
    """`classes` `[h, w]` (uint8) as a palette PNG (its indices are the classes) or a grey one (its values)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mask = Image.fromarray(classes.astype(np.uint8), "L")
    if palette:
        # putpalette turns the grey image into a palette image holding the same indices
        mask.putpalette([channel for k in range(256) for channel in (k * 37 % 256, k * 91 % 256, k * 53 % 256)])
    mask.save(path)
    return path


def mask_tree(root: Path, *, per_split: int = 4, num_classes: int = 3) -> Path:
    """`root/<split>/images/<k>.png` (8-bit RGB, 12 x 10 pixels) and `root/<split>/masks/<k>.png` (palette masks of
    `num_classes` classes, the same size), `per_split` pairs per split."""
    rng = np.random.default_rng(5)
    for split in ("train", "val", "test"):
        for k in range(per_split):
            image = root / split / "images" / f"{k}.png"
            image.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(image)
            write_mask(root / split / "masks" / f"{k}.png", rng.integers(0, num_classes, (10, 12)))
    return root
