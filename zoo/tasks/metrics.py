"""Metrics through torchmetrics, named as recipes name them; which ones a task allows is the task's (`zoo.tasks`).

- `top1` (accuracy), `top5`, `f1` (macro), `confusion`, `mcc` (Matthews), `auroc` (macro, one-vs-rest): classes,
  per sample or per position;
- `miou` (mean intersection over union, macro over the classes present in targets or predictions), `iou` (per
  class), `pixel_accuracy`: classes per pixel (segmentation);
- `mse`, `mae`: over every predicted step and channel;
- `perplexity`: of next-token logits.

Every metric takes the same `(preds, target)` pair (a task's `metric_inputs`), so one `MetricCollection.update`
serves them all; targets equal to `ignore_index` are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassAUROC,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassJaccardIndex,
    MulticlassMatthewsCorrCoef,
)
from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError
from torchmetrics.text import Perplexity

__all__ = ["METRICS", "build_metrics", "metrics_to_python"]


class _FlatPerplexity(Perplexity):
    """torchmetrics' Perplexity on flattened positions: logits `[n, v]`, targets `[n]`."""

    def update(self, preds: Tensor, target: Tensor) -> None:
        super().update(preds[None], target[None])


# name -> builder taking (number of classes, ignore_index)
_BUILDERS: dict[str, Callable[[int, int | None], Metric]] = {
    "top1": lambda k, ignore: MulticlassAccuracy(num_classes=k, top_k=1, average="micro", ignore_index=ignore),
    "top5": lambda k, ignore: MulticlassAccuracy(num_classes=k, top_k=5, average="micro", ignore_index=ignore),
    "f1": lambda k, ignore: MulticlassF1Score(num_classes=k, average="macro", ignore_index=ignore),
    "confusion": lambda k, ignore: MulticlassConfusionMatrix(num_classes=k, ignore_index=ignore),
    "mcc": lambda k, ignore: MulticlassMatthewsCorrCoef(num_classes=k, ignore_index=ignore),
    "auroc": lambda k, ignore: MulticlassAUROC(num_classes=k, average="macro", ignore_index=ignore),
    "miou": lambda k, ignore: MulticlassJaccardIndex(num_classes=k, average="macro", ignore_index=ignore),
    "iou": lambda k, ignore: MulticlassJaccardIndex(num_classes=k, average="none", ignore_index=ignore),
    "pixel_accuracy": lambda k, ignore: MulticlassAccuracy(num_classes=k, average="micro", ignore_index=ignore),
    "mse": lambda k, ignore: MeanSquaredError(),
    "mae": lambda k, ignore: MeanAbsoluteError(),
    "perplexity": lambda k, ignore: _FlatPerplexity(ignore_index=ignore),
}
METRICS = tuple(_BUILDERS)


def build_metrics(names: Sequence[str], num_classes: int, *, ignore_index: int | None = None) -> MetricCollection:
    """The metrics `names` over `num_classes` classes (unused by mse, mae, perplexity); targets equal to
    `ignore_index` count for nothing."""
    unknown = [name for name in names if name not in _BUILDERS]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; known: {', '.join(METRICS)}")
    return MetricCollection({name: _BUILDERS[name](num_classes, ignore_index) for name in names})


def metrics_to_python(values: dict[str, torch.Tensor]) -> dict[str, float | list]:
    """Scalars to floats, the confusion matrix to nested lists of ints (JSON-ready)."""
    return {name: value.tolist() if value.dim() else float(value) for name, value in values.items()}
