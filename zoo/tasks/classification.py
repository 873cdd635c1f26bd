"""`classification`: one class per sample (an image, a sequence), cross-entropy with label smoothing, top-k
prediction rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.nn.functional as F
from torch import Tensor, nn

from .heads import ClassificationHead

if TYPE_CHECKING:  # torchmetrics imports matplotlib: loaded only when metrics are built
    from torch.utils.data import Dataset

    from ..data._sizes import ModelSizes
from ._base import HeadSpec, Task, _require, _top_k, register_task
from ._baselines import item_target, label_counts, majority_top1, sample_labels


@dataclass(frozen=True)
class Classification(Task):
    """One class per sample: logits `[b, k]`, labels `[b]`."""

    name = "classification"
    target_key = "label"
    metrics = ("top1", "top5", "f1", "confusion", "mcc", "auroc")
    default_metrics = ("top1", "top5", "f1")
    eval_metrics = ("top1", "f1", "confusion")
    selection = ("top1", True)
    inputs = ("dna", "kmer", "series", "tokens")
    model_options = ("pool",)
    label_smoothing = True
    pooled = True

    def _loss(self, outputs: Tensor, targets: Tensor, mask: Tensor | None, label_smoothing: float) -> Tensor:
        return F.cross_entropy(outputs.float(), targets, label_smoothing=label_smoothing)

    def model_sizes(self, sizes: ModelSizes) -> dict[str, Any]:
        return {"num_classes": sizes.num_classes}

    def num_outputs(self, sizes: ModelSizes) -> int:
        return sizes.num_classes

    def baselines(self, train_set: Dataset, dataset: Dataset, num_classes: int) -> dict[str, dict[str, float]]:
        """`majority_class`: the training split's most frequent class predicted for every sample, its top-1 on
        `dataset`; `chance`: a class drawn uniformly, top-1 1 / `num_classes` in expectation."""
        counts = [
            label_counts(sample_labels(split, lambda item: item_target(item, self.target_key)), num_classes)
            for split in (train_set, dataset)
        ]
        return {"majority_class": majority_top1(*counts), "chance": {"top1": 1.0 / num_classes}}

    def prediction_rows(
        self, meta: dict[str, Any], outputs: Tensor, mask: Tensor | None, description: Mapping[str, Any], top_k: int
    ) -> list[dict[str, Any]]:
        """logits `[k]` -> one row: the best classes and their probabilities."""
        return [{**meta, **_top_k(outputs, description.get("label_names"), top_k)}]

    def build_head(self, spec: HeadSpec) -> nn.Module:
        _require(self, "num_classes", spec.num_classes)
        return ClassificationHead(spec.dim, spec.num_classes, channels=spec.folded_channels, drop=spec.drop)


register_task(Classification())
