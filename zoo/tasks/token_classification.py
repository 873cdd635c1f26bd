"""`token_classification`: one class per input position (`IGNORE_INDEX` where nothing is asked), loss and accuracy over
the labelled positions only; `score: labelled` has the training loss score only those positions (`loss_positions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..data._interface import IGNORE_INDEX
from .heads import TokenClassificationHead

if TYPE_CHECKING:  # torchmetrics imports matplotlib: loaded only when metrics are built
    from torch.utils.data import Dataset

    from ..data._sizes import ModelSizes
from ._base import HeadSpec, Task, _require, register_task
from ._baselines import label_counts, majority_top1, sample_labels

# all: the training loss reads logits at every position; labelled: only at the labelled, kept ones
SCORES = ("all", "labelled")


@dataclass(frozen=True)
class TokenClassification(Task):
    """One class per input position: logits `[b, l, k]`, labels `[b, l]` (`IGNORE_INDEX` where there is none)."""

    name = "token_classification"
    target_key = "labels"
    metrics = ("top1", "f1", "confusion", "mcc")
    default_metrics = ("top1", "f1", "mcc")
    eval_metrics = ("top1", "f1", "confusion")
    selection = ("f1", True)
    inputs = ("dna", "kmer", "tokens")
    model_options = ("score",)
    per_position = True
    ignore_index = IGNORE_INDEX
    # labelled: training scores only the labelled positions, for probes that label a few of many (the recall
    # probes: the head's logits at every position over a vocabulary of 2 l cost l x 2 l per sample)
    score: Literal[SCORES] = "all"

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"score {self.score!r} is not one of {', '.join(map(repr, SCORES))}")

    def _loss(self, outputs: Tensor, targets: Tensor, mask: Tensor | None, label_smoothing: float) -> Tensor:
        """Mean cross-entropy over kept, labelled positions: logits `[b, l, k]` and labels `[b, l]`, or the rows
        `[p, k]` of `loss_positions` and their labels `[p]` (mask None)."""
        if outputs.ndim == 2:
            return F.cross_entropy(outputs.float(), targets, ignore_index=IGNORE_INDEX)
        logits, labels = self.metric_inputs(outputs, targets, mask)
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)

    def loss_positions(self, targets: Tensor, mask: Tensor | None) -> Tensor | None:
        """`[b, l]`: the labelled, kept positions under `score: labelled`; None (every position) otherwise."""
        return self._counted(targets, mask) if self.score == "labelled" else None

    def loss_units(self, targets: Tensor, mask: Tensor | None) -> int:
        return int(self._counted(targets, mask).sum())

    @staticmethod
    def _counted(targets: Tensor, mask: Tensor | None) -> Tensor:
        """labels `[b, l]`, mask `[b, l]` -> `[b, l]` bool: the positions the loss counts."""
        labelled = targets != IGNORE_INDEX
        return labelled if mask is None else labelled & mask

    def metric_inputs(self, outputs: Tensor, targets: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`[b, l, k]`, `[b, l]`, mask `[b, l]` -> `[(b l), k]`, `[(b l)]` with padded positions `IGNORE_INDEX`."""
        if mask is not None:
            targets = targets.masked_fill(~mask, IGNORE_INDEX)
        return rearrange(outputs.float(), "b l k -> (b l) k"), targets.flatten()

    def baselines(self, train_set: Dataset, dataset: Dataset, num_classes: int) -> dict[str, dict[str, float]]:
        """`majority_label`: the label most frequent over the training split's labelled positions predicted at every
        position, its top-1 over `dataset`'s labelled positions (the positions `top1` counts)."""
        splits = (train_set, dataset)
        counts = [label_counts(sample_labels(split, self._sample_targets), num_classes) for split in splits]
        return {"majority_label": majority_top1(*counts)}

    def _sample_targets(self, item: Mapping[str, Tensor]) -> Tensor:
        """One sample's labels `[l]`, `IGNORE_INDEX` where its mask leaves a position out."""
        labels = torch.as_tensor(item[self.target_key])
        mask = item.get("mask")
        return labels if mask is None else labels.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), IGNORE_INDEX)

    def model_sizes(self, sizes: ModelSizes) -> dict[str, Any]:
        return {"num_classes": sizes.num_classes}

    def num_outputs(self, sizes: ModelSizes) -> int:
        return sizes.num_classes

    def prediction_rows(
        self, meta: dict[str, Any], outputs: Tensor, mask: Tensor | None, description: Mapping[str, Any], top_k: int
    ) -> list[dict[str, Any]]:
        """logits `[l, k]` (a CLS token first when the tokenizer adds one) -> one row per kept position: its label
        and probability."""
        if description["inputs"].get("tokenizer", {}).get("add_cls"):
            outputs, mask = outputs[1:], mask[1:]
        probabilities, labels = outputs.softmax(-1).max(-1)
        names = description.get("label_names")
        # a window's rows say where each position is, not where the window is (`start`, `end`)
        source = {key: value for key, value in meta.items() if key not in ("start", "end")}
        first = meta.get("start", 1)
        rows = []
        for offset in torch.nonzero(mask).flatten().tolist():
            label = labels[offset].item()
            name = names[label] if names else str(label)
            probability = round(probabilities[offset].item(), 6)
            rows.append({**source, "position": first + offset, "label": name, "probability": probability})
        return rows

    def build_head(self, spec: HeadSpec) -> nn.Module:
        _require(self, "num_classes", spec.num_classes)
        return TokenClassificationHead(spec.dim, spec.num_classes, steps=spec.steps, drop=spec.drop)


register_task(TokenClassification())
