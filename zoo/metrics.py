"""Metrics of every task through torchmetrics, named as recipes name them.

- classification: `top1` (accuracy), `top5`, `f1` (macro), `confusion`, `mcc` (Matthews), `auroc` (macro,
  one-vs-rest);
- token_classification: the same per position, positions labelled `IGNORE_INDEX` (-100) or padded left out;
- forecast: `mse`, `mae` over every predicted step and channel;
- causal_lm: `perplexity` and next-token `top1`, padded positions left out.

`task_inputs` turns a model's outputs and the batch's targets into the `(preds, target)` pair that every metric
of the task takes, so one `MetricCollection.update` serves them all.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassAUROC,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassMatthewsCorrCoef,
)
from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError
from torchmetrics.text import Perplexity

__all__ = [
    "CLASSIFICATION_METRICS",
    "IGNORE_INDEX",
    "METRICS",
    "DEFAULT_METRICS",
    "TASK_METRICS",
    "build_metrics",
    "metrics_to_python",
    "selection_metric",
    "task_inputs",
]

IGNORE_INDEX = -100
CLASSIFICATION_METRICS = ("top1", "top5", "f1", "confusion", "mcc", "auroc")
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "classification": CLASSIFICATION_METRICS,
    "token_classification": ("top1", "f1", "confusion", "mcc"),
    "forecast": ("mse", "mae"),
    "causal_lm": ("perplexity", "top1"),
}
METRICS = tuple(dict.fromkeys(name for names in TASK_METRICS.values() for name in names))
# what a recipe that names no metrics reports for its task
DEFAULT_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("top1", "top5", "f1"),
    "token_classification": ("top1", "f1", "mcc"),
    "forecast": ("mse", "mae"),
    "causal_lm": ("perplexity", "top1"),
}
# the validation metric that picks the best checkpoint, and whether higher is better; -loss when not computed
_SELECTION = {
    "classification": ("top1", True),
    "token_classification": ("f1", True),
    "forecast": ("mse", False),
    "causal_lm": ("perplexity", False),
}


class _FlatPerplexity(Perplexity):
    """torchmetrics' Perplexity on flattened positions: logits `[n, v]`, targets `[n]` (-100 ignored)."""

    def update(self, preds: Tensor, target: Tensor) -> None:
        super().update(preds[None], target[None])


def _classification_factories(num_classes: int, ignore_index: int | None) -> dict:
    common = {"num_classes": num_classes, "ignore_index": ignore_index}
    return {
        "top1": lambda: MulticlassAccuracy(top_k=1, average="micro", **common),
        "top5": lambda: MulticlassAccuracy(top_k=5, average="micro", **common),
        "f1": lambda: MulticlassF1Score(average="macro", **common),
        "confusion": lambda: MulticlassConfusionMatrix(**common),
        "mcc": lambda: MulticlassMatthewsCorrCoef(**common),
        "auroc": lambda: MulticlassAUROC(average="macro", **common),
    }


def _factories(task: str, num_classes: int) -> dict:
    if task == "classification":
        return _classification_factories(num_classes, None)
    if task == "token_classification":
        return _classification_factories(num_classes, IGNORE_INDEX)
    if task == "forecast":
        return {"mse": MeanSquaredError, "mae": MeanAbsoluteError}
    return {
        "perplexity": lambda: _FlatPerplexity(ignore_index=IGNORE_INDEX),
        "top1": lambda: MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE_INDEX),
    }


def build_metrics(names: Sequence[str], num_classes: int, task: str = "classification") -> MetricCollection:
    """The metrics `names` of `task`; `num_classes` is the vocabulary size for causal_lm (unused for forecast).

    `top5` is left out when there are fewer than 5 classes.
    """
    if task not in TASK_METRICS:
        raise ValueError(f"unknown task {task!r}; allowed: {', '.join(TASK_METRICS)}")
    factories = _factories(task, num_classes)
    unknown = [name for name in names if name not in factories]
    if unknown:
        raise ValueError(f"unknown metrics {unknown} for task {task!r}; allowed: {', '.join(TASK_METRICS[task])}")
    chosen = [name for name in names if name != "top5" or num_classes >= 5]
    metrics: dict[str, Metric] = {name: factories[name]() for name in chosen}
    return MetricCollection(metrics)


def task_inputs(task: str, outputs: Tensor, targets: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`(preds, target)` for the task's metrics.

    classification: logits `[b, k]`, labels `[b]` -> unchanged. token_classification: logits `[b, l, k]`, labels
    `[b, l]`, mask `[b, l]` -> `[b l, k]`, `[b l]` with padded positions -100. forecast: `[b, t, c]` twice ->
    unchanged. causal_lm: logits `[b, n, v]`, tokens `[b, n]`, mask `[b, n]` -> the logits of positions
    `0 .. n - 2` `[b (n - 1), v]` and the tokens they predict `[b (n - 1)]`, padded ones -100.
    """
    outputs = outputs.float()
    if task in ("classification", "forecast"):
        return outputs, targets
    if task == "causal_lm":
        outputs, targets = outputs[:, :-1], targets[:, 1:]
        mask = None if mask is None else mask[:, 1:]
    if mask is not None:
        targets = targets.masked_fill(~mask, IGNORE_INDEX)
    return outputs.flatten(0, 1), targets.flatten()


def selection_metric(task: str, metric_names: Sequence[str]) -> tuple[str, bool]:
    """The validation metric that picks the best checkpoint and whether higher is better: top1 (classification),
    f1 (token_classification), mse (forecast), perplexity (causal_lm); the loss when that one is not computed."""
    name, higher_is_better = _SELECTION[task]
    return (name, higher_is_better) if name in metric_names else ("loss", False)


def metrics_to_python(values: dict[str, torch.Tensor]) -> dict[str, float | list]:
    """Scalars to floats, the confusion matrix to nested lists of ints (JSON-ready)."""
    return {name: value.tolist() if value.dim() else float(value) for name, value in values.items()}
