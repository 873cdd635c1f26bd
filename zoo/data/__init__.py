"""Datasets that load with no network: images (MegaMNIST, users' folders), DNA and time series.

Image datasets give ``(image [C, H, W] float32, label int)``; the 1-D ones give dict samples (``tokens`` or
``values``, ``mask``, and ``label`` / ``labels`` / ``target``, see ``zoo.data.sequence``) that ``PadCollate``
batches. ``build_dataset`` builds any of them by name; ``DATASET_DOMAINS`` and ``DATASET_TASKS`` say what each
holds and which tasks it serves.
"""

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from .dna import (
    DNATokenizer,
    FastaDataset,
    Genomes,
    GenomicBenchmarksDataset,
    ReverseComplement,
    Splice,
    YeastCoding,
    gc_nearest_mean_accuracy,
)
from .folder import ImageFolderDataset
from .megamnist import MegaMNIST
from .sequence import IGNORE_INDEX, PadCollate
from .timeseries import (
    UCR,
    CsvSeriesDataset,
    Elecdemand,
    ForecastWindows,
    TsFileDataset,
    bundled_ucr_names,
    linear_forecast_scores,
    read_ts,
    seasonal_naive_scores,
)

__all__ = [
    "DATASETS",
    "DATASET_DOMAINS",
    "DATASET_TASKS",
    "IGNORE_INDEX",
    "UCR",
    "CsvSeriesDataset",
    "DNATokenizer",
    "Elecdemand",
    "FastaDataset",
    "ForecastWindows",
    "Genomes",
    "GenomicBenchmarksDataset",
    "ImageFolderDataset",
    "MegaMNIST",
    "PadCollate",
    "ReverseComplement",
    "Splice",
    "TsFileDataset",
    "YeastCoding",
    "build_dataset",
    "bundled_ucr_names",
    "dataset_options",
    "gc_nearest_mean_accuracy",
    "linear_forecast_scores",
    "seasonal_naive_scores",
]

_CLASSIFY_DNA = ("classification", "causal_lm")
# name -> (what a sample holds, the tasks it serves); a DNA set serves causal_lm too, its tokens being the targets
_CATALOGUE = {
    "megamnist": ("image", ("classification",)),
    "folder": ("image", ("classification",)),
    "genomes": ("dna", _CLASSIFY_DNA),
    "yeast_coding": ("dna", ("token_classification", "causal_lm")),
    "splice": ("dna", _CLASSIFY_DNA),
    "fasta": ("dna", _CLASSIFY_DNA),
    "genomic_benchmarks": ("dna", _CLASSIFY_DNA),
    "ucr": ("series", ("classification",)),
    "ts": ("series", ("classification",)),
    "csv": ("series", ("classification",)),
    "elecdemand": ("series", ("forecast",)),
    "forecast_csv": ("series", ("forecast",)),
}
DATASETS = tuple(_CATALOGUE)
DATASET_DOMAINS = {name: domain for name, (domain, _) in _CATALOGUE.items()}
DATASET_TASKS = {name: tasks for name, (_, tasks) in _CATALOGUE.items()}


def _split_file(root: str, split: str, suffix: str) -> Path:
    return Path(root) / f"{split}{suffix}"


def _ts(split: str, *, root: str, znorm: bool = False) -> Dataset:
    # classes from the training file, so that every split indexes them alike
    classes = read_ts(_split_file(root, "train", ".ts")).class_names
    return TsFileDataset(_split_file(root, split, ".ts"), classes=classes, znorm=znorm)


def _csv(split: str, *, root: str, label_column: str = "label", znorm: bool = False) -> Dataset:
    classes = CsvSeriesDataset(_split_file(root, "train", ".csv"), label_column=label_column).classes
    return CsvSeriesDataset(_split_file(root, split, ".csv"), label_column=label_column, classes=classes, znorm=znorm)


# name -> (builder taking split and options, allowed options, required options)
_BUILDERS: dict[str, tuple[Callable[..., Dataset], tuple[str, ...], tuple[str, ...]]] = {
    "megamnist": (
        lambda split, **o: MegaMNIST(split, **o),
        ("canvas_size", "num_samples", "num_target", "num_other", "num_clutter", "digit_size", "seed",
         "pool_fractions"),
        (),
    ),
    "folder": (None, ("root", "img_size", "in_chans", "mean", "std"), ("root", "img_size")),
    "genomes": (Genomes, ("window", "num_windows", "rc_prob", "seed", "root"), ()),
    "yeast_coding": (YeastCoding, ("window", "stride", "rc_prob", "seed", "root"), ()),
    "splice": (Splice, ("root",), ()),
    "fasta": (
        lambda split, root, **o: FastaDataset(root, split, **o),
        ("root", "window", "stride", "min_length", "rc_prob", "seed"),
        ("root", "window"),
    ),
    "genomic_benchmarks": (
        lambda split, root, **o: GenomicBenchmarksDataset(root, split, **o),
        ("root", "max_length", "rc_prob", "seed"),
        ("root",),
    ),
    "ucr": (
        lambda split, ucr_name, **o: UCR(ucr_name, split, **o), ("ucr_name", "val_fraction", "znorm"), ("ucr_name",)
    ),
    "ts": (_ts, ("root", "znorm"), ("root",)),
    "csv": (_csv, ("root", "label_column", "znorm"), ("root",)),
    "elecdemand": (Elecdemand, ("lookback", "horizon", "targets", "inputs"), ()),
    "forecast_csv": (
        lambda split, root, **o: ForecastWindows.from_csv(root, split, **o),
        ("root", "lookback", "horizon", "targets", "inputs"),
        ("root", "targets"),
    ),
}


def dataset_options(name: str) -> tuple[str, ...]:
    """The keyword options that ``build_dataset`` takes for dataset ``name``."""
    return _BUILDERS[name][1]


def build_dataset(name: str, split: str, *, is_training: bool, **options: Any) -> Dataset:
    """The dataset ``name`` for ``split``, built from ``options``.

    Args:
        name: one of ``DATASETS``.
        split: ``train``, ``val`` or ``test`` (for folder: the split folder's name). ts and csv read
            ``root/<split>.ts`` / ``root/<split>.csv``, their classes indexed from the train file.
        is_training: training augmentation: folder's transforms; reverse complement (``rc_prob``) of the DNA
            sets is dropped when False. MegaMNIST canvases and genome windows are fixed by (seed, split, index).
        options: the constructor's keyword options: megamnist ``MegaMNIST``; folder ``ImageFolderDataset``
            (root, img_size required); genomes ``Genomes``; yeast_coding ``YeastCoding``; splice ``Splice``;
            fasta ``FastaDataset`` (root, window required); genomic_benchmarks ``GenomicBenchmarksDataset``;
            ucr ``UCR`` (ucr_name required); ts ``TsFileDataset`` and csv ``CsvSeriesDataset`` (root, a folder);
            elecdemand ``Elecdemand``; forecast_csv ``ForecastWindows.from_csv`` (root, the CSV file; targets).

    Returns:
        a map-style dataset: ``(image, label)`` pairs for images, dict samples for the 1-D sets.
    """
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown dataset {name!r}{hint} (known: {', '.join(DATASETS)})")
    builder, allowed, required = _BUILDERS[name]
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown option {key!r} for dataset {name!r}{hint} (allowed: {', '.join(allowed)})")
    missing = [key for key in required if key not in options]
    if missing:
        raise ValueError(f"dataset {name!r} needs the option(s) {', '.join(missing)}")
    if name == "folder":
        return ImageFolderDataset(split=split, is_training=is_training, **options)
    if not is_training:
        options.pop("rc_prob", None)
    return builder(split, **options)
