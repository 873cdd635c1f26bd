"""Users' tables read strictly: CSV cells become numbers or an error naming the file, line and column, and missing
values follow an explicit policy.

A cell is a number (`3`, `-1.5e3`), a missing value (empty, `NA`, `N/A`, `#N/A`, `NaN`, `null`, `None`, `?`, any
case), or a mistake (`#REF!`, `12,5`, `inf`, a date in a column of numbers): a mistake is always an error. What a
missing value does is the dataset's `nan` option (`NAN_POLICIES`):

- `error` (the default): the first missing value is an error naming its cell;
- `mask`: it is kept as NaN and masked out (`mask` False) where the model reads it;
- `interpolate`: filled along time by linear interpolation between its neighbours (the nearest value at either
  end of a series).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from .._validate import did_you_mean

__all__ = [
    "MISSING_CELLS",
    "NAN_POLICIES",
    "NanPolicy",
    "Table",
    "apply_nan_policy",
    "parse_cells",
    "read_table",
]

NAN_POLICIES = ("error", "mask", "interpolate")
NanPolicy = Literal["error", "mask", "interpolate"]
# cells that mean "no value here", compared in lower case
MISSING_CELLS = frozenset({"", "na", "n/a", "#n/a", "nan", "null", "none", "?"})
_MISSING_HELP = "empty, NA, N/A, #N/A, NaN, null, None or ?"


class Table(NamedTuple):
    """A CSV file: its header, its non-blank rows and the file line of each row (for errors)."""

    path: str
    header: list[str]
    rows: list[list[str]]
    lines: list[int]

    def where(self, row: int, column: int) -> str:
        """`'<path>' line 7, column 3 ('Demand')`."""
        name = self.header[column] if column < len(self.header) else f"#{column + 1}"
        return f"{self.path!r} line {self.lines[row]}, column {column + 1} ({name!r})"

    def column(self, name: str, what: str) -> int:
        """Index of the column `name`; a ValueError listing the header (with close matches) otherwise."""
        if name not in self.header:
            raise ValueError(
                f"{what} {name!r} is not a column of {self.path!r}{did_you_mean(name, self.header)}; "
                f"its header: {', '.join(self.header)}"
            )
        return self.header.index(name)


def read_table(path: str | os.PathLike, *, ragged: bool = False) -> Table:
    """Header and rows of a UTF-8 CSV file (a byte-order mark is fine). Every row has the header's number of cells,
    or with `ragged` at most that many (rows of different lengths). FileNotFoundError or ValueError naming the file
    (and the line) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CSV file {str(path)!r} does not exist")
    rows, lines = [], []
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            for row in reader:
                if any(cell.strip() for cell in row):
                    rows.append(row)
                    lines.append(reader.line_num)
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{str(path)!r} is not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}): save "
            "it as a UTF-8 CSV file"
        ) from None
    except csv.Error as error:
        raise ValueError(f"{str(path)!r} is not a valid CSV file: {error}") from None
    if len(rows) < 2:
        raise ValueError(f"{str(path)!r} needs a header line and at least one row, it has {len(rows)} line(s)")
    table = Table(str(path), [name.strip() for name in rows[0]], rows[1:], lines[1:])
    _check_shape(table, ragged)
    return table


def _check_shape(table: Table, ragged: bool) -> None:
    names = table.header
    if not ragged and "" in names:
        raise ValueError(f"{table.path!r}: column {names.index('') + 1} of the header has no name")
    twice = sorted({name for name in names if name and names.count(name) > 1})
    if twice:
        raise ValueError(f"{table.path!r}: the header names the column(s) {', '.join(map(repr, twice))} twice")
    for row, cells in enumerate(table.rows):
        if len(cells) > len(names) or (not ragged and len(cells) < len(names)):
            raise ValueError(
                f"{table.path!r} line {table.lines[row]} has {len(cells)} cells, the header {len(names)}: every row "
                "needs one cell per column (quote a cell that holds a comma)"
            )


def parse_cells(cells: Sequence[str], where: Callable[[int], str]) -> np.ndarray:
    """float64 `[len(cells)]` from text cells, NaN for a missing value; a ValueError naming `where(i)` of the first
    cell that is neither a finite number nor a missing value."""
    values = np.empty(len(cells))
    for i, cell in enumerate(cells):
        text = cell.strip()
        if text.lower() in MISSING_CELLS:
            values[i] = np.nan
            continue
        try:
            values[i] = float(text)
        except ValueError:
            values[i] = np.inf
        if not np.isfinite(values[i]):
            raise ValueError(f"{where(i)}: cannot read {cell!r} as a number (missing values are {_MISSING_HELP})")
    return values


def apply_nan_policy(
    values: np.ndarray,
    policy: str,
    where: Callable[[int], str],
    *,
    fix: str = "set data.options.nan: mask or interpolate",
) -> np.ndarray:
    """`values` `[N]` (a series along time, NaN = missing) under `policy` (see the module docstring): unchanged for
    `mask`, filled for `interpolate` (a ValueError when no value is observed), a ValueError naming `where(i)` of the
    first missing value for `error`, advising `fix` (how the caller's user sets the policy)."""
    missing = np.isnan(values)
    if not missing.any() or policy == "mask":
        return values
    if policy == "error":
        first = int(np.flatnonzero(missing)[0])
        raise ValueError(
            f"{where(first)}: missing value ({int(missing.sum())} in this series); {fix} to accept missing values"
        )
    if policy != "interpolate":
        raise ValueError(f"nan must be one of {', '.join(NAN_POLICIES)}, got {policy!r}")
    if missing.all():
        raise ValueError(f"{where(0)}: every value of this series is missing: nothing to interpolate from")
    steps = np.arange(len(values))
    filled = values.copy()
    filled[missing] = np.interp(steps[missing], steps[~missing], values[~missing])
    return filled
