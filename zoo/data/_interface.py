"""What a dataset builder's split offers the rest of the zoo: the one place its attributes are written down and read.

A split is a `torch.utils.data.Dataset` (`__len__`, `__getitem__`; samples as ``zoo.data._registry`` describes
them). Besides its samples, a split may carry the attributes of `TrainingSplit`; each is optional, a set defines
those that apply to it. A run reads them once, from its training split, when it starts: the model's sizes
(`zoo.data._sizes.ModelSizes`) and how its inputs were read (`zoo.hub.runs.describe_model`, which `zoo.predict` reads
back). Nothing else reads a dataset's attributes: `split_attribute` is the only reader.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from torch.utils.data import Dataset

__all__ = ["ATTRIBUTES", "IGNORE_INDEX", "TrainingSplit", "sequence_length", "split_attribute"]

# the label of a position nothing is asked of (padding, unlabelled tokens); torch's cross-entropy default
IGNORE_INDEX = -100


class TrainingSplit(Protocol):
    """The attributes a split may define (every one optional; missing or None: does not apply)."""

    # classes of a classification set (token_classification: per position), and their names, one per class
    num_classes: int
    classes: Sequence[str]
    # image channels; a series' channels
    in_chans: int
    # the ids of a `tokens` set's own vocabulary (also a DNA set's, for causal_lm)
    vocab_size: int
    # images: timm's preprocessing of the set (per-channel mean / std, resize interpolation, crop)
    mean: Sequence[float]
    std: Sequence[float]
    interpolation: str
    crop_pct: float
    crop_mode: str
    # 1-D sets: how files were cut (window, stride), DNA's tokenizer (k, overlapping, add_cls), series'
    # z-normalisation, the longest kept input (max_length; Genomic Benchmarks' truncation)
    window: int
    stride: int
    tokenizer: Any
    znorm: bool
    max_length: int
    # the stored sequences, when held in memory (their longest is the input length)
    sequences: Sequence[Sequence[Any]]
    # forecasting: look-back, horizon, the file's columns, which are inputs and which are targets
    lookback: int
    horizon: int
    columns: Sequence[str]
    input_index: Sequence[int]
    target_index: Sequence[int]

    # the scores of simple rules fitted on the training split, {rule: {metric: value}} (tools/eval.py reports them)
    baselines: Callable[[Dataset], dict[str, dict[str, float]]]

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


ATTRIBUTES = tuple(TrainingSplit.__annotations__)


def split_attribute(dataset: Dataset, name: str) -> Any:
    """`dataset`'s attribute `name` (one of `TrainingSplit`'s), None where the set does not define it."""
    if name not in ATTRIBUTES:
        raise AttributeError(f"{name!r} is not an attribute of the split interface: {', '.join(ATTRIBUTES)}")
    return getattr(dataset, name, None)


def sequence_length(dataset: Dataset) -> int:
    """Input length of the split: its look-back, window or longest kept input, else its longest stored sequence,
    else its longest sample (read once, when a run starts). Never the first item's: the learned position table
    would be stretched over every longer batch."""
    for name in ("lookback", "window", "max_length"):
        if split_attribute(dataset, name):
            return int(split_attribute(dataset, name))
    sequences = split_attribute(dataset, "sequences")
    if sequences is not None:
        return max(len(sequence) for sequence in sequences)
    samples = (dataset[i] for i in range(len(dataset)))
    return max(len(sample["tokens"] if "tokens" in sample else sample["values"]) for sample in samples)
