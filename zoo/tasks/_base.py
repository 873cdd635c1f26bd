"""What every task is: `Task` (the hooks a task owns, see `zoo.tasks`), `HeadSpec` (what a 1-D model's head is
sized from), and the registry of tasks by name.

Letter legend: b - batch, k - classes, l - positions, n - tokens, t - horizon, c - channels, v - vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

from .._registry import Registry

if TYPE_CHECKING:  # torchmetrics imports matplotlib: loaded only when metrics are built
    from torch.utils.data import Dataset
    from torchmetrics import MetricCollection

    from ..data._sizes import ModelSizes

__all__ = ["HeadSpec", "Task", "get_task", "list_tasks", "register_task"]

# The target of a position without a label (and of padded positions): torch's cross_entropy ignores it.


@dataclass(frozen=True)
class HeadSpec:
    """What a 1-D model tells its task's head: widths, sizes and the input embedding's weight."""

    dim: int
    drop: float = 0.0
    num_classes: int | None = None
    vocab_size: int | None = None
    # channels folded into the batch by a channel-independent series embedding (1 otherwise)
    folded_channels: int = 1
    num_channels: int = 1
    channel_independent: bool = True
    # input length and token count of the training split, horizon (forecasting)
    seq_len: int | None = None
    num_tokens: int | None = None
    horizon: int | None = None
    # input positions per token (a non-overlapping k-mer stands for k)
    steps: int = 1
    # the input embedding's [v, d] weight, for a tied output embedding
    tied_weight: nn.Parameter | None = None


@dataclass(frozen=True)
class Task:
    """A task's rules; subclasses implement `_loss`, `metric_inputs`, `loss_units`, `model_sizes`, `build_head`
    and, to be predicted, `prediction_rows`."""

    name: ClassVar[str]
    # the batch key holding the targets
    target_key: ClassVar[str]
    # the allowed metric names, those reported when a recipe names none, and those tools/eval.py always adds
    metrics: ClassVar[tuple[str, ...]]
    default_metrics: ClassVar[tuple[str, ...]]
    eval_metrics: ClassVar[tuple[str, ...]] = ()
    # the validation metric that picks the best checkpoint, and whether higher is better
    selection: ClassVar[tuple[str, bool]]
    # the 1-D model's inputs it takes (model.sequence.input), and the model.sequence keys only it uses
    inputs: ClassVar[tuple[str, ...]]
    model_options: ClassVar[tuple[str, ...]] = ()
    label_smoothing: ClassVar[bool] = False
    # one target per input position: the batch's mask masks the targets too
    per_position: ClassVar[bool] = False
    # a model for it attends causally / pools its tokens into one vector
    causal: ClassVar[bool] = False
    pooled: ClassVar[bool] = False
    # outputs are future values of the input series (returned in its units)
    forecasts_inputs: ClassVar[bool] = False
    # the target value of positions that count for nothing (metrics ignore it), None when there is none
    ignore_index: ClassVar[int | None] = None

    def configured(self, **options: Any) -> Task:
        """A copy with the options this task takes (its dataclass fields); options of other tasks are left out."""
        own = {f.name for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{key: value for key, value in options.items() if key in own})

    def targets(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        """The batch's targets, and its `[b, l]` mask where it masks them (per-position tasks), else None."""
        return batch[self.target_key], batch["mask"] if self.per_position else None

    def loss(
        self, outputs: Tensor, targets: Tensor, mask: Tensor | None = None, *, label_smoothing: float = 0.0
    ) -> Tensor:
        """Mean loss of a batch (shapes: see the subclass); `label_smoothing` only where the task takes it."""
        if label_smoothing and not self.label_smoothing:
            raise ValueError(f"label smoothing is for classification, not task {self.name!r}")
        return self._loss(outputs, targets, mask, label_smoothing)

    def _loss(self, outputs: Tensor, targets: Tensor, mask: Tensor | None, label_smoothing: float) -> Tensor:
        raise NotImplementedError

    def loss_positions(self, targets: Tensor, mask: Tensor | None) -> Tensor | None:
        """The `[b, l]` bool positions whose outputs the training loss reads, for a model that computes only those
        (`model(*inputs, positions=...)` -> `[p, ...]`, scored against `targets[positions]`); None: every output
        (the default)."""
        return None

    def loss_units(self, targets: Tensor, mask: Tensor | None) -> int:
        """How many terms `loss` averages over in this batch (samples by default)."""
        return targets.shape[0]

    def metric_inputs(self, outputs: Tensor, targets: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`(preds, target)` for every metric of the task (unchanged by default, outputs in float32)."""
        return outputs.float(), targets

    def build_metrics(self, names: Sequence[str], num_classes: int) -> MetricCollection:
        """The metrics `names`, each one the task allows; `top5` is left out below 5 classes."""
        unknown = [name for name in names if name not in self.metrics]
        if unknown:
            raise ValueError(f"unknown metrics {unknown} for task {self.name!r}; allowed: {', '.join(self.metrics)}")
        chosen = [name for name in names if name != "top5" or num_classes >= 5]
        from .metrics import build_metrics

        return build_metrics(chosen, num_classes, ignore_index=self.ignore_index)

    def selection_metric(self, metric_names: Sequence[str]) -> tuple[str, bool]:
        """The validation metric that picks the best checkpoint and whether higher is better; the loss when that
        metric is not computed."""
        name, higher_is_better = self.selection
        return (name, higher_is_better) if name in metric_names else ("loss", False)

    def model_sizes(self, sizes: ModelSizes) -> dict[str, Any]:
        """The model's keyword arguments of the task's sizes (`num_classes`, `vocab_size`, `horizon`, ...)."""
        return {}

    def num_outputs(self, sizes: ModelSizes) -> int:
        """Classes the metrics count: the classes, the vocabulary, or 0 where nothing is counted."""
        return 0

    def build_head(self, spec: HeadSpec) -> nn.Module:
        """The 1-D model's head for this task."""
        raise NotImplementedError

    @property
    def predicts(self) -> bool:
        """Whether `zoo.predict` turns this task's outputs into rows (`prediction_rows`)."""
        return type(self).prediction_rows is not Task.prediction_rows

    def prediction_rows(
        self, meta: dict[str, Any], outputs: Tensor, mask: Tensor | None, description: Mapping[str, Any], top_k: int
    ) -> list[dict[str, Any]]:
        """One input's rows of `zoo.predict`: `meta` (where the input comes from) and what was predicted from
        `outputs` (one sample's, float32 on the CPU; `mask` its input mask for 1-D inputs), with the run's
        `model.json` `description` (label names, inputs) and the `top_k` classes a row keeps."""
        raise NotImplementedError(f"task {self.name!r} has no prediction rows")

    def baselines(self, train_set: Dataset, dataset: Dataset, num_classes: int) -> dict[str, dict[str, float]]:
        """The trivial rules this task's metrics are read against on `dataset`, fitted on `train_set`, over
        `num_classes` classes: `{rule: {metric: score}}` (tools/eval.py prints them beside the model's). None by
        default: a forecast's or a mask's baselines depend on the data, and its dataset gives them."""
        return {}

    def describe_inputs(self, train_set: Dataset) -> dict[str, Any]:
        """What `zoo.predict` needs of the training split to read new inputs for this task (model.json's
        `inputs`), beyond what the model kind records."""
        return {}


def _top_k(scores: Tensor, names: Sequence[str] | None, top_k: int) -> dict[str, list]:
    """logits `[k]` -> the best classes (names, else indices) and their probabilities, best first."""
    probabilities = scores.softmax(-1)
    values, indices = probabilities.topk(min(top_k, len(probabilities)))
    labels = [names[i] if names else str(i) for i in indices.tolist()]
    return {"classes": labels, "probabilities": [round(v, 6) for v in values.tolist()]}


def _require(task: Task, name: str, value: Any) -> None:
    if not value:
        raise ValueError(f"task {task.name!r} needs {name} (got {value!r})")


_TASKS: Registry[Task] = Registry("task")


def register_task(task: Task) -> Task:
    """Register `task` under `task.name`; a duplicate name raises."""
    return _TASKS.register(task.name, task)


def list_tasks() -> list[str]:
    """Registered task names, in registration order."""
    return _TASKS.names()


def get_task(name: str) -> Task:
    return _TASKS.get(name)
