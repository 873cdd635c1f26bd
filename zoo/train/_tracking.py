"""What a training run reports as it goes: the tracker (`train.log_with`) and the hyperparameters it records, the
progress bar with its loss, learning rate and samples/s every `train.log_every_steps`, and every evaluation, to
`metrics.jsonl`, the tracker and the console."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.tracking import get_available_trackers
from accelerate.utils import LoggerType
from tqdm.auto import tqdm

from ..config import Recipe, recipe_to_dict

__all__ = ["flat_config", "format_rate", "log_eval", "log_step", "progress_bar", "tracker_name"]


def tracker_name(name: str | None) -> str | None:
    """`train.log_with` once its package is installed: accelerate would leave an uninstalled tracker out with
    only a debug message."""
    if name is not None and LoggerType(name) not in get_available_trackers():
        raise ValueError(
            f"train.log_with {name!r}: the {name} package is not installed; pip install {name}, or leave "
            "train.log_with out"
        )
    return name


def flat_config(recipe: Recipe) -> dict[str, Any]:
    """The recipe as flat dotted keys (`model.attention.name`) with values every tracker takes (bool, int,
    float, str; lists and null as JSON text): the run's hyperparameters."""
    flat: dict[str, Any] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, (bool, int, float, str)):
            flat[path] = value
        else:
            flat[path] = json.dumps(value)

    # the kind's options flat in `model`, as the recipe file writes them (model.img_size, model.sequence.input)
    walk(recipe_to_dict(recipe), "")
    return flat


def format_rate(samples_per_s: float) -> str:
    """Three significant digits, so that a slow step reads 0.0312, not 0.0."""
    return f"{samples_per_s:.0f}" if samples_per_s >= 1000 else f"{samples_per_s:.3g}"


def progress_bar(*, total: int, initial: int, enabled: bool, desc: str) -> tqdm:
    """An epoch's bar of optimizer steps."""
    return tqdm(
        total=total,
        initial=initial,
        disable=not enabled,
        desc=desc,
        dynamic_ncols=True,
        # redirected to a log (CI, a cluster job), a line every half minute instead of a carriage return per step
        mininterval=0.1 if sys.stderr.isatty() else 30.0,
    )


def log_step(accelerator: Accelerator, bar: tqdm, step: int, *, loss: float, lr: float, samples_per_s: float) -> None:
    """A step's loss, learning rate and samples/s, on the progress bar and to the tracker."""
    bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", samples_s=format_rate(samples_per_s), refresh=False)
    accelerator.log({"train/loss": loss, "train/lr": lr, "train/samples_per_s": samples_per_s}, step=step)


def log_eval(accelerator: Accelerator, run_dir: Path, record: dict) -> None:
    """An evaluation's record: a line of `metrics.jsonl` (main process), the tracker's numbers, a console line."""
    if accelerator.is_main_process:
        with open(run_dir / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")
    # the tracker's (train.log_with): the epoch, the epoch's mean loss and every validation number
    tracked = {"epoch": record["epoch"], "train/epoch_loss": record["train_loss"]}
    tracked.update({f"val/{k[4:]}": v for k, v in record.items() if k.startswith("val_")})
    accelerator.log(tracked, step=record["step"])
    accelerator.print("eval " + " ".join(f"{k}={v:.4g}" for k, v in record.items() if isinstance(v, (int, float))))
