"""Model kinds: how a recipe's `model.kind` becomes a model sized from the training split, and what of a batch it
reads. Each kind is a `ModelKind` registered by name:

- `vit`: timm's VisionTransformer with any zoo attention (`zoo.models.create_model`), for image data;
- `sequence`: zoo's 1-D `SequenceModel` (`zoo.models.create_sequence_model`), for dna, series and tokens data.

The task (`zoo.tasks`) gives the sizes it needs (classes, vocabulary, horizon); the kind adds its own (input length,
channels) and reads its recipe section. The engine builds every model through `get_model_kind(recipe.model.kind)`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.utils.data import Dataset

from ._sizes import ModelSizes, plain
from ._validate import did_you_mean
from .data._interface import split_attribute
from .models import create_model, create_sequence_model
from .tasks import Task, get_task

if TYPE_CHECKING:
    from .recipe import Recipe

# What the 1-D sets cut their files into: dataset attribute -> meaning (see zoo.predict).
_SEQUENCE_INPUTS = ("window", "stride", "znorm", "lookback", "horizon")

__all__ = [
    "ModelKind",
    "build_model",
    "get_model_kind",
    "list_model_kinds",
    "model_kind_for",
    "register_model_kind",
    "sizes_of",
]


@dataclass(frozen=True)
class ModelKind:
    name: str
    # data kind (zoo.data.INPUT_KINDS) -> the model.sequence.input values that read it (empty: no choice to make)
    data_kinds: Mapping[str, tuple[str, ...]]
    # (recipe, the run's sizes, task) -> the model
    build: Callable[[Recipe, ModelSizes, Task], nn.Module]
    # a batch (dict) -> the model's positional inputs
    inputs: Callable[[Mapping[str, Tensor]], tuple[Tensor, ...]]
    # the recipe section whose keys configure the task (`Task.configured`), None for none
    task_section: Callable[[Recipe], Any] = lambda recipe: None
    # its models are sized by the input length too (`ModelSizes.seq_len`)
    reads_length: bool = False
    # (recipe, training split, task) -> model.json's entries of how the run's inputs are read (zoo.runs, zoo.predict)
    describe: Callable[[Recipe, Dataset, Task], dict[str, Any]] = lambda recipe, train_set, task: {}

    def task(self, recipe: Recipe) -> Task:
        """The recipe's task, configured by this kind's recipe section (e.g. model.sequence.forecast_loss)."""
        section = self.task_section(recipe)
        return get_task(recipe.task).configured(**(dataclasses.asdict(section) if section is not None else {}))


_KINDS: dict[str, ModelKind] = {}


def register_model_kind(kind: ModelKind) -> ModelKind:
    """Register `kind` under `kind.name`; a duplicate name raises."""
    if kind.name in _KINDS:
        raise ValueError(f"model kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def list_model_kinds() -> list[str]:
    """Registered kinds, in registration order."""
    return list(_KINDS)


def get_model_kind(name: str) -> ModelKind:
    if name not in _KINDS:
        raise ValueError(f"unknown model kind {name!r}{did_you_mean(name, _KINDS)}; known: {', '.join(_KINDS)}")
    return _KINDS[name]


def sizes_of(recipe: Recipe, train_set: Dataset) -> ModelSizes:
    """The run's `ModelSizes`, read off its training split once, when it starts (the input length only for a kind
    that reads it)."""
    return ModelSizes.of(train_set, length=get_model_kind(recipe.model.kind).reads_length)


def build_model(recipe: Recipe, sizes: ModelSizes) -> nn.Module:
    """The recipe's model (its `model.kind`, its task configured by the kind's section), built from `sizes`."""
    kind = get_model_kind(recipe.model.kind)
    return kind.build(recipe, sizes, kind.task(recipe))


def model_kind_for(data_kind: str) -> ModelKind:
    """The kind that reads data of `data_kind`."""
    for kind in _KINDS.values():
        if data_kind in kind.data_kinds:
            return kind
    raise ValueError(f"no model kind reads {data_kind!r} data; kinds: {', '.join(_KINDS)}")


def _attribute(train_set: Dataset, name: str, default: Any) -> Any:
    value = split_attribute(train_set, name)
    return default if value is None else value


def _image_config(recipe: Recipe, train_set: Dataset) -> dict[str, Any]:
    """timm's preprocessing keys of the run: the model's input size, the split's normalisation, and its resize
    (a set without `mean`/`std` is taken to give images in [0, 1], used as they are; one without `crop_pct` to
    give whole images)."""
    in_chans = recipe.model.in_chans or split_attribute(train_set, "in_chans")
    read = functools.partial(_attribute, train_set)
    return {
        "input_size": [in_chans, recipe.model.img_size, recipe.model.img_size],
        "mean": plain(read("mean", [0.0])),
        "std": plain(read("std", [1.0])),
        "interpolation": read("interpolation", "bilinear"),
        "crop_pct": float(read("crop_pct", 1.0)),
        "crop_mode": read("crop_mode", "center"),
        "fixed_input_size": not recipe.model.dynamic_img_size,
    }


def _describe_vit(recipe: Recipe, train_set: Dataset, task: Task) -> dict[str, Any]:
    return {"pretrained_cfg": _image_config(recipe, train_set)}


def _describe_sequence(recipe: Recipe, train_set: Dataset, task: Task) -> dict[str, Any]:
    return {"inputs": _how_files_are_read(recipe, train_set, task)}


def _how_files_are_read(recipe: Recipe, train_set: Dataset, task: Task) -> dict[str, Any]:
    """How the split cut and encoded its files: windows, tokenizer, normalisation, a forecast's columns."""
    inputs: dict[str, Any] = {"input": recipe.model.sequence.input}
    for name in _SEQUENCE_INPUTS:
        if split_attribute(train_set, name) is not None:
            inputs[name] = plain(split_attribute(train_set, name))
    tokenizer = split_attribute(train_set, "tokenizer")
    if tokenizer is not None:
        inputs["tokenizer"] = {"k": tokenizer.k, "overlapping": tokenizer.overlapping, "add_cls": tokenizer.add_cls}
        # Genomic Benchmarks' truncation (a series set's max_length is its longest series, not a cut)
        if split_attribute(train_set, "max_length") is not None:
            inputs["max_length"] = int(split_attribute(train_set, "max_length"))
    if recipe.model.sequence.input == "series":
        # what a missing value in a file does (zoo.data._tables: error, mask or interpolate)
        inputs["nan"] = recipe.data.options.get("nan", "error")
    # the task's own: a forecast's columns and training mean / std
    inputs.update(task.describe_inputs(train_set))
    if recipe.model.sequence.input == "series" and not task.forecasts_inputs:
        # the column of a CSV file that holds the labels, not a time step (zoo.data.timeseries.CsvSeriesDataset)
        inputs["label_column"] = recipe.data.options.get("label_column", "label")
    return inputs


def _build_vit(recipe: Recipe, sizes: ModelSizes, task: Task) -> nn.Module:
    cfg = recipe.model
    overrides = {
        key: getattr(cfg, key)
        for key in ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")
        if getattr(cfg, key) is not None
    }
    model = create_model(
        cfg.name,
        attention=cfg.attention.name,
        attention_options=cfg.attention.options,
        global_blocks=cfg.global_blocks,
        global_attention=cfg.global_attention.name,
        global_attention_options=cfg.global_attention.options,
        block=cfg.block,
        block_options=cfg.block_options,
        reversible=cfg.reversible,
        ff_chunks=cfg.ff_chunks,
        pretrained=cfg.pretrained,
        pretrained_file=cfg.pretrained_file,
        stem=cfg.stem,
        img_size=cfg.img_size,
        in_chans=cfg.in_chans or sizes.in_chans,
        drop_rate=cfg.drop_rate,
        drop_path_rate=cfg.drop_path_rate,
        attn_drop_rate=cfg.attn_drop_rate,
        dynamic_img_size=cfg.dynamic_img_size,
        **task.model_sizes(sizes),
        **overrides,
        **cfg.timm_kwargs,
    )
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def _build_sequence(recipe: Recipe, sizes: ModelSizes, task: Task) -> nn.Module:
    """The 1-D model, sized by the run: its length, channels (series), vocabulary (tokens), and what the task
    reads of the sizes (classes, horizon, target channels)."""
    cfg, seq = recipe.model, recipe.model.sequence
    shared = {
        key: value
        for key, value in (
            ("dim", cfg.embed_dim),
            ("depth", cfg.depth),
            ("num_heads", cfg.num_heads),
            ("mlp_ratio", cfg.mlp_ratio),
        )
        if value is not None
    }
    own: dict[str, Any] = {"seq_len": sizes.seq_len}
    if seq.input == "series":
        own["num_channels"] = sizes.in_chans
    elif seq.input == "tokens":
        own["vocab_size"] = sizes.vocab_size
    own.update(task.model_sizes(sizes))
    return create_sequence_model(
        recipe.task,
        input=seq.input,
        attention=cfg.attention.name,
        attention_options=cfg.attention.options,
        positions=seq.positions,
        pool=seq.pool,
        max_len=seq.max_len,
        kmer=seq.kmer,
        kmer_stride=seq.kmer_stride,
        patch_len=seq.patch_len,
        patch_stride=seq.patch_stride,
        channel_independent=seq.channel_independent,
        revin=seq.revin,
        forecast_loss=seq.forecast_loss,
        tie_embeddings=seq.tie_embeddings,
        drop_rate=cfg.drop_rate,
        attn_drop_rate=cfg.attn_drop_rate,
        drop_path_rate=cfg.drop_path_rate,
        grad_checkpointing=cfg.grad_checkpointing,
        short_conv=seq.short_conv,
        **shared,
        **own,
    )


def _sequence_inputs(batch: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
    """`(tokens [b, n] or values [b, n, c], mask [b, n])`."""
    return batch["tokens"] if "tokens" in batch else batch["values"], batch["mask"]


register_model_kind(
    ModelKind("vit", {"image": ()}, _build_vit, lambda batch: (batch["image"],), describe=_describe_vit)
)
register_model_kind(
    ModelKind(
        "sequence",
        {"dna": ("dna", "kmer"), "series": ("series",), "tokens": ("tokens",)},
        _build_sequence,
        _sequence_inputs,
        task_section=lambda recipe: recipe.model.sequence,
        reads_length=True,
        describe=_describe_sequence,
    )
)
