"""A recipe's training as stages: the runs before the one that trains on the labels, then that run.

`train(recipe, run_dir)` is what tools/train.py runs: under `train.pretrain` the model first learns its own training
inputs (`pretrain`, `zoo.train.self_pretrain`'s objective) as a run of its own into `<run_dir>/pretrain`, then the
recipe's Trainer fine-tunes it; a resumed run never pretrains again (its checkpoint holds the pretrained weights and
records that they are). `build_trainer` stops before `fit`, for a caller that inspects the run. `run_stage` is one
stage: a Trainer run that trains a given model in place on an objective of its own (self-pretraining here, the two
stages of `zoo.convert.run`).

The recipe's run builds its parts (`zoo.train.parts.build_parts`: the seed, the splits, the model) before pretraining,
as a run without it builds them, and its Trainer takes them as pretraining left them: the fine-tuning's random draws
follow the pretraining's, never replay them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from ._objective import Objective
from .loop import Trainer, resume_from
from .parts import build_parts
from .self_pretrain import PretrainObjective, pretrain_recipe

if TYPE_CHECKING:
    from ..config import Recipe
    from ..models.sequence import SequenceModel

__all__ = ["build_trainer", "pretrain", "run_stage", "train"]


def train(recipe: Recipe, run_dir: str | Path, *, resume: bool | str = False) -> dict:
    """Train `recipe` into `run_dir` (pretraining first where the recipe asks and the run does not resume); returns
    the last evaluation. `resume` as `Trainer`'s: False, True (`last`), `last` or `best`."""
    return build_trainer(recipe, run_dir, resume=resume).fit()


def build_trainer(recipe: Recipe, run_dir: str | Path, *, resume: bool | str = False) -> Trainer:
    """The Trainer of `recipe`'s run into `run_dir`, ready to `fit`: its model pretrained first under
    `train.pretrain`, unless the run resumes."""
    if recipe.train.pretrain is None or resume_from(resume):
        return Trainer(recipe, run_dir, resume=resume)
    parts = build_parts(recipe, Path(run_dir))
    pretrain(recipe, parts.model, run_dir)
    return Trainer(recipe, run_dir, parts=parts, pretrained=True)


def run_stage(recipe: Recipe, run_dir: str | Path, model: nn.Module, objective: Objective) -> Trainer:
    """A stage trained as a Trainer run of its own: `model` trained in place on `objective`, with `recipe`'s run
    settings, into `run_dir`; what the run prepared is released afterwards. Returns the fitted Trainer."""
    run = Trainer(recipe, Path(run_dir), model=model, objective=objective)
    run.fit()
    run.accelerator.free_memory()
    return run


def pretrain(recipe: Recipe, model: SequenceModel, run_dir: str | Path) -> list[dict]:
    """Train `model`'s embedding and backbone in place on `recipe.train.pretrain`'s objective (the training split:
    inputs only, labels unused), as a stage into `run_dir/pretrain`, with everything a run has (the recipe's optimizer
    and layer decay, its schedule warmed up over `pretrain.warmup_steps`, clipping, accumulation, mixed precision,
    ddp / fsdp, non-finite handling, checkpoints, trackers) and `pretrain_recipe`'s settings. Returns one record per
    epoch (also `run_dir/pretrain.jsonl`). Call it before preparing the fine-tuning objects: what its run prepared is
    released.
    """
    folder = Path(run_dir) / "pretrain"
    with _frozen(model.backbone.attn_pool):
        run = run_stage(pretrain_recipe(recipe), folder, model, PretrainObjective(recipe.train.pretrain))
    records = [_record(json.loads(line)) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    if run.accelerator.is_main_process:
        (Path(run_dir) / "pretrain.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


@contextmanager
def _frozen(module: nn.Module | None) -> Iterator[None]:
    """Parameters the pretraining forward never reaches (the attention pool) are frozen while it runs, so that
    data-parallel training finds no parameter without a gradient."""
    params = [] if module is None else [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _record(evaluation: dict) -> dict:
    """A record of pretrain.jsonl from the pretraining run's evaluation record (metrics.jsonl)."""
    return {
        "pretrain_epoch": evaluation["epoch"],
        "pretrain_step": evaluation["step"],
        "loss": evaluation["train_loss"],
        "token_top1": evaluation.get("token_top1"),
        "samples_per_s": evaluation["samples_per_s"],
    }
