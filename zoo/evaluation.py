"""Evaluate a trained run directory on a split: the task's metrics through torchmetrics, a confusion-matrix plot
where the task counts classes, and the baselines the dataset is judged against (its `baselines(train_set)`: the
GC-content nearest-mean rule for genomes, seasonal-naive and linear forecasts for the forecasting sets), all on the
same split."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import load_model
from torch.utils.data import Dataset

from .engine import build_loader, build_split, evaluate, find_checkpoint, resolve_mixed_precision
from .model_kinds import get_model_kind
from .recipe import load_recipe

__all__ = ["baselines", "evaluate_run", "plot_confusion", "resolve_weights"]


def resolve_weights(run_dir: Path, checkpoint: str) -> Path:
    """`best`/`last` of the run, a checkpoint directory, or a `.safetensors` file -> the weights file."""
    if checkpoint in ("best", "last"):
        found = find_checkpoint(run_dir, checkpoint)
        if found is None:
            raise FileNotFoundError(f"no {checkpoint!r} checkpoint in {run_dir / 'checkpoints'}")
        path = found
    else:
        path = Path(checkpoint)
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint weights {path} do not exist")
    return path


def plot_confusion(matrix: Sequence[Sequence[int]], path: Path, class_names: Sequence[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = torch.tensor(matrix)
    names = list(class_names or range(len(values)))
    fig, ax = plt.subplots(figsize=(1 + 0.6 * len(names), 1 + 0.6 * len(names)))
    # a NumPy array: matplotlib's conversion of a tensor goes through a deprecated __array__ call
    ax.imshow(values.numpy(), cmap="Blues")
    ax.set(
        xticks=range(len(names)),
        yticks=range(len(names)),
        xticklabels=names,
        yticklabels=names,
        xlabel="predicted",
        ylabel="true",
    )
    threshold = values.max().item() / 2
    for (row, col), count in zip(
        torch.cartesian_prod(torch.arange(len(names)), torch.arange(len(names))).tolist(), values.flatten().tolist()
    ):
        ax.text(col, row, count, ha="center", va="center", color="white" if count > threshold else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def baselines(train_set: Dataset, dataset: Dataset) -> dict[str, dict[str, float]]:
    """Scores of the simple rules the model should beat on `dataset` (the dataset's own `baselines(train_set)`):
    genomes -> `{"gc_nearest_mean": {"top1": ...}}`; forecasting -> `{"linear": {"mse", "mae"}, "seasonal_naive":
    {...}}` (the seasonal one where the season is known); `{}` for a dataset without baselines."""
    rules = getattr(dataset, "baselines", None)
    return rules(train_set) if callable(rules) else {}


def evaluate_run(run_dir: Path, *, checkpoint: str = "best", split: str = "test") -> dict:
    """Metrics of `run_dir`'s checkpoint on `split` with the task's baselines, and for the classification tasks
    the confusion matrix saved as a PNG beside it (`confusion_png`, None for the others)."""
    recipe_path = Path(run_dir) / "recipe.yaml"
    if not recipe_path.is_file():
        raise FileNotFoundError(f"{recipe_path} does not exist: is {run_dir} a run directory of tools/train.py?")
    recipe = load_recipe(recipe_path)
    # The checkpoint holds every weight: do not fetch pretrained ones again.
    recipe = dataclasses.replace(
        recipe, model=dataclasses.replace(recipe.model, pretrained=False, pretrained_file=None)
    )
    weights = resolve_weights(Path(run_dir), checkpoint)
    dataset = build_split(recipe, split)
    # The model is sized from its training split (classes, length, channels), as in training.
    train_set = build_split(recipe, "train")
    kind = get_model_kind(recipe.model.kind)
    task = kind.task(recipe)
    model = kind.build(recipe, train_set, task)
    # load_model, not load_state_dict: the file holds tied weights (a language model's embeddings) once
    load_model(model, str(weights))
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(recipe.train.mixed_precision))
    loader = build_loader(recipe, dataset, train=False)
    model, loader = accelerator.prepare(model, loader)
    names = list(dict.fromkeys([*recipe.metrics, *task.eval_metrics]))
    metrics = evaluate(
        model,
        loader,
        accelerator,
        task=task,
        model_inputs=kind.inputs,
        metric_names=names,
        num_classes=task.num_outputs(train_set),
    )
    png = Path(run_dir) / f"confusion_{split}.png" if "confusion" in metrics else None
    if png is not None and accelerator.is_main_process:
        plot_confusion(metrics["confusion"], png, getattr(dataset, "classes", None))
    return {
        "run_dir": str(run_dir),
        "checkpoint": str(weights),
        "split": split,
        "task": recipe.task,
        "metrics": metrics,
        "baselines": baselines(train_set, dataset),
        "confusion_png": None if png is None else str(png),
    }
