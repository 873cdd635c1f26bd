"""`causal_token_classification`: `token_classification` with causal attention, each label read from the positions
before it (the recall probes' next-token layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._base import register_task
from .token_classification import TokenClassification

if TYPE_CHECKING:  # torchmetrics imports matplotlib: loaded only when metrics are built
    pass


@dataclass(frozen=True)
class CausalTokenClassification(TokenClassification):
    """`TokenClassification` by a causal model: the label of position i is predicted from positions 0 .. i only
    (the recall probes of `zoo.data.tokens.recall` in their next-token layout, or any per-position label that must not
    read the future). Accuracy is the selection metric: recall probes label few positions, and macro F1 over a
    whole vocabulary averages mostly absent classes."""

    name = "causal_token_classification"
    selection = ("top1", True)
    causal = True


register_task(CausalTokenClassification())
