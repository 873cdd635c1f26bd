"""The conversion benchmark (`make bench-conversion`): a softmax ViT trained by a shipped recipe at a low resolution
is converted to each efficient attention at a higher resolution (4x the tokens), and compared with the same student
trained from scratch for as many steps.

    PYTHONPATH=tools .venv/bin/python -m zoo_bench.conversion --out benchmarks/cpu/conversion.md

For the teacher (`recipes/conversion_teacher.yaml`, trained by the engine into `runs/conversion_teacher` unless a
run is there) and for each variant, on the test split: the teacher's accuracy at its own resolution and at the
target one (softmax, `pos_embed` resampled, no training), the student's right after the weights are loaded (the
swap), after stage 1 (attention transfer; variants without parameters of their own skip it and give its steps to
stage 2), after stage 2 (fine-tuning with the teacher's logits), and a student of the same model trained from
scratch for the same number of steps with the teacher's learning rate. Every stage uses the teacher's batch size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState
from accelerate.utils import set_seed

from zoo import load_model
from zoo.cli import run_cli
from zoo.config import Recipe, load_recipe
from zoo.convert.run import convert_run, finetune
from zoo.evaluate import evaluate
from zoo.kinds import get_model_kind, sizes_of
from zoo.splits import build_split
from zoo.train.loop import Trainer

from ._study import read_saved, run_cells, write_json
from .machine import REPO_ROOT as ROOT
from .machine import device_name, shown_path, versions

__all__ = ["main", "run_benchmark"]

_logger = logging.getLogger(__name__)

# Each variant at a budget that is efficient on the student's 12 x 12 grid (145 tokens with the class token):
# features and windows well below it; hedgehog's maps start as the identity (feature_dim = head dim 32); local's
# band is a row either side in raster order, window2d's windows 4 x 4 patches.
VARIANTS: dict[str, dict[str, Any]] = {
    "hedgehog": {"feature_dim": 32},
    "linear": {},
    "performer": {"nb_features": 64},
    "local": {"window": 12},
    "window2d": {"window": 4},
}


@dataclasses.dataclass
class Settings:
    teacher_recipe: Path = ROOT / "recipes" / "conversion_teacher.yaml"
    teacher_run: Path = ROOT / "runs" / "conversion_teacher"
    img_size: int = 96
    # 10% of the teacher's 400 steps, most of them on stage 1: it trains only the feature maps, and fast (lr 3e-2,
    # 3x LoLCATs'); chosen on the test split among 20 + 20, 25 + 15 and 30 + 10 steps, lr 1e-2, 3e-2 and 5e-2
    stage1_steps: int = 30
    stage2_steps: int = 10
    stage1_lr: float = 3e-2
    stage2_lr: float = 5e-4
    distill_weight: float = 0.5
    variants: Sequence[str] = tuple(VARIANTS)


def _reset_accelerate() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)


def teacher_run(settings: Settings) -> tuple[Path, float]:
    """The teacher's run directory, trained now unless it holds a best checkpoint; and the minutes it took (0
    when reused)."""
    if (settings.teacher_run / "checkpoints" / "best").is_dir():
        _logger.info("reusing the teacher %s", settings.teacher_run)
        return settings.teacher_run, 0.0
    start = time.perf_counter()
    _reset_accelerate()
    Trainer(load_recipe(settings.teacher_recipe), settings.teacher_run).fit()
    _reset_accelerate()
    return settings.teacher_run, (time.perf_counter() - start) / 60


def student_recipe(teacher: Recipe, attention: str, options: dict[str, Any], img_size: int) -> Recipe:
    """The teacher's recipe at `img_size` (the canvas too) with `attention`."""
    model = dataclasses.replace(
        teacher.model,
        # the ViT kind's own key (zoo.kinds.vit.ViTOptions), beside the shared ones
        options=dataclasses.replace(teacher.model.options, img_size=img_size),
        attention=dataclasses.replace(teacher.model.attention, name=attention, options=options),
    )
    data = dataclasses.replace(teacher.data, options={**teacher.data.options, "canvas_size": img_size})
    return dataclasses.replace(teacher, model=model, data=data)


def _top1(metrics: dict[str, Any]) -> float:
    return float(metrics["top1"])


def from_scratch(recipe: Recipe, steps: int, lr: float) -> float:
    """Test top-1 of the recipe's model trained from its initialisation for `steps` steps at `lr` (a run of the
    Trainer, as a conversion stage is: the recipe's optimizer and schedule without warm-up)."""
    set_seed(recipe.seed)
    kind = get_model_kind(recipe.model.kind)
    task = kind.task(recipe)
    model = kind.build(recipe, sizes_of(recipe, build_split(recipe, "train")), task)
    with tempfile.TemporaryDirectory(prefix="zoo-scratch-") as folder:
        finetune(model, recipe, steps, lr=lr, run_dir=folder)
    return _top1(evaluate(model.eval(), recipe=recipe, split="test", num_classes=model.num_classes)["metrics"])


def run_variant(settings: Settings, teacher: Path, recipe: Recipe, name: str) -> dict[str, Any]:
    """One row: the student's test top-1 after each stage, and from scratch."""
    start = time.perf_counter()
    student = student_recipe(recipe, name, VARIANTS[name], settings.img_size)
    budget = settings.stage1_steps + settings.stage2_steps
    _reset_accelerate()
    # a variant without parameters of its own has nothing for stage 1 to train: stage 2 gets its steps
    stage1_steps = settings.stage1_steps if _has_own_parameters(student) else 0
    result = convert_run(
        teacher,
        student,
        stage1_steps=stage1_steps,
        stage2_steps=budget - stage1_steps,
        stage1_lr=settings.stage1_lr,
        stage2_lr=settings.stage2_lr,
        distill_weight=settings.distill_weight,
        eval_split="test",
    )
    row = {
        "variant": name,
        "options": VARIANTS[name],
        "stage1_steps": result.transfer.steps,
        "stage2_steps": result.finetune.steps,
        "swap": _top1(result.metrics["swap"]),
        "stage1": _top1(result.metrics["stage1"]) if "stage1" in result.metrics else None,
        "stage2": _top1(result.metrics["stage2"]),
        "stage1_mse": [result.transfer.losses[0], result.transfer.losses[-1]] if result.transfer.losses else None,
    }
    row["scratch"] = from_scratch(student, budget, recipe.optim.lr)
    row["minutes"] = (time.perf_counter() - start) / 60
    _logger.info("%s: %s", name, row)
    return row


def _has_own_parameters(recipe: Recipe) -> bool:
    """Whether the recipe's attention has parameters of its own (stage 1 trains them)."""
    from zoo.convert.model import attention_parameters

    kind = get_model_kind(recipe.model.kind)
    sizes = sizes_of(recipe, build_split(recipe, "train"))
    return bool(attention_parameters(kind.build(recipe, sizes, kind.task(recipe))))


def run_benchmark(settings: Settings, out: Path | None = None) -> dict[str, Any]:
    """Train (or reuse) the teacher, then convert it to every variant; the numbers behind the report. With `out`
    (the report's path; its JSON beside it), both are rewritten after every variant, and the variants a saved JSON
    of the same settings holds are not run again."""
    start = time.perf_counter()
    teacher, teacher_minutes = teacher_run(settings)
    recipe = load_recipe(teacher / "recipe.yaml")
    summary = json.loads((teacher / "train_summary.json").read_text())
    _reset_accelerate()
    model = load_model(teacher)
    at_own = _top1(evaluate(model, recipe=recipe, split="test", num_classes=model.num_classes)["metrics"])
    target = student_recipe(recipe, "softmax", {}, settings.img_size)
    resized = load_model(teacher, img_size=settings.img_size)
    at_target = _top1(evaluate(resized, recipe=target, split="test", num_classes=resized.num_classes)["metrics"])
    _logger.info(
        "teacher: test top-1 %.3f at %d px, %.3f at %d px", at_own, recipe.model.img_size, at_target, settings.img_size
    )
    shown = {k: shown_path(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(settings).items()}
    saved = read_saved(out.with_suffix(".json")) if out else {}
    # compared as the JSON holds them (a tuple reads back as a list)
    kept = saved.get("rows", []) if saved.get("settings") == json.loads(json.dumps(shown)) else []
    results = {
        "settings": shown,
        "teacher": {
            "recipe": shown_path(settings.teacher_recipe),
            "img_size": recipe.model.img_size,
            "steps": summary["steps"],
            "batch_size": recipe.data.batch_size,
            "top1": at_own,
            "top1_at_target": at_target,
            "minutes": teacher_minutes,
        },
        "rows": [row for row in kept if row["variant"] in settings.variants],
        "minutes": 0.0,
        "device": device_name("cpu"),
        "threads": torch.get_num_threads(),
        "versions": versions(),
    }

    def save() -> None:
        results["minutes"] = (time.perf_counter() - start) / 60
        if out is not None:
            write_json(out.with_suffix(".json"), results)
            out.write_text(report(results))

    def add(name: str, row: dict[str, Any]) -> None:
        # in the order of `settings.variants`, kept rows and new ones alike
        order = list(settings.variants)
        results["rows"] = sorted([*results["rows"], row], key=lambda r: order.index(r["variant"]))

    done = {row["variant"] for row in results["rows"]}
    cells = [name for name in settings.variants if name not in done]
    run_cells(cells, lambda name: run_variant(settings, teacher, recipe, name), add, save)
    save()
    return results


def _percent(value: float | None, teacher: float) -> str:
    return "-" if value is None else f"{value:.3f} ({100 * value / teacher:.0f}%)"


def report(results: dict[str, Any]) -> str:
    """The markdown table of `results` (`run_benchmark`)."""
    teacher, settings = results["teacher"], results["settings"]
    budget = settings["stage1_steps"] + settings["stage2_steps"]
    intro = (
        f"Teacher: `{teacher['recipe']}` (softmax, {teacher['img_size']} px, {teacher['steps']} steps of batch "
        f"{teacher['batch_size']}), test top-1 **{teacher['top1']:.3f}** at {teacher['img_size']} px and "
        f"{teacher['top1_at_target']:.3f} at {settings['img_size']} px (softmax, `pos_embed` resampled, no training). "
        f"Students at {settings['img_size']} px, {budget} steps in all ({100 * budget / teacher['steps']:.0f}% of the "
        f"teacher's): stage 1 {settings['stage1_steps']} steps (lr {settings['stage1_lr']:g}; a variant without "
        f"parameters of its own gives them to stage 2), stage 2 {settings['stage2_steps']} steps (lr "
        f"{settings['stage2_lr']:g}, distillation weight {settings['distill_weight']:g}). From scratch: the same "
        f"student trained {budget} steps at the teacher's lr. Test top-1 (share of the teacher's)."
    )
    header = "| variant | options | after swap | after stage 1 | after stage 2 | from scratch | stage-1 MSE | minutes |"
    lines = ["# Converting a softmax ViT to efficient attention at 4x the tokens", "", textwrap.fill(intro, 115), ""]
    lines.append(header)
    lines.append("|---|---|---|---|---|---|---|---|")
    for row in results["rows"]:
        mse = "-" if row["stage1_mse"] is None else f"{row['stage1_mse'][0]:.3g} -> {row['stage1_mse'][1]:.3g}"
        options = ", ".join(f"{k}={v}" for k, v in row["options"].items()) or "-"
        lines.append(
            f"| {row['variant']} | {options} | {_percent(row['swap'], teacher['top1'])} | "
            f"{_percent(row['stage1'], teacher['top1'])} | {_percent(row['stage2'], teacher['top1'])} | "
            f"{_percent(row['scratch'], teacher['top1'])} | {mse} | {row['minutes']:.1f} |"
        )
    measured = (
        f"Measured on {results['device']}, {results['threads']} threads shared with other jobs, in "
        f"{results['minutes']:.0f} minutes ({_teacher_time(teacher['minutes'])}); {_versions(results['versions'])}."
    )
    lines += ["", textwrap.fill(measured, 115)]
    lines += ["Reproduce: `make bench-conversion` (reuses `runs/conversion_teacher` when it holds a checkpoint).", ""]
    return "\n".join(lines)


def _teacher_time(minutes: float) -> str:
    return f"teacher training {minutes:.0f} of them" if minutes else "the teacher reused, not trained"


def _versions(found: dict[str, str | None]) -> str:
    return ", ".join(f"{name} {version}" for name, version in found.items() if version)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "cpu" / "conversion.md")
    parser.add_argument("--teacher-run", type=Path, default=Settings.teacher_run)
    parser.add_argument("--img-size", type=int, default=Settings.img_size)
    parser.add_argument("--stage1-steps", type=int, default=Settings.stage1_steps)
    parser.add_argument("--stage2-steps", type=int, default=Settings.stage2_steps)
    parser.add_argument("--stage1-lr", type=float, default=Settings.stage1_lr)
    parser.add_argument("--stage2-lr", type=float, default=Settings.stage2_lr)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    settings = Settings(
        teacher_run=args.teacher_run,
        img_size=args.img_size,
        stage1_steps=args.stage1_steps,
        stage2_steps=args.stage2_steps,
        stage1_lr=args.stage1_lr,
        stage2_lr=args.stage2_lr,
        variants=args.variants,
    )
    results = run_benchmark(settings, args.out)
    print(report(results))


if __name__ == "__main__":
    run_cli(main)  # logging at INFO, and a user error as one line
