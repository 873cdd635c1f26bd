"""`causal_lm`: the next token at every position, for the 1-D model with causal attention."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..data._interface import IGNORE_INDEX
from .heads import LanguageModelHead

if TYPE_CHECKING:  # torchmetrics imports matplotlib: loaded only when metrics are built
    from torch.utils.data import Dataset

    from ..data._sizes import ModelSizes
from ._base import HeadSpec, Task, _require, register_task
from ._baselines import label_counts, majority_top1, sample_labels


@dataclass(frozen=True)
class CausalLanguageModelling(Task):
    """The next token at every position: logits `[b, n, v]` at position i predict `tokens[:, i + 1]`."""

    name = "causal_lm"
    target_key = "tokens"
    metrics = ("perplexity", "top1")
    default_metrics = ("perplexity", "top1")
    selection = ("perplexity", False)
    inputs = ("dna",)
    model_options = ("tie_embeddings",)
    per_position = True
    causal = True
    ignore_index = IGNORE_INDEX

    def _loss(self, outputs: Tensor, targets: Tensor, mask: Tensor | None, label_smoothing: float) -> Tensor:
        """Next-token cross-entropy; targets at padded positions are ignored."""
        logits, next_tokens = self.metric_inputs(outputs, targets, mask)
        return F.cross_entropy(logits, next_tokens, ignore_index=IGNORE_INDEX)

    def loss_units(self, targets: Tensor, mask: Tensor | None) -> int:
        return int(mask[:, 1:].sum()) if mask is not None else targets[:, 1:].numel()

    def metric_inputs(self, outputs: Tensor, targets: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """logits `[b, n, v]`, tokens `[b, n]`, mask `[b, n]` -> the logits of positions `0 .. n - 2`
        `[(b n'), v]` and the tokens they predict `[(b n')]`, padded ones `IGNORE_INDEX` (n' = n - 1)."""
        next_tokens = targets[:, 1:]
        if mask is not None:
            next_tokens = next_tokens.masked_fill(~mask[:, 1:], IGNORE_INDEX)
        return rearrange(outputs[:, :-1].float(), "b n v -> (b n) v"), next_tokens.flatten()

    def baselines(self, train_set: Dataset, dataset: Dataset, num_classes: int) -> dict[str, dict[str, float]]:
        """`majority_token`: the token most frequent among the training split's predicted tokens (every kept one
        but each sample's first) predicted at every position, its top-1 on `dataset`."""
        counts = [label_counts(sample_labels(split, self._next_tokens), num_classes) for split in (train_set, dataset)]
        return {"majority_token": majority_top1(*counts)}

    def _next_tokens(self, item: Mapping[str, Tensor]) -> Tensor:
        """One sample's predicted tokens `[n - 1]`, `IGNORE_INDEX` where its mask leaves a position out."""
        tokens = torch.as_tensor(item[self.target_key])[1:]
        mask = item.get("mask")
        if mask is None:
            return tokens
        return tokens.masked_fill(~torch.as_tensor(mask, dtype=torch.bool)[1:], IGNORE_INDEX)

    def model_sizes(self, sizes: ModelSizes) -> dict[str, Any]:
        return {"vocab_size": sizes.vocab_size}

    def num_outputs(self, sizes: ModelSizes) -> int:
        return sizes.vocab_size

    def build_head(self, spec: HeadSpec) -> nn.Module:
        _require(self, "vocab_size", spec.vocab_size)
        return LanguageModelHead(spec.dim, spec.vocab_size, tied_weight=spec.tied_weight)


register_task(CausalLanguageModelling())
