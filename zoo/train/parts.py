"""What a run is built from before anything is prepared: `build_parts` sets the seed, builds the splits
(`zoo.splits`), reads the run's sizes off the training split and builds the model and its description (`model.json`).

`zoo.train.loop.Trainer` builds its parts here; `zoo.train.stages` builds them first when the model pretrains before
the run (`train.pretrain`), so that the seed, the splits and the model are those of a run without the stage between.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import Dataset

from ..data._sizes import ModelSizes
from ..hub.runs import describe_model
from ..kinds import ModelKind, build_model, get_model_kind, sizes_of
from ..splits import build_split
from ..tasks import Task
from ._compile import dynamo_plugin
from ._tracking import tracker_name
from .distributed import build_accelerator
from .threads import ThreadPolicy, set_threads

if TYPE_CHECKING:
    from ..config import Recipe

__all__ = ["RunParts", "build_parts", "model_for", "resolve_mixed_precision"]


def resolve_mixed_precision(value: str) -> str:
    """`auto` means bf16 on a GPU that supports it, full precision elsewhere."""
    if value != "auto":
        return value
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def model_for(recipe: Recipe, train_set: Dataset) -> nn.Module:
    """The recipe's model (`model.kind`), sized from the training split."""
    return build_model(recipe, sizes_of(recipe, train_set))


@dataclass
class RunParts:
    """What a run builds before it prepares anything: its accelerator (the seed set after it), the model kind and
    task, the splits (no validation split under `train.validate: false`), the run's sizes, read once off the training
    split (every model of the run is built from them), the model, and `model.json`'s description of it (what rebuilds
    the model without the data: `zoo.load_model`)."""

    accelerator: Accelerator
    kind: ModelKind
    task: Task
    train_set: Dataset
    val_set: Dataset | None
    sizes: ModelSizes
    model: nn.Module
    description: dict[str, Any]
    # the intra-op threads this process runs (zoo.train.threads), chosen first
    threads: ThreadPolicy | None = None


def build_parts(recipe: Recipe, run_dir: Path, model: nn.Module | None = None) -> RunParts:
    """The parts of `recipe`'s run into `run_dir`, around `model` (default: the one the recipe builds). The seed is
    set before the splits and the model are built: the same recipe builds the same parts. Torch's threads are set
    first (`zoo.train.threads`: train.threads, OMP_NUM_THREADS, else this process's share of the cores)."""
    cfg = recipe.train
    threads = set_threads(cfg.threads, recipe.data.num_workers)
    accelerator = build_accelerator(
        cfg.distributed,
        # accelerate takes the gloo data-parallel path under torchrun only when told it runs on the CPU
        cpu=not torch.cuda.is_available(),
        mixed_precision=resolve_mixed_precision(cfg.mixed_precision),
        gradient_accumulation_steps=cfg.grad_accum_steps,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=recipe.seed),
        log_with=tracker_name(cfg.log_with),
        project_dir=str(Path(run_dir) / "logs") if cfg.log_with else None,
        # train.compile: accelerate's prepare compiles the model (last, around any DDP wrapper)
        dynamo_plugin=dynamo_plugin(cfg.compile_mode),
    )
    if cfg.deterministic:
        # cuBLAS's deterministic mode needs a fixed workspace, set before its first call
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_seed(recipe.seed, deterministic=cfg.deterministic)
    kind = get_model_kind(recipe.model.kind)
    task = kind.task(recipe)
    train_set = build_split(recipe, "train")
    val_set = build_split(recipe, "val") if cfg.validate else None
    sizes = sizes_of(recipe, train_set)
    model = kind.build(recipe, sizes, task) if model is None else model
    description = describe_model(recipe, train_set, task, sizes)
    return RunParts(accelerator, kind, task, train_set, val_set, sizes, model, description, threads)
