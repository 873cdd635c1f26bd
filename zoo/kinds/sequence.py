"""The `sequence` model kind: zoo's 1-D `SequenceModel` (`zoo.models.create_sequence_model`), for dna, series and
tokens data; its options (`SequenceOptions`: the `model.sequence` section, `SequenceConfig`), its checks against the
data and task, what model.json records of how the run's files are read (`inputs`) and its registration."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from torch import Tensor, nn
from torch.utils.data import Dataset

from ..data._interface import split_attribute
from ..data._sizes import ModelSizes, plain
from ..models import create_sequence_model
from ..models.sequence import INPUTS, POSITIONS
from ..tasks import Task, get_task, list_tasks
from ..tasks.token_classification import SCORES
from ._base import KindOptions, ModelKind, get_model_kind, register_model_kind

if TYPE_CHECKING:
    from ..config import Recipe

# What the 1-D sets cut their files into: dataset attribute -> meaning (see zoo.predict).
_SEQUENCE_INPUTS = ("window", "stride", "znorm", "lookback", "horizon")


@dataclass
class SequenceConfig:
    """The 1-D model's own options (``model.sequence``); see ``zoo.models.create_sequence_model``, whose defaults
    these are. Width, depth, heads, MLP ratio, dropout and attention are the shared ``model`` keys."""

    # dna: one token per nucleotide; kmer: k-mers embedded from nucleotides; series: PatchTST patches; tokens:
    # integer ids of the dataset's own vocabulary (its vocab_size)
    input: Literal[INPUTS] = "dna"
    # null: rotary for causal_lm, learned otherwise
    positions: Literal[POSITIONS] | None = None
    # classification only: how the tokens become one vector
    pool: Literal["cls", "mean", "attention"] = "cls"
    # entries of the learned position table; null: the training split's length in tokens
    max_len: int | None = field(default=None, metadata={"min": 1})
    kmer: int = field(default=3, metadata={"min": 1, "max": 8})
    # null: non-overlapping k-mers (stride kmer), the only kind per-position labels allow
    kmer_stride: int | None = field(default=None, metadata={"min": 1})
    patch_len: int = field(default=16, metadata={"min": 1})
    patch_stride: int = field(default=8, metadata={"min": 1})
    channel_independent: bool = True
    revin: bool = True
    # add RevIN's per-series mean and log standard deviation, embedded, to every token: the level and scale that
    # instance normalisation takes away, for tasks where they tell the classes apart (series only, needs revin)
    revin_stats: bool = False
    forecast_loss: Literal["mse", "mae"] = "mse"
    # per-position classification: the training loss runs the head on every position (all) or only on the labelled,
    # unpadded ones (labelled: the same loss and gradients, far cheaper when few of many positions are labelled, as
    # in the recall probes); evaluation and prediction read every position either way
    score: Literal[SCORES] = "all"
    tie_embeddings: bool = True
    # taps of a causal depthwise convolution before every attention (0: none); Zoology's and Based's recall models
    # use 3, so that binding a token to its neighbour is not the attention's job
    short_conv: int = field(default=0, metadata={"min": 0, "max": 64})

    def problems(self) -> list[tuple[str, str]]:
        if self.kmer_stride is not None and self.kmer_stride > self.kmer:
            return [("kmer_stride", f"must be <= kmer {self.kmer} (no base skipped), got {self.kmer_stride}")]
        if self.revin_stats and not self.revin:
            return [("revin_stats", "true needs revin: true (the statistics are RevIN's), got revin: false")]
        return []


@dataclass
class SequenceOptions(KindOptions):
    """`model.kind: sequence`: zoo's 1-D `SequenceModel` (`zoo.models.create_sequence_model`), configured under
    `model.sequence`."""

    sequence: SequenceConfig = field(default_factory=SequenceConfig)


# SequenceConfig keys that only some inputs use (and, from zoo.tasks, those that only some tasks use: a task's
# model_options): elsewhere they must keep their defaults, so that no setting is silently ignored.
_INPUT_KEYS = {
    "kmer": ("kmer",),
    "kmer_stride": ("kmer",),
    "patch_len": ("series",),
    "patch_stride": ("series",),
    "channel_independent": ("series",),
    "revin": ("series",),
    "revin_stats": ("series",),
}


def _sequence_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """`model.sequence.input` against the data and the task, then the keys the input or task leaves unused."""
    from ..data import get_dataset

    domain = get_dataset(recipe.data.name).kind
    inputs = get_model_kind("sequence").data_kinds[domain]
    source, task = recipe.model.sequence.input, get_task(recipe.task)
    if source not in inputs:
        problem = f"data.name {recipe.data.name!r} holds {domain} data: takes {_names(inputs)}, got {source!r}"
        return [("model.sequence.input", problem)]
    if source not in task.inputs:
        return [("model.sequence.input", f"task {recipe.task!r} takes {_names(task.inputs)}, got {source!r}")]
    return _unused_sequence_keys(recipe) + _score_problems(recipe)


def _unused_sequence_keys(recipe: Recipe) -> list[tuple[str, str]]:
    seq, defaults, problems = recipe.model.sequence, SequenceConfig(), []
    for name in (f.name for f in dataclasses.fields(SequenceConfig)):
        if name in _INPUT_KEYS:
            by, current, users = "input", seq.input, _INPUT_KEYS[name]
        else:
            by, current = "task", recipe.task
            users = tuple(task for task in list_tasks() if name in get_task(task).model_options)
        value, default = getattr(seq, name), getattr(defaults, name)
        if users and value != default and current not in users:
            problem = f"only {by} {_names(users)} uses it ({by} is {current!r}); leave it at {_show(default)}"
            problems.append((f"model.sequence.{name}", f"{problem}, got {_show(value)}"))
    return problems


def _score_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """`score: labelled` picks positions by a data-dependent mask, a shape torch.compile cannot fix in one graph."""
    if recipe.model.sequence.score == "labelled" and recipe.train.compile is not False:
        problem = f"labelled needs train.compile: false (positions vary per batch), got {_show(recipe.train.compile)}"
        return [("model.sequence.score", problem)]
    return []


def _names(values: Sequence[str]) -> str:
    return ", ".join(repr(value) for value in values)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
        # the column of a CSV file that holds the labels, not a time step
        # (zoo.data.series.classification.CsvSeriesDataset)
        inputs["label_column"] = recipe.data.options.get("label_column", "label")
    return inputs


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
        revin_stats=seq.revin_stats,
        forecast_loss=seq.forecast_loss,
        score=seq.score,
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
    ModelKind(
        "sequence",
        {"dna": ("dna", "kmer"), "series": ("series",), "tokens": ("tokens",)},
        _build_sequence,
        _sequence_inputs,
        options=SequenceOptions,
        task_section=lambda recipe: recipe.model.sequence,
        reads_length=True,
        describe=_describe_sequence,
        recipe_problems=_sequence_problems,
        input_of=lambda options: options.sequence.input,
    )
)
