"""Time-series classification: users' .ts and CSV files, and sktime's bundled UCR/UEA sets (forecasting is
``zoo.data.series.forecast``).

Nothing here downloads. ``UCR`` reads the ``.ts`` files that the sktime wheel ships, with this module's own
parser, after checking the name against the bundled list (sktime's loaders silently download unknown names).

Samples: ``values`` float32 ``[N, C]``, ``mask`` bool ``[N]`` (True = keep; False at steps where every channel is
missing), ``label`` int64 ``[]``; series of unequal length are padded by ``zoo.data.collate.PadCollate``.

Every value is read strictly (``zoo.data._tables``): a cell that is not a number is an error naming the file, line
and column, and a missing value (``?`` in .ts files; empty, NA, NaN... in CSV files) inside a series follows the
``nan`` option: ``error`` (default), ``mask`` or ``interpolate``. A series simply shorter than others is not missing
values (a .ts case of fewer values, a CSV row ending early).

``data.<split>_samples`` set in a recipe keeps that many series of a split, drawn from ``data.seed`` and counted in a
warning (``DataContext.subset``); left at the recipe's default, every series is kept.
"""

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..._validate import did_you_mean
from .._registry import DataContext, register_dataset
from .._tables import NanPolicy, apply_nan_policy, parse_cells, read_table
from ..collate import check_split, stratified_split
from .augment import AugmentOptions, SeriesAugment, series_augment

__all__ = [
    "UCR",
    "CsvOptions",
    "CsvSeriesDataset",
    "SeriesDataset",
    "SeriesFileOptions",
    "TsData",
    "TsFileDataset",
    "UCROptions",
    "bundled_ucr_names",
    "read_ts",
]

# fixed seed of the val split carved from UCR training sets, independent of any training seed
_UCR_VAL_SEED = 20181009


class TsData(NamedTuple):
    """Contents of a ``.ts`` file."""

    series: list[np.ndarray]  # one float64 [C, N_i] per case, NaN where missing
    labels: list[str]  # class label (or regression target, as text) of each case; empty without labels
    class_names: tuple[str, ...] | None  # from @classLabel, None for unlabelled or regression files
    header: dict[str, str]  # @key -> value, keys lower case


def _parse_case(line: str, has_label: bool, where: str, nan: str, fix: str) -> tuple[np.ndarray, str | None]:
    """One data line ``d1v1,d1v2,...:d2v1,...[:label]`` -> float64 ``[C, N]`` (dims NaN-padded to the longest)
    and label; missing values (``?``) inside a dim follow ``nan``. ``where``: ``'<file>' line <n>`` for errors."""
    fields = line.split(":")
    label = fields.pop().strip() if has_label else None
    dims = []
    for channel, text in enumerate(fields):
        cells = text.split(",") if text.strip() else []

        def cell(i: int, channel: int = channel) -> str:
            return f"{where}, dimension {channel + 1}, value {i + 1}"

        dims.append(apply_nan_policy(parse_cells(cells, cell), nan, cell, fix=fix))
    if not dims:
        raise ValueError(f"{where}: no values before the label")
    values = np.full((len(dims), max(len(d) for d in dims)), np.nan)
    for channel, dim in enumerate(dims):
        values[channel, : len(dim)] = dim
    return values, label


def read_ts(
    path: str | os.PathLike, *, nan: NanPolicy = "mask", fix: str = "set data.options.nan: mask or interpolate"
) -> TsData:
    """Parse a UCR/UEA ``.ts`` file (sktime's format, without time stamps); missing values (``?``) follow ``nan``
    (``mask``: kept as NaN; ``error``: advising ``fix``, how the caller's user sets the policy).

    Raises:
        FileNotFoundError: naming ``path``; ValueError: a malformed file, with the line (and value) number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f".ts file {str(path)!r} does not exist")
    header, series, labels, in_data = {}, [], [], False
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, raw in enumerate(f, start=1):
            line = raw.strip()
            if not line or line.startswith(("#", "%")):
                continue
            if not in_data:
                key, _, value = line.partition(" ")
                if key.lower() == "@data":
                    in_data = True
                elif key.startswith("@"):
                    header[key[1:].lower()] = value.strip()
                continue
            if header.get("timestamps", "false").lower() == "true":
                raise ValueError(f"{str(path)!r}: time-stamped .ts files are not supported")
            has_label = _flag(header, "classlabel") or _flag(header, "targetlabel")
            values, label = _parse_case(line, has_label, f"{str(path)!r} line {number}", nan, fix)
            series.append(values)
            if label is not None:
                labels.append(label)
    if not in_data:
        raise ValueError(f"{str(path)!r} has no @data line; is it a .ts file?")
    class_names = tuple(header["classlabel"].split()[1:]) if _flag(header, "classlabel") else None
    return TsData(series, labels, class_names, header)


def _flag(header: dict[str, str], key: str) -> bool:
    return header.get(key, "false").split()[:1] == ["true"]


class SeriesDataset(Dataset):
    """Labelled series of possibly unequal length, as sample dicts (see the module doc).

    Args:
        series: one float ``[C, N_i]`` per case (NaN = missing).
        labels: class index per case.
        classes: class names.
        znorm: standardise each channel of each series over its observed steps.
    """

    def __init__(self, series: Sequence[np.ndarray], labels: Sequence[int], classes: Sequence[str], *, znorm=False):
        if len(series) != len(labels):
            raise ValueError(f"{len(series)} series but {len(labels)} labels")
        self.classes, self.znorm = tuple(classes), bool(znorm)
        self.series = [np.asarray(s, dtype=np.float32) for s in series]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.in_chans = self.series[0].shape[0] if self.series else 0
        self.max_length = max((s.shape[1] for s in self.series), default=0)
        # the training split's augmentation (`series_augment`), applied after znorm
        self.augment: SeriesAugment | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def keep(self, rows: Sequence[int] | None) -> "SeriesDataset":
        """Keep only the series `rows` (None: all), e.g. `DataContext.subset`'s; returns self."""
        if rows is not None:
            self.series, self.labels = [self.series[i] for i in rows], self.labels[np.asarray(rows, dtype=np.int64)]
            self.max_length = max((s.shape[1] for s in self.series), default=0)
        return self

    def __len__(self) -> int:
        return len(self.series)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        values = self.series[index].T  # [N, C]
        observed = np.isfinite(values)
        if self.znorm:
            mean = np.nanmean(np.where(observed, values, np.nan), axis=0)
            std = np.nanstd(np.where(observed, values, np.nan), axis=0)
            values = (values - mean) / np.where(std > 0, std, 1.0)
        if self.augment is not None:
            values, observed = self.augment(values, observed)
        values = np.where(observed, values, 0.0).astype(np.float32)
        return {
            "values": torch.from_numpy(values),
            "mask": torch.from_numpy(observed.any(axis=1)),
            "label": torch.tensor(self.labels[index]),
        }


def _label_indices(labels: Sequence[str], classes: Sequence[str], source: str) -> list[int]:
    index = {name: i for i, name in enumerate(classes)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise ValueError(f"labels {unknown[:5]} of {source} are not among the classes {list(classes)}")
    return [index[label] for label in labels]


class TsFileDataset(SeriesDataset):
    """A users' ``.ts`` classification file; classes from its @classLabel line unless ``classes`` is given;
    missing values (``?``) follow ``nan`` (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        classes: Sequence[str] | None = None,
        znorm: bool = False,
        nan: NanPolicy = "error",
    ):
        data = read_ts(path, nan=nan)
        classes = tuple(classes) if classes is not None else data.class_names
        if classes is None:
            raise ValueError(
                f"{str(path)!r} declares no class labels (@classLabel true ...); it is not a classification set"
            )
        super().__init__(data.series, _label_indices(data.labels, classes, repr(str(path))), classes, znorm=znorm)


class CsvSeriesDataset(SeriesDataset):
    """Univariate series in a CSV file with a header: one series per row, a label column, the rest time steps.

    A row may end early (empty cells at its end, or fewer cells): a shorter series. A missing value inside a row
    (empty, NA, NaN, ...) follows ``nan`` (see the module docstring); a cell that is not a number is an error naming
    its line and column. Classes are the sorted labels of the file unless ``classes`` is given (pass the training
    classes when reading a test file).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        label_column: str = "label",
        classes: Sequence[str] | None = None,
        znorm: bool = False,
        nan: NanPolicy = "error",
    ):
        table = read_table(path, ragged=True)
        at = table.column(label_column, "label column")
        labels, series = [], []
        for row, cells in enumerate(table.rows):
            label = cells[at].strip() if at < len(cells) else ""
            if not label:
                raise ValueError(f"{table.where(row, at)}: the label is empty")
            labels.append(label)
            steps = [i for i in range(len(cells)) if i != at]
            while steps and not cells[steps[-1]].strip():
                steps.pop()
            if not steps:
                raise ValueError(f"{table.path!r} line {table.lines[row]}: the row holds a label but no values")

            def where(i: int, row: int = row, steps: list[int] = steps) -> str:
                return table.where(row, steps[i])

            values = parse_cells([cells[i] for i in steps], where)
            series.append(apply_nan_policy(values, nan, where)[None, :])
        classes = tuple(classes) if classes is not None else tuple(sorted(set(labels)))
        super().__init__(series, _label_indices(labels, classes, repr(table.path)), classes, znorm=znorm)


def _sktime_data_dir() -> Path:
    """Folder of the data files bundled with sktime, found without importing sktime."""
    spec = importlib.util.find_spec("sktime")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the UCR/UEA sets are the ones bundled with sktime: `pip install sktime`")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"


def _declares_classes(path: Path) -> bool:
    """Whether the header of a .ts file says ``@classLabel true`` (read up to ``@data`` only)."""
    header = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            key, _, value = raw.strip().partition(" ")
            if key.lower() == "@data":
                break
            header[key[1:].lower()] = value
    return _flag(header, "classlabel")


@lru_cache(maxsize=1)
def bundled_ucr_names() -> tuple[str, ...]:
    """Classification sets whose TRAIN and TEST .ts files ship with sktime: ACSF1, ArrowHead, BasicMotions,
    GunPoint, ItalyPowerDemand, JapaneseVowels, OSULeaf, PLAID, UnitTest (a cut of ChinaTown)."""
    folder = _sktime_data_dir()
    names = []
    for path in sorted(folder.iterdir()):
        train, test = path / f"{path.name}_TRAIN.ts", path / f"{path.name}_TEST.ts"
        if train.is_file() and test.is_file() and _declares_classes(train):
            names.append(path.name)
    return tuple(names)


class UCR(SeriesDataset):
    """A UCR/UEA classification set bundled with sktime, by name (see ``bundled_ucr_names``).

    Splits: test is the archive's TEST file; val is ``val_fraction`` of the TRAIN file, stratified, from a
    fixed seed; train the rest of TRAIN. Unequal lengths (PLAID, JapaneseVowels) are padded and masked.
    """

    def __init__(
        self, name: str, split: str, *, val_fraction: float = 0.2, znorm: bool = False, nan: NanPolicy = "error"
    ):
        names = bundled_ucr_names()
        if name not in names:
            raise ValueError(
                f"UCR/UEA set {name!r} is not a classification set bundled with sktime{did_you_mean(name, names)}; "
                f"bundled: {', '.join(names)}"
            )
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
        self.name, self.split = name, check_split(split)
        file_split = "TEST" if split == "test" else "TRAIN"
        data = read_ts(_sktime_data_dir() / name / f"{name}_{file_split}.ts", nan=nan)
        labels = np.array(_label_indices(data.labels, data.class_names, name))
        rows = np.arange(len(labels))
        if split != "test":
            val = stratified_split(labels, "val", (1.0 - val_fraction, val_fraction, 0.0), _UCR_VAL_SEED)
            rows = val if split == "val" else np.setdiff1d(rows, val)
        super().__init__([data.series[i] for i in rows], labels[rows], data.class_names, znorm=znorm)
        self.rows = rows

    def keep(self, rows: Sequence[int] | None) -> "UCR":
        """As ``SeriesDataset.keep``; ``rows`` (the archive file's rows of this split) kept alike."""
        if rows is not None:
            self.rows = self.rows[np.asarray(rows, dtype=np.int64)]
        return super().keep(rows)


def _split_file(root: str, split: str, suffix: str) -> Path:
    return Path(root) / f"{split}{suffix}"


@dataclass(kw_only=True)
class UCROptions(AugmentOptions):
    """``data.options`` of ucr (see ``UCR``)."""

    # a set bundled with sktime, e.g. ACSF1, PLAID (zoo.data.series.classification.bundled_ucr_names)
    ucr_name: str
    val_fraction: float = field(default=0.2, metadata={"min": 0, "max": 1, "max_exclusive": True})
    # standardise each channel of each series over its observed steps
    znorm: bool = False
    # missing values: error (the first one named), mask (masked out) or interpolate (linear, along time)
    nan: NanPolicy = "error"


@register_dataset("ucr", options=UCROptions, kind="series", tasks=("classification",))
def build_ucr(options: UCROptions, context: DataContext) -> UCR:
    """A UCR/UEA classification set bundled with sktime, by data.options.ucr_name."""
    dataset = UCR(
        options.ucr_name, context.split, val_fraction=options.val_fraction, znorm=options.znorm, nan=options.nan
    )
    return _finish(dataset, options, context, f"series of UCR {options.ucr_name} {context.split}")


@dataclass(kw_only=True)
class SeriesFileOptions(AugmentOptions):
    """``data.options`` of ts."""

    znorm: bool = False
    # missing values (?): error (the first one named), mask (masked out) or interpolate (linear, along time)
    nan: NanPolicy = "error"


@register_dataset("ts", options=SeriesFileOptions, kind="series", tasks=("classification",), root="required")
def build_ts(options: SeriesFileOptions, context: DataContext) -> TsFileDataset:
    """Your .ts files data.root/<split>.ts, classes indexed from train.ts."""
    # classes from the training file, so that every split indexes them alike
    classes = read_ts(_split_file(context.root, "train", ".ts")).class_names
    path = _split_file(context.root, context.split, ".ts")
    dataset = TsFileDataset(path, classes=classes, znorm=options.znorm, nan=options.nan)
    return _finish(dataset, options, context, f"series of {str(path)!r}")


@dataclass(kw_only=True)
class CsvOptions(AugmentOptions):
    """``data.options`` of csv (see ``CsvSeriesDataset``)."""

    label_column: str = "label"
    znorm: bool = False
    # missing values inside a row: error (the first one named), mask (masked out) or interpolate (linear)
    nan: NanPolicy = "error"


@register_dataset("csv", options=CsvOptions, kind="series", tasks=("classification",), root="required")
def build_csv(options: CsvOptions, context: DataContext) -> CsvSeriesDataset:
    """Your CSV files data.root/<split>.csv, one series per row, classes indexed from train.csv."""
    train = _split_file(context.root, "train", ".csv")
    classes = CsvSeriesDataset(train, label_column=options.label_column, nan=options.nan).classes
    path = _split_file(context.root, context.split, ".csv")
    dataset = CsvSeriesDataset(
        path, label_column=options.label_column, classes=classes, znorm=options.znorm, nan=options.nan
    )
    return _finish(dataset, options, context, f"series of {str(path)!r}")


def _finish(dataset: SeriesDataset, options: AugmentOptions, context: DataContext, what: str) -> SeriesDataset:
    """The series a recipe keeps (`DataContext.subset`) and the training split's augmentation."""
    dataset.augment = series_augment(options, context.is_training, context.seed)
    return dataset.keep(context.subset(len(dataset), what))
