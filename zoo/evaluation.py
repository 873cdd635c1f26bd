"""Evaluate a trained run directory on a split: metrics through torchmetrics, a confusion-matrix plot for the
classification tasks, and the baselines a task is judged against (`baselines`): the GC-content nearest-mean
rule for genomes, seasonal-naive and linear forecasts for the forecasting sets, all on the same split."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

import torch
from accelerate import Accelerator
from safetensors.torch import load_model
from torch.utils.data import Dataset

from .data import gc_nearest_mean_accuracy, linear_forecast_scores, seasonal_naive_scores
from .engine import (
    build_loader,
    build_split,
    evaluate,
    find_checkpoint,
    model_for,
    num_outputs,
    resolve_mixed_precision,
)
from .recipe import Recipe, load_recipe

__all__ = ["baselines", "evaluate_run", "resolve_weights", "plot_confusion"]

# the season of each forecasting set in steps, for the seasonal-naive baseline (elecdemand: a day of half-hours)
_SEASONS = {"elecdemand": 48}


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


def plot_confusion(matrix: Sequence[Sequence[int]], path: Path, class_names: Optional[Sequence[str]] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = torch.tensor(matrix)
    names = list(class_names or range(len(values)))
    fig, ax = plt.subplots(figsize=(1 + 0.6 * len(names), 1 + 0.6 * len(names)))
    # a NumPy array: matplotlib's conversion of a tensor goes through a deprecated __array__ call
    ax.imshow(values.numpy(), cmap="Blues")
    ax.set(xticks=range(len(names)), yticks=range(len(names)), xticklabels=names, yticklabels=names,
           xlabel="predicted", ylabel="true")
    threshold = values.max().item() / 2
    for (row, col), count in zip(torch.cartesian_prod(torch.arange(len(names)), torch.arange(len(names))).tolist(),
                                 values.flatten().tolist()):
        ax.text(col, row, count, ha="center", va="center", color="white" if count > threshold else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def baselines(recipe: Recipe, train_set: Dataset, dataset: Dataset, split: str) -> dict[str, dict[str, float]]:
    """Scores of the simple rules the task's model should beat, on the same split: genomes -> GC-content
    nearest mean `{"gc_nearest_mean": {"top1": ...}}`; forecasting -> `{"seasonal_naive": {"mse", "mae"},
    "linear": {"mse", "mae"}}` (the seasonal one where the season is known); others -> `{}`."""
    data = recipe.data
    if data.name == "genomes":
        accuracy = gc_nearest_mean_accuracy(
            split, window=dataset.window, num_windows=len(dataset), num_train_windows=len(train_set), seed=data.seed,
            root=data.root,
        )
        return {"gc_nearest_mean": {"top1": accuracy}}
    if recipe.task != "forecast":
        return {}
    scores = {"linear": linear_forecast_scores(train_set, dataset)}
    if data.name in _SEASONS and _SEASONS[data.name] <= dataset.lookback:
        scores["seasonal_naive"] = seasonal_naive_scores(dataset, period=_SEASONS[data.name])
    return scores


def evaluate_run(run_dir: Path, *, checkpoint: str = "best", split: str = "test") -> dict:
    """Metrics of `run_dir`'s checkpoint on `split` with the task's baselines, and for the classification tasks
    the confusion matrix saved as a PNG beside it (`confusion_png`, None for the others)."""
    recipe_path = Path(run_dir) / "recipe.yaml"
    if not recipe_path.is_file():
        raise FileNotFoundError(f"{recipe_path} does not exist: is {run_dir} a run directory of tools/train.py?")
    recipe = load_recipe(recipe_path)
    # The checkpoint holds every weight: do not fetch pretrained ones again.
    recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, pretrained=False,
                                                                   pretrained_file=None))
    weights = resolve_weights(Path(run_dir), checkpoint)
    dataset = build_split(recipe, split)
    # A 1-D model is sized from its training split (length, channels, classes), as in training.
    train_set = build_split(recipe, "train") if recipe.model.kind == "sequence" else dataset
    model = model_for(recipe, train_set)
    # load_model, not load_state_dict: the file holds tied weights (a language model's embeddings) once
    load_model(model, str(weights))
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(recipe.train.mixed_precision))
    loader = build_loader(recipe, dataset, train=False)
    model, loader = accelerator.prepare(model, loader)
    classifies = recipe.task in ("classification", "token_classification")
    names = list(dict.fromkeys([*recipe.metrics, *(("top1", "f1", "confusion") if classifies else ())]))
    metrics = evaluate(model, loader, accelerator, names, num_outputs(recipe, train_set), recipe.task)
    png = Path(run_dir) / f"confusion_{split}.png" if classifies else None
    if png is not None and accelerator.is_main_process:
        plot_confusion(metrics["confusion"], png, getattr(dataset, "classes", None))
    return {"run_dir": str(run_dir), "checkpoint": str(weights), "split": split, "task": recipe.task,
            "metrics": metrics, "baselines": baselines(recipe, train_set, dataset, split),
            "confusion_png": None if png is None else str(png)}
