"""tools/convert.py's pipeline: a softmax-trained ViT converted to the attention and resolution of a recipe, on the
recipe's data, by `zoo.convert.model`'s stages, and written as a run directory.

`convert_run(teacher, recipe)`:

1. the student is the model `recipe` builds (its attention, its `img_size`, its data's classes); the teacher (a run
   directory of tools/train.py, or a timm-layout weights file read into the recipe's architecture with softmax
   attention) is brought to the student's resolution (`pos_embed` resampled) and its weights are loaded into the
   student: every timm weight, a new head where the class count differs, the variant's own attention parameters
   kept at their initialisation;
2. stage 1, `zoo.convert.model.transfer_attention`: only those parameters train, to match the teacher's attention
   outputs block by block on the recipe's training images (labels unused); variants without any skip it;
3. stage 2, `zoo.convert.model.finetune`: the task loss on all weights, distilled from the teacher's logits when the
   teacher's head predicts the same classes.

With `run_dir` the result is a run directory of tools/train.py's layout: `recipe.yaml` (the recipe that builds the
student), `model.json`, `checkpoints/best` and `last`, `metrics.jsonl` (one record per evaluated stage) and
`conversion.json`; tools/eval.py, tools/predict.py and `zoo.load_model` read it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate.utils import set_seed
from torch import Tensor, nn
from torch.utils.data import DataLoader

from .._validate import check_int
from .._weights import read_weights
from ..config import Recipe
from ..evaluate import evaluate
from ..hub._run_weights import without_pretrained
from ..hub.load import is_model_source, load_model
from ..hub.runs import describe_model, write_run
from ..kinds import get_model_kind, sizes_of
from ..models.vit import load_state_dict_into
from ..train.loop import build_loader, build_split
from .model import FinetuneReport, TransferReport, finetune, transfer_attention

__all__ = ["ConversionResult", "ImagePairs", "convert_run"]

_logger = logging.getLogger(__name__)

STAGES = ("swap", "stage1", "stage2")


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


class ImagePairs:
    """`(images, labels)` of every `{"image", "label"}` batch of `loader`, iterable again and again (the form
    `zoo.convert.model`'s stages take)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return ((batch["image"], batch["label"]) for batch in self.loader)


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
        return teacher, teacher.num_classes == task.num_outputs(sizes)
    softmax = dataclasses.replace(recipe.model.attention, name="softmax", options={})
    model = recipe.model.replace(attention=softmax, global_blocks=[])
    kind = get_model_kind(recipe.model.kind)
    teacher = kind.build(dataclasses.replace(recipe, model=model), sizes, task)
    report = load_state_dict_into(teacher, read_weights(source), str(source))
    return teacher.eval(), not any(key.startswith("head") for key in report.dropped_keys)


def convert_run(
    teacher: str | Path,
    recipe: Recipe,
    *,
    stage1_steps: int = 100,
    stage2_steps: int = 200,
    stage1_lr: float = 1e-2,
    stage2_lr: float = 1e-4,
    distill_weight: float = 0.5,
    lora_rank: int | None = None,
    eval_split: str | None = "val",
    run_dir: str | Path | None = None,
    log_every: int = 0,
) -> ConversionResult:
    """Convert `teacher` (a run directory, checkpoint or save_pretrained folder, or a timm-layout weights file) to
    the model `recipe` builds, in `stage1_steps` steps of attention transfer and `stage2_steps` of fine-tuning on
    the recipe's training split (batches of `data.batch_size`); evaluated on `eval_split` after each stage (None:
    never) and written to `run_dir` when given (see the module docstring)."""
    check_int("stage1_steps", stage1_steps, 0)
    check_int("stage2_steps", stage2_steps, 0)
    kind = get_model_kind(recipe.model.kind)
    if kind.name != "vit":
        raise ValueError(f"tools/convert.py converts ViTs; the recipe's model.kind is {kind.name!r}")
    recipe = without_pretrained(recipe)
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
    pairs = ImagePairs(build_loader(recipe, train_set, train=True))
    result.metrics.update(_evaluated("swap", student, recipe, eval_split))
    result.transfer = transfer_attention(teacher_model, student, pairs, stage1_steps, lr=stage1_lr, log_every=log_every)
    if not result.transfer.skipped:
        result.metrics.update(_evaluated("stage1", student, recipe, eval_split))
    distill = distill_weight if same_classes else 0.0
    if distill_weight and not same_classes:
        _logger.warning("the teacher's head predicts other classes than the recipe's: no distillation in stage 2")
    result.finetune = finetune(
        student,
        pairs,
        stage2_steps,
        lr=stage2_lr,
        teacher=teacher_model if distill else None,
        distill_weight=distill,
        lora_rank=lora_rank,
        loss_fn=lambda logits, labels: task.loss(logits, labels, label_smoothing=recipe.train.label_smoothing),
        log_every=log_every,
    )
    result.metrics.update(_evaluated("stage2", student, recipe, eval_split))
    student.eval()
    if run_dir is not None:
        description = describe_model(recipe, train_set, task, sizes)
        result.run_dir = _write(Path(run_dir), result, source, description, eval_split)
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
