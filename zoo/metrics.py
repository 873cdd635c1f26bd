"""Classification metrics through torchmetrics, named as recipes name them."""
from __future__ import annotations

from typing import Sequence

import torch
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

__all__ = ["CLASSIFICATION_METRICS", "build_metrics", "metrics_to_python"]

CLASSIFICATION_METRICS = ("top1", "top5", "f1", "confusion")


def build_metrics(names: Sequence[str], num_classes: int) -> MetricCollection:
    """`top1`, `top5` (only when there are at least 5 classes), macro `f1`, `confusion` matrix."""
    factories = {
        "top1": lambda: MulticlassAccuracy(num_classes, top_k=1, average="micro"),
        "top5": lambda: MulticlassAccuracy(num_classes, top_k=5, average="micro"),
        "f1": lambda: MulticlassF1Score(num_classes, average="macro"),
        "confusion": lambda: MulticlassConfusionMatrix(num_classes),
    }
    unknown = [name for name in names if name not in factories]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; allowed: {', '.join(CLASSIFICATION_METRICS)}")
    chosen = [name for name in names if name != "top5" or num_classes >= 5]
    return MetricCollection({name: factories[name]() for name in chosen})


def metrics_to_python(values: dict[str, torch.Tensor]) -> dict[str, float | list]:
    """Scalars to floats, the confusion matrix to nested lists of ints (JSON-ready)."""
    return {name: value.tolist() if value.dim() else float(value) for name, value in values.items()}
