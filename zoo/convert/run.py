"""tools/convert.py's pipeline: a softmax-trained ViT converted to the attention and resolution of a recipe, on the
recipe's data, by `zoo.convert.model`'s stages, and written as a run directory.

`convert_run(teacher, recipe)`:

1. the student is the model `recipe` builds (its attention, its `img_size`, its data's classes); the teacher (a run
   directory of tools/train.py, or a timm-layout weights file read into the recipe's architecture with softmax
   attention) is brought to the student's resolution (`pos_embed` resampled) and its weights are loaded into the
   student: every timm weight, a new head where the class count differs, the variant's own attention parameters
   kept at their initialisation;
2. stage 1, `transfer_attention`: only those parameters train, to match the teacher's attention outputs block by
   block on the recipe's training images (labels unused; `zoo.convert.model.AttentionTransfer`); variants without
   any skip it;
3. stage 2, `finetune`: the task loss on all weights, distilled from the teacher's logits when the teacher's head
   predicts the same classes (`zoo.convert.model.Distillation`).

Each stage is a Trainer run with the stage's objective (`zoo.train.stages.run_stage`): the recipe's optimizer at the
stage's learning rate for the stage's steps, its clipping, mixed precision, ddp (`torchrun --nproc_per_node N
tools/convert.py ...`), non-finite handling and trackers; checkpoints and logs in `<run_dir>/stages/stage1` and
`stage2`. Stage 2 follows the recipe's schedule without its warm-up (a stage starts from trained weights); stage 1
holds its rate constant (`stage1_schedule`), as LoLCATs' attention transfer does: its feature maps start afresh on
a target that does not move, and the recipe's cosine, spent over a stage of a few dozen steps, left them short of
it (`make bench-conversion` measures both).

With `run_dir` the result is a run directory of tools/train.py's layout: `recipe.yaml` (the recipe that builds the
student), `model.json`, `checkpoints/best` and `last`, `metrics.jsonl` (one record per evaluated stage) and
`conversion.json`; tools/eval.py, tools/predict.py and `zoo.load_model` read it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed
from torch import nn

from .._validate import check_int
from .._weights import read_weights
from ..config import Recipe, ScheduleConfig
from ..evaluate import evaluate
from ..hub._run_weights import without_pretrained
from ..hub.load import is_model_source, load_model
from ..hub.runs import describe_model, write_run
from ..kinds import get_model_kind, sizes_of
from ..models.vit import load_state_dict_into
from ..splits import build_split
from ..train._objective import objective_recipe
from ..train.parts import resolve_mixed_precision
from ..train.stages import run_stage
from .model import (
    AttentionTransfer,
    Distillation,
    FinetuneReport,
    TransferReport,
    _check_positive,
    _mode,
    _only_trainable,
    attention_parameters,
)

__all__ = ["ConversionResult", "convert_run", "finetune", "stage_recipe", "transfer_attention"]

_logger = logging.getLogger(__name__)

STAGES = ("swap", "stage1", "stage2")
# what a stage's `schedule` may name: the recipe's schedules (`schedule.name`)
SCHEDULES: tuple[str, ...] = typing.get_args(typing.get_type_hints(ScheduleConfig)["name"])


@dataclass
class ConversionResult:
    """The converted `student`, the recipe that builds it, the `teacher` at the student's resolution, each stage's
    report and the metrics after each evaluated stage (`swap`: the weights loaded, `stage1`, `stage2`)."""

    student: nn.Module
    recipe: Recipe
    teacher: nn.Module
    transfer: TransferReport | None = None
    finetune: FinetuneReport | None = None
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_dir: Path | None = None


def _teacher(source: Path, recipe: Recipe, sizes, task) -> tuple[nn.Module, bool]:
    """The teacher at the student's resolution, and whether its head predicts the recipe's classes (its logits can
    then be distilled). A weights file is read into the recipe's architecture with softmax attention."""
    size = recipe.model.img_size
    if is_model_source(source):
        teacher = load_model(source)
        if not hasattr(teacher, "patch_embed"):
            raise ValueError(f"teacher {source} is a {type(teacher).__name__}: tools/convert.py converts ViT runs")
        if tuple(teacher.patch_embed.img_size) != (size, size):
            teacher = load_model(source, img_size=size)
        _warn_unless_softmax(teacher, source)
        return teacher, teacher.num_classes == task.num_outputs(sizes)
    softmax = dataclasses.replace(recipe.model.attention, name="softmax", options={})
    model = recipe.model.replace(attention=softmax, global_blocks=[])
    kind = get_model_kind(recipe.model.kind)
    teacher = kind.build(dataclasses.replace(recipe, model=model), sizes, task)
    report = load_state_dict_into(teacher, read_weights(source), str(source))
    return teacher.eval(), not any(key.startswith("head") for key in report.dropped_keys)


def teacher_attentions(teacher: nn.Module) -> list[str]:
    """The attention of each of `teacher`'s blocks, by name (`softmax` for a block without a zoo attention)."""
    return [getattr(getattr(block, "attn", None), "attention_name", "softmax") for block in teacher.blocks]


def _warn_unless_softmax(teacher: nn.Module, source: Path) -> None:
    """Conversion imitates a softmax teacher's attention maps: a teacher trained with another attention passes its
    own approximation on, which is rarely what was meant, so the run says so (and goes on)."""
    names = teacher_attentions(teacher)
    other = sorted({name for name in names if name != "softmax"})
    if other:
        _logger.warning(
            "teacher %s uses %s attention in %d of its %d blocks, not softmax: the student learns to imitate that "
            "attention, not exact softmax (convert a softmax-trained ViT for that)",
            source,
            " and ".join(repr(name) for name in other),
            sum(name != "softmax" for name in names),
            len(names),
        )


def stage_recipe(
    recipe: Recipe, stage: str, steps: int, lr: float, log_every: int = 0, *, schedule: str | None = None
) -> Recipe:
    """The recipe of a conversion stage's run: `steps` optimizer steps at `lr` in the recipe's optimizer and schedule
    without its warm-up (`schedule`, one of `SCHEDULES`, in place of the recipe's `schedule.name` when given), one
    record and checkpoint at the end, no validation (`convert_run` evaluates each stage)."""
    train = {"epochs": steps, "max_steps": steps, "validate": False, "eval_every_epochs": steps, "pretrain": None}
    train |= {"checkpoint_every_steps": None, "log_every_steps": log_every or recipe.train.log_every_steps}
    rate = {"warmup_steps": 0} | ({} if schedule is None else {"name": _schedule_name("schedule", schedule)})
    return objective_recipe(recipe, f"{recipe.name}_{stage}", train=train, optim={"lr": lr}, schedule=rate)


def _schedule_name(name: str, value: object) -> str:
    if value not in SCHEDULES:
        raise ValueError(f"{name}={value!r} is not a schedule: use one of {', '.join(SCHEDULES)}")
    return value


def transfer_attention(
    teacher: nn.Module,
    student: nn.Module,
    recipe: Recipe,
    steps: int,
    lr: float = 1e-2,
    *,
    run_dir: str | Path,
    schedule: str = "constant",
    log_every: int = 0,
) -> TransferReport:
    """Stage 1, attention transfer: train only `attention_parameters(student)` for `steps` steps at `lr` (LoLCATs:
    1e-2) on `recipe`'s training images, as a run into `run_dir` (`stage_recipe`, the rate following `schedule`:
    constant, as LoLCATs', or one of the recipe's others), to minimise the sum over blocks of MSE(student
    attention(x_i), teacher attention(x_i)) (`AttentionTransfer`).

    Every other student tensor is left bitwise unchanged, and the previous `requires_grad` flags and train/eval mode
    are restored. A variant with no parameters of its own returns at once with `skipped=True`.
    """
    check_int("steps", steps, 0)
    _check_positive("lr", lr)
    _schedule_name("schedule", schedule)
    own = attention_parameters(student)
    if not own:
        name = getattr(student, "zoo_args", {}).get("attention", "this attention")
        _logger.info("%s has no parameters of its own: stage 1 (attention transfer) skipped", name)
        return TransferReport(skipped=True)
    report = TransferReport(skipped=False, parameters=list(own))
    if steps == 0:
        return report
    objective = AttentionTransfer(teacher, student)
    with _mode(student, False), _only_trainable(student, own.values()):
        stage = stage_recipe(recipe, "stage1", steps, lr, log_every, schedule=schedule)
        run = run_stage(stage, run_dir, student, objective)
    report.steps = run.state.step
    report.losses = torch.stack(objective.losses).tolist()
    return report


def finetune(
    student: nn.Module,
    recipe: Recipe,
    steps: int,
    lr: float = 1e-4,
    *,
    run_dir: str | Path,
    teacher: nn.Module | None = None,
    distill_weight: float = 0.5,
    temperature: float = 1.0,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    log_every: int = 0,
) -> FinetuneReport:
    """Stage 2: `steps` steps at `lr` of the task's loss on `recipe`'s training split, as a run into `run_dir`
    (`stage_recipe`), the student changed in place; distilled from `teacher`'s logits (`distill_weight`,
    `temperature`; `Distillation`), on LoRA adapters of `lora_rank` merged back at the end (the student is then a
    plain timm model with the same keys). The `requires_grad` flags and train/eval mode come back as they were.
    """
    check_int("steps", steps, 0)
    _check_positive("lr", lr)
    kind = get_model_kind(recipe.model.kind)
    objective = Distillation(
        kind,
        kind.task(recipe),
        label_smoothing=recipe.train.label_smoothing,
        teacher=teacher,
        distill_weight=distill_weight,
        temperature=temperature,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
    )
    report = FinetuneReport(lora_rank=lora_rank)
    if steps == 0:
        return report
    flags = {param: param.requires_grad for param in student.parameters()}
    try:
        with _mode(student, student.training):
            run = run_stage(stage_recipe(recipe, "stage2", steps, lr, log_every), run_dir, student, objective)
    finally:
        objective.merge()
        for param, flag in flags.items():
            param.requires_grad_(flag)
    parts = torch.stack(objective.parts).tolist()
    report.steps = run.state.step
    report.losses, report.task_losses = [p[0] for p in parts], [p[1] for p in parts]
    report.distill_losses = [p[2] for p in parts] if teacher is not None else []
    return report


def convert_run(
    teacher: str | Path,
    recipe: Recipe,
    *,
    stage1_steps: int = 100,
    stage2_steps: int = 200,
    stage1_lr: float = 1e-2,
    stage2_lr: float = 1e-4,
    stage1_schedule: str = "constant",
    distill_weight: float = 0.5,
    lora_rank: int | None = None,
    eval_split: str | None = "val",
    run_dir: str | Path | None = None,
    log_every: int = 0,
) -> ConversionResult:
    """Convert `teacher` (a run directory, checkpoint or save_pretrained folder, or a timm-layout weights file) to
    the model `recipe` builds, in `stage1_steps` steps of attention transfer (its rate following `stage1_schedule`)
    and `stage2_steps` of fine-tuning on the recipe's training split (batches of `data.batch_size`); evaluated on
    `eval_split` after each stage (None: never) and written to `run_dir` when given (see the module docstring)."""
    check_int("stage1_steps", stage1_steps, 0)
    check_int("stage2_steps", stage2_steps, 0)
    _schedule_name("stage1_schedule", stage1_schedule)
    kind = get_model_kind(recipe.model.kind)
    if kind.name != "vit":
        raise ValueError(f"tools/convert.py converts ViTs; the recipe's model.kind is {kind.name!r}")
    if run_dir is None and PartialState().num_processes > 1:
        raise ValueError("convert_run on several processes needs a run_dir that they share (for the stages' runs)")
    recipe = without_pretrained(recipe)
    # the stages' precision, set in accelerate's process-wide state before the first evaluation asks for none
    precision = resolve_mixed_precision(recipe.train.mixed_precision)
    Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=precision)
    set_seed(recipe.seed)
    task = kind.task(recipe)
    train_set = build_split(recipe, "train")
    sizes = sizes_of(recipe, train_set)
    student = kind.build(recipe, sizes, task)
    source = Path(teacher).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"teacher {source} does not exist: give a run directory or a weights file")
    teacher_model, same_classes = _teacher(source, recipe, sizes, task)
    load_state_dict_into(student, teacher_model.state_dict(), str(source))
    result = ConversionResult(student, recipe, teacher_model)
    result.metrics.update(_evaluated("swap", student, recipe, eval_split))
    stages = Path(run_dir) / "stages" if run_dir is not None else Path(tempfile.mkdtemp(prefix="zoo-convert-"))
    try:
        result.transfer = transfer_attention(
            teacher_model,
            student,
            recipe,
            stage1_steps,
            lr=stage1_lr,
            run_dir=stages / "stage1",
            schedule=stage1_schedule,
            log_every=log_every,
        )
        if not result.transfer.skipped:
            result.metrics.update(_evaluated("stage1", student, recipe, eval_split))
        distill = distill_weight if same_classes else 0.0
        if distill_weight and not same_classes:
            _logger.warning("the teacher's head predicts other classes than the recipe's: no distillation in stage 2")
        result.finetune = finetune(
            student,
            recipe,
            stage2_steps,
            lr=stage2_lr,
            run_dir=stages / "stage2",
            teacher=teacher_model if distill else None,
            distill_weight=distill,
            lora_rank=lora_rank,
            log_every=log_every,
        )
        result.metrics.update(_evaluated("stage2", student, recipe, eval_split))
    finally:
        if run_dir is None:
            shutil.rmtree(stages, ignore_errors=True)
    student.eval()
    if run_dir is not None:
        description = describe_model(recipe, train_set, task, sizes)
        if PartialState().is_main_process:
            result.run_dir = _write(Path(run_dir), result, source, description, eval_split)
        PartialState().wait_for_everyone()
        result.run_dir = Path(run_dir)
    return result


def _evaluated(stage: str, model: nn.Module, recipe: Recipe, split: str | None) -> dict[str, dict[str, Any]]:
    if split is None:
        return {}
    metrics = evaluate(model, recipe=recipe, split=split, num_classes=model.num_classes)["metrics"]
    _logger.info("after %s: %s", stage, " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)))
    return {stage: metrics}


def _write(run_dir: Path, result: ConversionResult, source: Path, description: Mapping, split: str | None) -> Path:
    """The run directory of the converted student, with the stages' metrics and reports."""
    steps = (result.transfer.steps if result.transfer else 0) + (result.finetune.steps if result.finetune else 0)
    write_run(run_dir, result.recipe, result.student, description, state={"step": steps, "epoch": 0})
    with open(run_dir / "metrics.jsonl", "w") as handle:
        for stage, metrics in result.metrics.items():
            scalars = {f"{split}_{k}": v for k, v in metrics.items() if not isinstance(v, list)}
            handle.write(json.dumps({"stage": stage, **scalars}) + "\n")
    summary = {
        "teacher": str(source),
        "attention": result.recipe.model.attention.name,
        "img_size": result.recipe.model.img_size,
        "stage1": dataclasses.asdict(result.transfer) if result.transfer else None,
        "stage2": dataclasses.asdict(result.finetune) if result.finetune else None,
    }
    (run_dir / "conversion.json").write_text(json.dumps(summary, indent=1) + "\n")
    return run_dir
