"""The studies' shared skeleton (zoo_bench._study): cells run in order, each record added and saved before the next,
a deadline that starts no more cells, several at once, and the JSON written as the committed files were."""

import json
import threading
import time
from pathlib import Path

import pytest

from zoo_bench._study import read_saved, run_cells, write_json

REPO = Path(__file__).resolve().parents[2]


def test_each_cell_is_added_and_saved_before_the_next_runs():
    events = []
    unstarted = run_cells(
        [("softmax", 0), ("linear", 0)],
        run=lambda cell: events.append(("run", cell)) or {"variant": cell[0]},
        add=lambda cell, record: events.append(("add", cell, record["variant"])),
        save=lambda: events.append(("save",)),
    )
    assert unstarted == []
    assert events == [
        ("run", ("softmax", 0)), ("add", ("softmax", 0), "softmax"), ("save",),
        ("run", ("linear", 0)), ("add", ("linear", 0), "linear"), ("save",),
    ]  # fmt: skip


def test_no_cell_starts_after_the_deadline():
    ran = []
    unstarted = run_cells([1, 2, 3], run=ran.append, add=lambda c, r: None, save=lambda: None, stop_after=0)
    assert ran == [] and unstarted == [1, 2, 3]


def test_cells_run_at_once_add_and_save_one_at_a_time():
    inside, most, lock = [0], [0], threading.Lock()

    def save():
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        with lock:
            inside[0] -= 1

    added = []
    run_cells(range(8), run=lambda cell: cell, add=lambda cell, record: added.append(record), save=save, jobs=4)
    assert sorted(added) == list(range(8)) and most[0] == 1


@pytest.mark.parametrize(
    "committed",
    ["benchmarks/cpu/highres.json", "benchmarks/cpu/seg_megamnist_quick.json", "benchmarks/cpu/conversion.json"],
)
def test_a_study_resaves_its_committed_json_byte_for_byte(tmp_path, committed):
    path = tmp_path / "study.json"
    write_json(path, read_saved(REPO / committed))
    assert path.read_bytes() == (REPO / committed).read_bytes()
    assert read_saved(tmp_path / "none.json") == {}
    assert json.loads(path.read_text()) == json.loads((REPO / committed).read_text())
