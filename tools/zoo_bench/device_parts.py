"""The device check's plumbing: a profile of sizes and budgets, the report rewritten after every item, and a part that
runs items until its time budget is spent (`zoo_bench.device_check` runs the parts)."""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .device_report import markdown
from .measure import failure

__all__ = ["Clock", "LongRun", "Profile", "Report", "frozen_heap", "part_budget", "run_items", "sync", "tidy"]


@dataclass(frozen=True)
class LongRun:
    """A long 1-D recipe of the `long` part: the recipe, its name in the report, and the overrides that set its
    length (and, on the CPU, its toy size)."""

    name: str
    recipe: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    """Sizes of one device's check; `budgets`: seconds per part (a part starts no item that its items' median time
    says would end past it)."""

    device: str
    budgets: dict[str, float]
    bench_lengths: tuple[int, ...]
    bench_dim: int
    bench_heads: int
    # the sweep's batch sizes, each at every length until it runs out of memory
    bench_batches: tuple[int, ...] = (1, 8)
    bench_variants: tuple[str, ...] = ()
    # added to every 1024-px recipe (the CPU's toy sizes); the 2048-px runs add `large` on top
    train_overrides: tuple[str, ...] = ()
    large_overrides: tuple[str, ...] = ()
    # added to every NaFlex recipe instead of train_overrides (recipes/naflex_*_1024.yaml: no fixed image size)
    naflex_overrides: tuple[str, ...] = ()
    train_steps: tuple[int, int] = (2, 5)  # warm-up, timed
    long_runs: tuple[LongRun, ...] = ()
    # False: the compiled runs go through train.compile with Dynamo switched off (the CPU's rehearsal of the path,
    # without minutes of C++ compiling)
    compile_for_real: bool = True
    flex_length: int = 300
    correctness_length: int = 37


@dataclass
class Report:
    """The check's results, written to `out` after every item."""

    out: Path
    results: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "device_check.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "device_check.md").write_text(markdown(self.results))

    def part(self, name: str) -> dict[str, Any]:
        return self.results["parts"].setdefault(name, {"status": "running", "items": []})


class Clock:
    """A part's time budget: `over()` once the time spent and a typical item's time (the median of those so far)
    together pass `seconds`; `lap()` after each item. The median, not the last item's time: one slow item (a
    compile, reformer's step) would otherwise end a part with most of its budget left and items unmeasured."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = self._lap = time.perf_counter()
        self.laps: list[float] = []

    def lap(self) -> None:
        now = time.perf_counter()
        self.laps.append(now - self._lap)
        self._lap = now

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def typical(self) -> float:
        return statistics.median(self.laps) if self.laps else 0.0

    def over(self) -> bool:
        return self.spent() + self.typical() > self.seconds


@contextmanager
def part_budget(report: Report, name: str, seconds: float) -> Iterator[Clock]:
    """The part `name` under a budget of `seconds`: yields its `Clock`; records its wall time and status, and an
    exception as the part's failure (the next part still runs)."""
    part = report.part(name)
    part["budget_s"] = seconds
    clock = Clock(seconds)
    report.save()
    try:
        with frozen_heap():
            yield clock
        part["status"] = "done"
    except Exception as error:  # noqa: BLE001 - a broken part is reported, the next part still runs
        part.update(status="failed", message=failure(error)["message"])
    part["wall_s"] = round(clock.spent(), 1)
    report.save()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """While items run: the objects that were alive before (modules, the caller's data) left out of the garbage
    collections `tidy` runs after every item (`gc.freeze`), which then scan what the items made, not a process's
    half a million objects; put back afterwards. Not nested."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def tidy(device: str) -> None:
    """Free what the last item left (its CUDA cache too), so that the next one's peak memory is its own."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def run_items(
    report: Report,
    name: str,
    profile: Profile,
    items: list[str],
    measure: Callable[[str], dict[str, Any]],
    key: str = "variant",
) -> dict[str, Any]:
    """The part `name`: `measure(item)` for each item, in order, while the budget allows (the rest listed as
    skipped); an item that raises is recorded with its error, and the failed items are listed."""
    with part_budget(report, name, profile.budgets[name]) as clock:
        part = report.part(name)
        for done, item in enumerate(items):
            if clock.over():
                part["skipped_for_time"] = items[done:]
                break
            try:
                record = measure(item)
            except Exception as error:  # noqa: BLE001 - one item never ends the part
                record = {key: item, "ok": False, **failure(error)}
            tidy(profile.device)
            part["items"].append(record)
            report.save()
            clock.lap()
        part["failed"] = [item[key] for item in part["items"] if not item["ok"]]
    return part
