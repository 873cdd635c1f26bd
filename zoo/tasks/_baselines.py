"""The trivial rules a task's metric is read against, from label counts: the training split's majority label scored
on the evaluated split, and chance. A task's `baselines` hook reads the labels through `label_counts`.

Letter legend: k - classes, l - positions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..data._interface import IGNORE_INDEX

__all__ = ["label_counts", "majority_top1", "sample_labels"]


def sample_labels(dataset: Dataset, read: Callable[[Any], Any]) -> list[Any]:
    """Every sample's labels, `read` from the sample. A set that knows a sample's label without building the
    sample (`sample_label(index)`: a generated canvas is not rendered for it) is asked that instead."""
    cheap = getattr(dataset, "sample_label", None)
    if callable(cheap):
        return [cheap(index) for index in range(len(dataset))]
    return [read(dataset[index]) for index in range(len(dataset))]


def label_counts(labels: list[Any], num_classes: int) -> np.ndarray:
    """int64 `[k]`: how often each class occurs among `labels` (ints, or tensors of per-position labels whose
    `IGNORE_INDEX` and out-of-range entries, padding and unlabelled positions, count for nothing)."""
    counts = np.zeros(num_classes, dtype=np.int64)
    for label in labels:
        values = torch.as_tensor(label).flatten().numpy()
        values = values[(values != IGNORE_INDEX) & (values >= 0) & (values < num_classes)]
        counts += np.bincount(values, minlength=num_classes)[:num_classes]
    return counts


def majority_top1(train: np.ndarray, evaluated: np.ndarray) -> dict[str, float]:
    """The training split's most frequent label (`train` counts, `[k]`) predicted everywhere, scored on the split
    whose counts are `evaluated` (`[k]`): its top-1 is that label's share of the evaluated labels."""
    majority = int(train.argmax())
    return {"top1": float(evaluated[majority] / max(int(evaluated.sum()), 1))}


def item_target(item: Any, key: str) -> Any:
    """The target of one sample: an image set's `(image, label)` pair or a 1-D set's dict (its `key`); a label
    that `sample_label` gave directly passes through."""
    if isinstance(item, Mapping):
        return item[key]
    if isinstance(item, tuple):
        return item[1]
    return item
