"""`forecast`: the next `horizon` steps of a series' target channels, MSE or MAE in the normalised space,
predictions in the input's units.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from torch import Tensor, nn

from ..data._sizes import plain
from .heads import ForecastHead

if TYPE_CHECKING:  # torchmetrics imports matplotlib: loaded only when metrics are built
    from torch.utils.data import Dataset

    from ..data._sizes import ModelSizes
from ._base import HeadSpec, Task, register_task


@dataclass(frozen=True)
class Forecast(Task):
    """Future values of a series: forecast and target `[b, t, c]`, mask `[b, t]` (observed target steps)."""

    name = "forecast"
    target_key = "target"
    metrics = ("mse", "mae")
    default_metrics = ("mse", "mae")
    selection = ("mse", False)
    inputs = ("series",)
    model_options = ("forecast_loss",)
    forecasts_inputs = True
    # the training loss: mean squared or absolute error
    forecast_loss: Literal["mse", "mae"] = "mse"

    def __post_init__(self) -> None:
        if self.forecast_loss not in ("mse", "mae"):
            raise ValueError(f"forecast loss {self.forecast_loss!r} is not one of 'mse', 'mae'")

    def _loss(self, outputs: Tensor, targets: Tensor, mask: Tensor | None, label_smoothing: float) -> Tensor:
        if outputs.shape != targets.shape:
            raise ValueError(f"forecast {tuple(outputs.shape)} and target {tuple(targets.shape)} differ in shape")
        error = outputs.float() - targets.float()
        error = error.square() if self.forecast_loss == "mse" else error.abs()
        if mask is None:
            return error.mean()
        keep = mask[..., None].expand_as(error)
        return error.masked_fill(~keep, 0.0).sum() / keep.sum().clamp_min(1)

    def loss_units(self, targets: Tensor, mask: Tensor | None) -> int:
        return targets.numel()

    def model_sizes(self, sizes: ModelSizes) -> dict[str, Any]:
        """Channels in, horizon, and which input channels are the targets (None: all of them, in order)."""
        inputs, targets = list(sizes.input_index), list(sizes.target_index)
        missing = [sizes.columns[t] for t in targets if t not in inputs]
        if missing:
            names = [sizes.columns[i] for i in inputs]
            raise ValueError(f"data.options.targets {missing} must be among the inputs {names}")
        channels = None if targets == inputs else [inputs.index(t) for t in targets]
        return {"num_channels": len(inputs), "horizon": sizes.horizon, "target_channels": channels}

    def prediction_rows(
        self, meta: dict[str, Any], outputs: Tensor, mask: Tensor | None, description: Mapping[str, Any], top_k: int
    ) -> list[dict[str, Any]]:
        """forecast `[t, c]` in standardised units -> one row per future step, in the target columns' units."""
        inputs = description["inputs"]
        index = [inputs["columns"].index(name) for name in inputs["targets"]]
        mean, std = np.asarray(inputs["mean"])[index], np.asarray(inputs["std"])[index]
        values = outputs.numpy() * std + mean  # [t, c]
        return [
            {**meta, "step": step, **{name: float(value) for name, value in zip(inputs["targets"], row, strict=True)}}
            for step, row in enumerate(values, start=1)
        ]

    def describe_inputs(self, train_set: Dataset) -> dict[str, Any]:
        """The file's columns, the input and target columns, and the training mean / std of every column."""
        from ..data._interface import split_attribute  # zoo.data imports this module

        columns = list(split_attribute(train_set, "columns"))
        return {
            "columns": columns,
            "inputs": [columns[i] for i in split_attribute(train_set, "input_index")],
            "targets": [columns[i] for i in split_attribute(train_set, "target_index")],
            "mean": plain(split_attribute(train_set, "mean")),
            "std": plain(split_attribute(train_set, "std")),
        }

    def build_head(self, spec: HeadSpec) -> nn.Module:
        if not (spec.seq_len and spec.horizon):
            raise ValueError(
                f"forecasting needs seq_len and horizon (got seq_len={spec.seq_len!r}, horizon={spec.horizon!r})"
            )
        return ForecastHead(
            spec.dim,
            spec.num_tokens,
            spec.horizon,
            num_channels=spec.num_channels,
            channel_independent=spec.channel_independent,
            drop=spec.drop,
        )


register_task(Forecast())
