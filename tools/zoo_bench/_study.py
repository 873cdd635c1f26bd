"""The skeleton every study shares (the leaderboard, recall, highres, seg_bench, conversion): a grid of cells, each a
tuple such as (variant, seed) or (variant, length, width, seed, lr), run in order; each finished cell's record is
added to the study's results and the study's JSON and report are rewritten before the next, so a study stopped
anywhere keeps every finished cell and, started again, resumes from its JSON with the cells it holds.

A study declares its cells, the function that runs one, how a record joins its results, and how it saves them
(`run_cells`); `read_saved` and `write_json` read and write its JSON the one way every study's committed file was
written.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["image_layouts", "layout_sets", "read_saved", "run_cells", "write_json"]

Cell = TypeVar("Cell", bound=Hashable)
Record = TypeVar("Record")


def image_layouts(
    order: Iterable[str], *, local_window: int, global_blocks: tuple[int, ...]
) -> dict[str, dict[str, Any]]:
    """The layouts the image studies compare, in `order` (names below; "window2d + global" is keyed with its blocks,
    e.g. "window2d + global [2, 5]"): each the attention of every block, its options and the `--set` items it adds.

    The windowed ones see about 16-25 keys a query: 4 x 4 windows, a 5 x 5 neighbourhood, local's band of
    `local_window` tokens either side in raster order; ViTDet's layout puts softmax in `global_blocks`; performer
    keeps 64 features, the linear family its defaults.
    """
    blocks = list(global_blocks)
    catalogue = {
        "softmax": {"attention": "softmax", "options": {}},
        "local": {"attention": "local", "options": {"window": local_window}},
        "window2d": {"attention": "window2d", "options": {"window": 4}},
        "window2d + global": {
            "attention": "window2d",
            "options": {"window": 4},
            "extra": (f"model.global_blocks={blocks}", "model.global_attention.name=softmax"),
        },
        "neighborhood": {"attention": "neighborhood", "options": {"kernel": 5}},
        "linear": {"attention": "linear", "options": {}},
        "performer": {"attention": "performer", "options": {"nb_features": 64}},
        "hedgehog": {"attention": "hedgehog", "options": {}},
    }
    return {(f"{name} {blocks}" if name == "window2d + global" else name): catalogue[name] for name in order}


def layout_sets(layout: dict[str, Any]) -> list[str]:
    """A layout's recipe overrides (`--set` items), its options as JSON."""
    items = [f"model.attention.name={layout['attention']}"]
    items += [f"model.attention.options.{key}={json.dumps(value)}" for key, value in layout["options"].items()]
    return items + list(layout.get("extra", ()))


def read_saved(path: Path) -> dict[str, Any]:
    """The study's saved results at `path`, or {} where it has none yet."""
    return json.loads(path.read_text()) if path.is_file() else {}


def write_json(path: Path, results: dict[str, Any]) -> None:
    """The results as every study writes them: indented by one, a newline at the end."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def run_cells(
    cells: Iterable[Cell],
    run: Callable[[Cell], Record],
    add: Callable[[Cell, Record], None],
    save: Callable[[], None],
    *,
    jobs: int = 1,
    stop_after: float | None = None,
) -> list[Cell]:
    """Run each cell of `cells` (those the study already holds left out by the caller): `run(cell)` gives its
    record, then `add(cell, record)` and `save()` run together, under a lock where `jobs` > 1 cells run at once
    (threads that wait on child processes), so the report never sees half a record. No cell starts once `stop_after`
    seconds have passed (the running ones finish and are saved). Returns the cells not started."""
    lock, unstarted = threading.Lock(), []
    deadline = None if stop_after is None else time.monotonic() + stop_after

    def one(cell: Cell) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            unstarted.append(cell)
            return
        record = run(cell)
        with lock:
            add(cell, record)
            save()

    if jobs == 1:
        for cell in cells:
            one(cell)
    else:
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, cells))
    return unstarted
