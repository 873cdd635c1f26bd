"""The first lines of a training run: where and how it runs (device, processes, precision, compile, threads) and the
training habits in force (EMA with its decay, mixup / CutMix, augmentation, early stopping, which weights validation
scores). Each habit is a recipe key that changes the result without changing the code path a reader sees, so a run
says which are on: in the console and in `train.log`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelerate import Accelerator

    from ..config import Recipe
    from .threads import ThreadPolicy

__all__ = ["run_lines", "scored_weights"]

_PRECISION = {"no": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}


def scored_weights(recipe: Recipe) -> str:
    """The weights that validation scores and checkpoints/best is chosen by: `ema` or `raw`."""
    ema = recipe.train.ema
    return "ema" if ema is not None and ema.evaluate == "ema" else "raw"


def run_lines(
    recipe: Recipe, accelerator: Accelerator, threads: ThreadPolicy | None, *, steps: int, steps_per_epoch: int
) -> list[str]:
    """The run's first lines (see the module docstring)."""
    cfg = recipe.train
    processes = accelerator.num_processes
    where = f"{processes} processes ({cfg.distributed})" if processes > 1 else "1 process"
    compiled = f"compile {cfg.compile_mode!r}" if cfg.compile_mode is not None else "compile off"
    precision = _PRECISION.get(accelerator.mixed_precision, accelerator.mixed_precision)
    lines = [
        f"run {recipe.name}: {accelerator.device}, {where}, precision {precision}, {compiled}, {steps} steps "
        f"({steps_per_epoch} per epoch), seed {recipe.seed}",
        threads.line if threads is not None else "threads: not set by zoo (torch's default)",
        "habits: " + ", ".join(_habits(recipe)),
    ]
    return lines


def _habits(recipe: Recipe) -> list[str]:
    cfg = recipe.train
    habits = []
    if cfg.ema is None:
        habits.append("EMA off")
    else:
        warmup = f" with warm-up (power {cfg.ema.warmup_power:g})" if cfg.ema.warmup else ""
        habits.append(f"EMA decay {cfg.ema.decay:g}{warmup}")
    mixup = cfg.mixup
    if mixup is None:
        habits.append("mixup / CutMix off")
    else:
        parts = [f"mixup alpha {mixup.mixup_alpha:g}" if mixup.mixup_alpha else "mixup off"]
        parts.append(f"CutMix alpha {mixup.cutmix_alpha:g}" if mixup.cutmix_alpha else "CutMix off")
        habits.append(f"{' / '.join(parts)} (prob {mixup.prob:g}, switch {mixup.switch_prob:g})")
    augment = recipe.data.options.get("augment")
    habits.append(f"augmentation {_compact(augment)}" if augment else "augmentation off")
    stopping = cfg.early_stopping
    habits.append(f"early stopping after {stopping.patience} evaluations" if stopping else "early stopping off")
    if cfg.label_smoothing:
        habits.append(f"label smoothing {cfg.label_smoothing:g}")
    if cfg.validate:
        weights = scored_weights(recipe)
        both = "; the raw weights scored too" if cfg.ema is not None and weights == "ema" else ""
        both = "; the EMA weights scored too" if cfg.ema is not None and weights == "raw" else both
        habits.append(f"validation scores the {weights.upper() if weights == 'ema' else weights} weights{both}")
    else:
        habits.append("no validation (train.validate false)")
    return habits


def _compact(value: Any) -> str:
    """A recipe value on one line, as YAML's flow style writes it."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_compact(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_compact(v) for v in value) + "]"
    return str(value)
