"""Model kinds: how a recipe's `model.kind` becomes a model built from the run's `ModelSizes`, and what of a batch
it reads. Each kind is a `ModelKind` registered by name, with its own options dataclass (`KindOptions`: the keys of
the recipe's `model` section only it takes, checked like `data.options`):

- `vit`: timm's VisionTransformer with any zoo attention (`zoo.models.create_model`), for image data (`ViTOptions`);
- `sequence`: zoo's 1-D `SequenceModel` (`zoo.models.create_sequence_model`), for dna, series and tokens data
  (`SequenceOptions`: the `model.sequence` section).

The task (`zoo.tasks`) reads the sizes it needs (classes, vocabulary, horizon); the kind reads its own (input length,
channels) and its options. A kind also says what model.json records of how its inputs are read (`describe`), its
checks against the data and task (`recipe_problems`) and what the dataset builders read of its options
(`data_context`). The engine builds every model through `build_model(recipe, sizes)`. A new kind is one
`register_model_kind(ModelKind(...))` (see tests/test_extension.py).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from torch import Tensor, nn
from torch.utils.data import Dataset

from .._registry import Registry
from ..attention._config import AttentionConfig
from ..data._interface import split_attribute
from ..data._sizes import ModelSizes, plain
from ..models import create_model, create_sequence_model
from ..models.sequence import INPUTS, POSITIONS
from ..tasks import Task, get_task, list_tasks

if TYPE_CHECKING:
    from ..config import Recipe

# What the 1-D sets cut their files into: dataset attribute -> meaning (see zoo.predict).
_SEQUENCE_INPUTS = ("window", "stride", "znorm", "lookback", "horizon")

__all__ = [
    "KindOptions",
    "ModelKind",
    "SequenceConfig",
    "SequenceOptions",
    "ViTOptions",
    "build_model",
    "get_model_kind",
    "list_model_kinds",
    "kinds_reading",
    "register_model_kind",
    "sizes_of",
]


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


@dataclass
class ViTOptions(KindOptions):
    """`model.kind: vit`: timm's VisionTransformer with any zoo attention (`zoo.models.create_model`)."""

    # any timm VisionTransformer architecture name; None sizes (model.embed_dim, ...) keep the architecture's own
    name: str = "vit_small_patch16_224"
    img_size: int = field(default=224, metadata={"min": 8})
    patch_size: int | None = field(default=None, metadata={"min": 1})
    # None: taken from the dataset
    in_chans: int | None = field(default=None, metadata={"min": 1})
    # patch: timm's patchify convolution; conv: a convolutional stem of the same stride (zoo.models.stems)
    stem: Literal["patch", "conv"] = "patch"
    # timm: timm's pre-norm blocks (attention + MLP); gau: FLASH blocks of two gated attention units, which bring
    # their own attention (attention.name must be gau) - see docs/gau.md
    block: Literal["timm", "gau"] = "timm"
    # gau blocks only: z_dim (shared query/key width, default 128) and expansion (value width / embed_dim, 2)
    block_options: dict[str, Any] = field(default_factory=dict)
    # RevNet couplings (Reformer): blocks recomputed in backward, activation memory independent of depth
    reversible: bool = False
    # the MLP runs over this many checkpointed chunks of the sequence (0 or 1: off); timm blocks only
    ff_chunks: int = field(default=0, metadata={"min": 0})
    # per-block layouts: these blocks (0-based, < depth) use global_attention instead (ViTDet: [2, 5, 8, 11])
    global_blocks: list[int] = field(default_factory=list, metadata={"min": 0, "unique": True})
    global_attention: AttentionConfig = field(default_factory=AttentionConfig)
    dynamic_img_size: bool = False
    pretrained: bool = False
    pretrained_file: str | None = None
    # extra keyword arguments for timm's VisionTransformer
    timm_kwargs: dict[str, Any] = field(default_factory=dict)

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.block == "gau" and self.ff_chunks > 1:
            problems.append(("ff_chunks", f"chunks the MLP of timm blocks; block 'gau' has none, got {self.ff_chunks}"))
        if self.block == "timm" and self.block_options:
            problems.append(("block_options", f"only block 'gau' takes options, got {self.block_options}"))
        return problems + self._patch_problems()

    def problems_in(self, model: Any) -> list[tuple[str, str]]:
        if self.block == "gau" and model.attention.name != "gau":
            return [("attention.name", f"must be 'gau' when block is 'gau', got {model.attention.name!r}")]
        return []

    def _patch_problems(self) -> list[tuple[str, str]]:
        """A fixed image size must be a whole number of patches (timm refuses the first batch otherwise)."""
        found = re.search(r"patch(\d+)", self.name)
        patch = self.patch_size or (int(found.group(1)) if found else None)
        padded = self.dynamic_img_size or self.timm_kwargs.get("dynamic_img_pad")
        if patch is None or padded or self.img_size % patch == 0:
            return []
        where = "model.patch_size" if self.patch_size else f"from model.name {self.name!r}"
        near = sorted({max(patch, self.img_size // patch * patch), -(-self.img_size // patch) * patch})
        problem = (
            f"must be a multiple of the patch size {patch} ({where}), got {self.img_size}: use "
            f"{' or '.join(map(str, near))}, or set model.dynamic_img_size: true"
        )
        return [("img_size", problem)]


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
    forecast_loss: Literal["mse", "mae"] = "mse"
    tie_embeddings: bool = True
    # taps of a causal depthwise convolution before every attention (0: none); Zoology's and Based's recall models
    # use 3, so that binding a token to its neighbour is not the attention's job
    short_conv: int = field(default=0, metadata={"min": 0, "max": 64})

    def problems(self) -> list[tuple[str, str]]:
        if self.kmer_stride is not None and self.kmer_stride > self.kmer:
            return [("kmer_stride", f"must be <= kmer {self.kmer} (no base skipped), got {self.kmer_stride}")]
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
    return _unused_sequence_keys(recipe)


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


def _names(values: Sequence[str]) -> str:
    return ", ".join(repr(value) for value in values)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
        # the column of a CSV file that holds the labels, not a time step
        # (zoo.data.series.classification.CsvSeriesDataset)
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
    ModelKind(
        "vit",
        {"image": ()},
        _build_vit,
        lambda batch: (batch["image"],),
        options=ViTOptions,
        describe=_describe_vit,
        data_context=lambda options: {
            "img_size": options.img_size,
            "in_chans": options.in_chans,
            "dynamic_img_size": options.dynamic_img_size,
        },
        without_pretrained=lambda options: dataclasses.replace(options, pretrained=False, pretrained_file=None),
    )
)
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
