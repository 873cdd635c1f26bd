"""The committed results as the generated pages read them: each JSON file loaded once, the noise margin a speed-up
must clear, and the one format of each number that more than one page shows (so two pages never disagree)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import cache
from typing import Any

from .machine import REPO_ROOT

__all__ = [
    "GPU_QUALITY",
    "GPU_TRAIN",
    "QUALITY_COMMAND",
    "MARGIN",
    "RECALL2D",
    "Fact",
    "beyond_noise",
    "conversion_text",
    "faster_from",
    "load",
    "mean_std",
    "miou_text",
    "percent_mean_std",
    "quality_races",
    "score_text",
    "timed",
]

GPU_DIR = "benchmarks/nvidia-h100-80gb-hbm3"
# the fused linear-family kernels, measured on an H200 after the H100's sweep (a later file wins per variant)
FUSED_DIR = "benchmarks/nvidia-h200/fused"
# the H200's full device check with the fused kernels on (its torch_paths/ folder: the same check with them off);
# read for what the newest check below did not reach (neighborhood's and window2d's layer at 64K, the correctness of
# seven variants)
H200_CHECK = "benchmarks/nvidia-h200/all_recipes"
# the newest H200 check, the fused kernels chunked (its layer sweep, and correctness as far as its budget reached);
# last in each column's sources, so it wins wherever it measured the variant
CHUNKED_CHECK = "benchmarks/nvidia-h200/chunked"
# the GPU training checks, oldest first: each variant is read from the newest that trained it (docs/choose.md lists
# every run of them)
GPU_TRAIN = (
    "benchmarks/nvidia-h100-80gb-hbm3/recheck/device_check.json",
    "benchmarks/nvidia-h200/device_check.json",
    "benchmarks/nvidia-h200/fused/train_check.json",
    f"{H200_CHECK}/device_check.json",
    f"{CHUNKED_CHECK}/device_check.json",
)
# `make device-train` on a GPU (zoo_bench.device_train): each attention trained the same wall time, its validation
# curve; oldest first, the newest that trained a comparison is read. None committed yet: the pages say so.
GPU_QUALITY = ("benchmarks/nvidia-h100-80gb-hbm3/device_train.json", "benchmarks/nvidia-h200/device_train.json")
QUALITY_COMMAND = "make device-train DEVICE_OUT=benchmarks/<gpu>"
HIGHRES = "benchmarks/cpu/highres.json"
# the 2-D recall probe (tools/zoo_bench/recall2d.py): its summary carries each layout's verdict
RECALL2D = "benchmarks/cpu/recall2d.json"

# "faster" / "slower" only beyond this relative margin, or the repeats' own spread where larger
MARGIN = 0.05


@dataclass(frozen=True)
class Fact:
    """A cell: its text, and the number the rules read (None where there is none)."""

    text: str
    value: float | None = None
    where: str = ""  # where the number was measured, for a pick line that names it


@cache
def load(path: str) -> dict[str, Any] | None:
    """The JSON file at `path` (relative to the repository root), or None where there is none."""
    file = REPO_ROOT / path
    return json.loads(file.read_text()) if file.exists() else None


def _spread(record: dict[str, Any] | None) -> float:
    """The relative spread (max - min over the median) of a timing record's repeats; 0 without repeats."""
    times = (record or {}).get("fwd_bwd_times") or []
    return (max(times) - min(times)) / statistics.median(times) if len(times) > 1 else 0.0


def beyond_noise(
    baseline: float, value: float, record: dict | None = None, base_record: dict | None = None, *, time: bool = False
) -> bool:
    """Whether `value` beats `baseline` by more than `MARGIN` or the two records' spread: a time (`time`) by being
    lower, a rate by being higher."""
    margin = max(MARGIN, _spread(record), _spread(base_record))
    return value < baseline * (1 - margin) if time else value > baseline * (1 + margin)


def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation over seeds (0 for one seed): every page's `mean ± std`."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def percent_mean_std(values: list[float]) -> str:
    """Fractions (top-1 per seed) as the pages show them: `25.1 ± 4.9`, in percent; `17.6 (one seed)` for one, whose
    spread is not known (not 0)."""
    if len(values) == 1:
        return f"{100 * values[0]:.1f} (one seed)"
    mean, std = mean_std([100 * value for value in values])
    return f"{mean:.1f} ± {std:.1f}"


def timed(record: dict[str, Any] | None) -> str:
    """A layer timing record as the pages show it: `1.41 s, 1.2 GiB`, its failure, or `-` where none."""
    if record is None:
        return "-"
    if record["status"] != "ok":
        return record["status"]
    if record.get("peak_mib") is None:  # a sweep that measured no memory
        return f"{record['fwd_bwd_s']:.3g} s"
    return f"{record['fwd_bwd_s']:.3g} s, {record['peak_mib'] / 1024:.2g} GiB"


def faster_from(mine: dict[int, dict[str, Any]], softmax: dict[int, dict[str, Any]]) -> int | None:
    """The shortest measured length from which the variant is faster than softmax at every longer measured length,
    beyond the noise (`beyond_noise`); None where it is not faster at the longest. `mine`, `softmax`: length -> a
    layer timing record."""
    ok = sorted(n for n in mine if n in softmax and mine[n]["status"] == softmax[n]["status"] == "ok")
    start = None
    for n in reversed(ok):
        if not beyond_noise(softmax[n]["fwd_bwd_s"], mine[n]["fwd_bwd_s"], mine[n], softmax[n], time=True):
            break
        start = n
    return start


def score_text(row: dict[str, Any]) -> str:
    """A leaderboard summary row's score: `32.1 ± 0.6` (percent, mean ± std over seeds)."""
    return f"{row['score']:.1f} ± {row['spread']:.1f}"


def miou_text(row: dict[str, Any], background: float) -> str:
    """A segmentation summary row's mIoU beside the all-background rule's, in percent."""
    spread = 100 * (row["miou_spread"] or 0.0)
    return f"{100 * row['miou']:.1f} ± {spread:.1f} (all-background {100 * background:.1f})"


def conversion_text(row: dict[str, Any], teacher: float) -> str:
    """A converted student's top-1 beside its teacher's and the same student's from scratch, in percent."""
    return f"{100 * row['stage2']:.1f} (teacher {100 * teacher:.1f}, scratch {100 * row['scratch']:.1f})"


def quality_races() -> list[dict[str, Any]]:
    """The newest committed `make device-train` run of each comparison (`GPU_QUALITY`): its race to softmax's final
    validation metric (`device_report.reached`) with `group`, `seconds`, `device`, `file` and its `runs`
    (run -> attention); [] where none is committed."""
    from .device_report import reached

    races: dict[str, dict[str, Any]] = {}
    for path in GPU_QUALITY:
        data = load(path)
        if data is None:
            continue
        groups: dict[str, list[dict[str, Any]]] = {}
        for item in data["runs"]:
            groups.setdefault(item.get("group", ""), []).append(item)
        for group, items in groups.items():
            race = reached(items)
            if race is not None and all(item.get("data", "real") == "real" for item in items):
                runs = {item["run"]: item.get("attention") for item in items}
                where = {"seconds": data["seconds"], "device": data["device_name"], "file": path}
                races[group] = {**race, "group": group, "runs": runs, **where}
    return list(races.values())
