"""Evaluate a trained run directory on a split: metrics through torchmetrics, a confusion-matrix plot."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from .engine import build_model, build_split, evaluate, find_checkpoint, resolve_mixed_precision
from .recipe import load_recipe

__all__ = ["evaluate_run", "resolve_weights", "plot_confusion"]


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
    ax.imshow(values, cmap="Blues")
    ax.set(xticks=range(len(names)), yticks=range(len(names)), xticklabels=names, yticklabels=names,
           xlabel="predicted", ylabel="true")
    threshold = values.max().item() / 2
    for (row, col), count in zip(torch.cartesian_prod(torch.arange(len(names)), torch.arange(len(names))).tolist(),
                                 values.flatten().tolist()):
        ax.text(col, row, count, ha="center", va="center", color="white" if count > threshold else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def evaluate_run(run_dir: Path, *, checkpoint: str = "best", split: str = "test") -> dict:
    """Metrics of `run_dir`'s checkpoint on `split`, with the confusion matrix saved as a PNG beside it."""
    recipe_path = Path(run_dir) / "recipe.yaml"
    if not recipe_path.is_file():
        raise FileNotFoundError(f"{recipe_path} does not exist: is {run_dir} a run directory of tools/train.py?")
    recipe = load_recipe(recipe_path)
    # The checkpoint holds every weight: do not fetch pretrained ones again.
    recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, pretrained=False,
                                                                   pretrained_file=None))
    weights = resolve_weights(Path(run_dir), checkpoint)
    dataset = build_split(recipe, split)
    model = build_model(recipe, dataset.num_classes, dataset.in_chans)
    model.load_state_dict(load_file(str(weights)))
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(recipe.train.mixed_precision))
    batch_size = recipe.data.eval_batch_size or recipe.data.batch_size
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=recipe.data.num_workers)
    model, loader = accelerator.prepare(model, loader)
    names = list(dict.fromkeys([*recipe.metrics, "top1", "f1", "confusion"]))
    metrics = evaluate(model, loader, accelerator, names, dataset.num_classes)
    png = Path(run_dir) / f"confusion_{split}.png"
    if accelerator.is_main_process:
        plot_confusion(metrics["confusion"], png, getattr(dataset, "classes", None))
    return {"run_dir": str(run_dir), "checkpoint": str(weights), "split": split, "metrics": metrics,
            "confusion_png": str(png)}
