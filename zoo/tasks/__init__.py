"""Tasks: what a model learns from a batch, one `Task` object per task, registered by name.

A task owns everything that differs between "classify a sequence", "label every position", "forecast a series"
and "predict the next token", for the image ViT and the 1-D `SequenceModel` alike:

- the batch key of its targets (`target_key`) and whether the batch's `mask` masks them (`per_position`);
- its loss (label smoothing where it applies, `IGNORE_INDEX` positions left out) and how many terms the loss
  averages (`loss_units`, so that a whole split's loss is the mean over the same terms);
- its metrics: the allowed names, the defaults, the validation metric that picks the best checkpoint, and the
  `(preds, target)` pair every metric takes (`metric_inputs`);
- what it reads of the run's `ModelSizes` (`model_sizes`: classes, vocabulary, horizon and channels) and
  which head a 1-D model needs (`build_head`);
- the 1-D model inputs it takes, and the `model.sequence` options only it uses;
- what a run records of its training split for prediction (`describe_inputs`: a forecast's columns) and how
  `zoo.predict` turns one input's outputs into rows (`prediction_rows`; a task without them is not predicted).

Batches are dicts (`zoo.data` turns image `(image, label)` pairs into `{"image", "label"}`), so one `Task` serves
every model. A new task is a subclass registered with `register_task(MyTask())`, in this file or its own (see
tests/test_extension.py: a multi-label task with no other edit).

Letter legend: b - batch, k - classes, l - positions, n - tokens, t - horizon, c - channels, v - vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .._registry import Registry
from ..data._interface import IGNORE_INDEX
from ..data._sizes import plain
from .heads import ClassificationHead, ForecastHead, LanguageModelHead, TokenClassificationHead

if TYPE_CHECKING:  # torchmetrics imports matplotlib: loaded only when metrics are built
    from torch.utils.data import Dataset
    from torchmetrics import MetricCollection

    from ..data._sizes import ModelSizes

__all__ = [
    "IGNORE_INDEX",
    "CausalLanguageModelling",
    "CausalTokenClassification",
    "Classification",
    "Forecast",
    "HeadSpec",
    "Task",
    "TokenClassification",
    "get_task",
    "list_tasks",
    "register_task",
]

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

    def describe_inputs(self, train_set: Dataset) -> dict[str, Any]:
        """What `zoo.predict` needs of the training split to read new inputs for this task (model.json's
        `inputs`), beyond what the model kind records."""
        return {}


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

    def prediction_rows(
        self, meta: dict[str, Any], outputs: Tensor, mask: Tensor | None, description: Mapping[str, Any], top_k: int
    ) -> list[dict[str, Any]]:
        """logits `[k]` -> one row: the best classes and their probabilities."""
        return [{**meta, **_top_k(outputs, description.get("label_names"), top_k)}]

    def build_head(self, spec: HeadSpec) -> nn.Module:
        _require(self, "num_classes", spec.num_classes)
        return ClassificationHead(spec.dim, spec.num_classes, channels=spec.folded_channels, drop=spec.drop)


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
    per_position = True
    ignore_index = IGNORE_INDEX

    def _loss(self, outputs: Tensor, targets: Tensor, mask: Tensor | None, label_smoothing: float) -> Tensor:
        """Mean cross-entropy over kept, labelled positions."""
        logits, labels = self.metric_inputs(outputs, targets, mask)
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)

    def loss_units(self, targets: Tensor, mask: Tensor | None) -> int:
        labelled = targets != IGNORE_INDEX
        return int((labelled if mask is None else labelled & mask).sum())

    def metric_inputs(self, outputs: Tensor, targets: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`[b, l, k]`, `[b, l]`, mask `[b, l]` -> `[(b l), k]`, `[(b l)]` with padded positions `IGNORE_INDEX`."""
        if mask is not None:
            targets = targets.masked_fill(~mask, IGNORE_INDEX)
        return rearrange(outputs.float(), "b l k -> (b l) k"), targets.flatten()

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
        rows = []
        for offset in torch.nonzero(mask).flatten().tolist():
            label = labels[offset].item()
            position = {"input": meta["input"], "record": meta["record"], "position": meta["start"] + offset}
            name = names[label] if names else str(label)
            rows.append({**position, "label": name, "probability": round(probabilities[offset].item(), 6)})
        return rows

    def build_head(self, spec: HeadSpec) -> nn.Module:
        _require(self, "num_classes", spec.num_classes)
        return TokenClassificationHead(spec.dim, spec.num_classes, steps=spec.steps, drop=spec.drop)


@dataclass(frozen=True)
class CausalTokenClassification(TokenClassification):
    """`TokenClassification` by a causal model: the label of position i is predicted from positions 0 .. i only
    (the recall probes of `zoo.data.tokens.recall` in their next-token layout, or any per-position label that must not
    read the future). Accuracy is the selection metric: recall probes label few positions, and macro F1 over a
    whole vocabulary averages mostly absent classes."""

    name = "causal_token_classification"
    selection = ("top1", True)
    causal = True


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

    def model_sizes(self, sizes: ModelSizes) -> dict[str, Any]:
        return {"vocab_size": sizes.vocab_size}

    def num_outputs(self, sizes: ModelSizes) -> int:
        return sizes.vocab_size

    def build_head(self, spec: HeadSpec) -> nn.Module:
        _require(self, "vocab_size", spec.vocab_size)
        return LanguageModelHead(spec.dim, spec.vocab_size, tied_weight=spec.tied_weight)


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


for _task in (
    Classification(),
    Forecast(),
    TokenClassification(),
    CausalLanguageModelling(),
    CausalTokenClassification(),
):
    register_task(_task)
