"""`ModelSizes`: what a model is sized from, read once off the training split when a run starts.

A run's `model.json` holds them (`sizes`, see `zoo.hub.runs`); every model of a run, at training, evaluation, loading
and prediction, is built from them (`ModelKind.build(recipe, sizes, task)`), never from a dataset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

__all__ = ["ModelSizes", "plain"]


@dataclass(frozen=True)
class ModelSizes:
    """A model's sizes; None where they do not apply (no classes for a forecast, no length for images)."""

    num_classes: int | None = None
    # image or series channels
    in_chans: int | None = None
    vocab_size: int | None = None
    # forecasting: steps forecast, the file's columns, the input and target columns (indices into `columns`)
    horizon: int | None = None
    columns: tuple[str, ...] | None = None
    input_index: tuple[int, ...] | None = None
    target_index: tuple[int, ...] | None = None
    # the input length (1-D models: `zoo.data._interface.sequence_length`)
    seq_len: int | None = None

    @classmethod
    def of(cls, train_set: Dataset, *, length: bool) -> ModelSizes:
        """The sizes of `train_set` (`length`: also its input length, which may read every sample)."""
        # the dataset modules load only when a run starts, not on `import zoo`
        from ._interface import sequence_length, split_attribute

        names = [f.name for f in dataclasses.fields(cls) if f.name != "seq_len"]
        values = {name: plain(split_attribute(train_set, name)) for name in names}
        return cls.from_json({**values, "seq_len": sequence_length(train_set) if length else None})

    @classmethod
    def from_json(cls, sizes: Mapping[str, Any]) -> ModelSizes:
        """The sizes of `model.json`'s `sizes` (lists as tuples); a ValueError naming an unknown size."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [name for name in sizes if name not in names]
        if unknown:
            raise ValueError(f"unknown model sizes {unknown}; known: {', '.join(names)}")
        return cls(**{name: tuple(v) if isinstance(v, list) else v for name, v in sizes.items()})

    def to_json(self) -> dict[str, Any]:
        """`model.json`'s `sizes`: the sizes that apply, lists for tuples."""
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in dataclasses.asdict(self).items()
            if value is not None
        }


def plain(value: Any) -> Any:
    """A dataset attribute as JSON data: arrays and tuples as lists, NumPy scalars as Python numbers."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [plain(item) for item in value]
    return value
