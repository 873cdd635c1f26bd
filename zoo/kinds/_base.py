"""The model-kind machinery: `KindOptions` (the base of a kind's options dataclass), `ModelKind` (what a kind
owns: how it builds a model, reads a batch, checks a recipe and describes its inputs) and the registry of kinds
(`register_model_kind`, `get_model_kind`, `list_model_kinds`, `kinds_reading`), with what the engine calls on a
recipe's kind (`sizes_of`, `build_model`). The kinds themselves are one file each beside this one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.utils.data import Dataset

from .._registry import Registry
from ..data._sizes import ModelSizes
from ..tasks import Task, get_task

if TYPE_CHECKING:
    from ..config import Recipe


class KindOptions:
    """Base of a model kind's options dataclass: its keys sit in the recipe's `model` section beside the keys every
    kind shares (`ModelConfig`), each checked against its annotation and metadata (`min`, `max`, `choices`, ...) as
    `data.options` are. A subclass may define `problems()` (checks across its own keys) and `problems_in(model)`
    (checks with the shared keys), each returning `(key, message)` pairs."""

    def problems_in(self, model: Any) -> list[tuple[str, str]]:
        return []


@dataclass(frozen=True)
class ModelKind:
    name: str
    # data kind (zoo.data.INPUT_KINDS) -> the model inputs that read it (sequence: model.sequence.input; empty: one)
    data_kinds: Mapping[str, tuple[str, ...]]
    # (recipe, the run's sizes, task) -> the model
    build: Callable[[Recipe, ModelSizes, Task], nn.Module]
    # a batch (dict) -> the model's positional inputs
    inputs: Callable[[Mapping[str, Tensor]], tuple[Tensor, ...]]
    # its options dataclass (a KindOptions subclass): the keys of the recipe's `model` section only it takes
    options: type = KindOptions
    # the recipe section whose keys configure the task (`Task.configured`), None for none
    task_section: Callable[[Recipe], Any] = lambda recipe: None
    # its models are sized by the input length too (`ModelSizes.seq_len`)
    reads_length: bool = False
    # (recipe, training split, task) -> model.json's entries of how the run's inputs are read (zoo.hub.runs,
    # zoo.predict)
    describe: Callable[[Recipe, Dataset, Task], dict[str, Any]] = lambda recipe, train_set, task: {}
    # the recipe -> its problems that involve the data or the task: (key path, message) pairs
    recipe_problems: Callable[[Recipe], list[tuple[str, str]]] = lambda recipe: []
    # the options -> the model input they pick ("tokens", "dna", ...; None: not a choice of this kind)
    input_of: Callable[[Any], str | None] = lambda options: None
    # the options -> what the dataset builders read of them (zoo.data.DataContext: img_size, in_chans, ...)
    data_context: Callable[[Any], dict[str, Any]] = lambda options: {}
    # the options with pretrained weights off (a checkpoint holds every weight)
    without_pretrained: Callable[[Any], Any] = lambda options: options

    def task(self, recipe: Recipe) -> Task:
        """The recipe's task, configured by this kind's recipe section (e.g. model.sequence.forecast_loss)."""
        section = self.task_section(recipe)
        return get_task(recipe.task).configured(**(dataclasses.asdict(section) if section is not None else {}))


_KINDS: Registry[ModelKind] = Registry("model kind")


def register_model_kind(kind: ModelKind) -> ModelKind:
    """Register `kind` under `kind.name`; a duplicate name raises."""
    if not (dataclasses.is_dataclass(kind.options) and issubclass(kind.options, KindOptions)):
        raise TypeError(f"model kind {kind.name!r}: options must be a KindOptions dataclass, got {kind.options!r}")
    return _KINDS.register(kind.name, kind)


def list_model_kinds() -> list[str]:
    """Registered kinds, in registration order."""
    return _KINDS.names()


def get_model_kind(name: str) -> ModelKind:
    return _KINDS.get(name)


def kinds_reading(data_kind: str) -> list[str]:
    """The kinds that read data of `data_kind`, in registration order."""
    return [kind.name for kind in _KINDS.values() if data_kind in kind.data_kinds]


def sizes_of(recipe: Recipe, train_set: Dataset) -> ModelSizes:
    """The run's `ModelSizes`, read off its training split once, when it starts (the input length only for a kind
    that reads it)."""
    return ModelSizes.of(train_set, length=get_model_kind(recipe.model.kind).reads_length)


def build_model(recipe: Recipe, sizes: ModelSizes) -> nn.Module:
    """The recipe's model (its `model.kind`, its task configured by the kind's section), built from `sizes`."""
    kind = get_model_kind(recipe.model.kind)
    return kind.build(recipe, sizes, kind.task(recipe))
