"""Experiment recipes: YAML files loaded into validated, typed dataclasses.

A recipe file may name shared parts under ``base`` (one path or a list, relative to the file). The bases are
deep-merged in order, then the file itself: mappings merge key by key, every other value is replaced. Command
line overrides (``train.epochs=3``) are applied last. The merged tree is checked against the dataclasses below;
every problem raises :class:`RecipeError` with one line that names the file (or override), the key path, the bad
value and what is allowed::

    base: parts/vit_small.yaml
    model:
      attention: {name: performer, options: {nb_features: 64}}
    train:
      epochs: 3

A recipe trains one ``task`` (classification by default; forecast, token_classification and causal_lm for the
1-D data) with one ``model.kind``: ``vit`` (timm's VisionTransformer, images) or ``sequence`` (the 1-D
``zoo.models.SequenceModel``, configured under ``model.sequence``). ``data.options`` holds the options of the
chosen dataset, checked against that dataset's schema below (``DATASET_OPTIONS``)::

    task: forecast
    model: {kind: sequence, embed_dim: 64, sequence: {input: series, patch_len: 16}}
    data: {name: elecdemand, options: {lookback: 336, horizon: 96}}
    metrics: [mse, mae]

YAML is read with the YAML 1.2 rules for booleans and floats: only ``true``/``false`` are booleans (so
``mixed_precision: no`` is the string ``'no'``) and ``1e-3`` is a float.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import re
import types
import typing
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from .attention import attention_options, get_attention
from .data import DATASET_DOMAINS, DATASET_TASKS, DATASETS
from .metrics import DEFAULT_METRICS, METRICS, TASK_METRICS
from .models.sequence import INPUTS, POSITIONS, TASK_INPUTS, TASKS

__all__ = [
    "DATASET_OPTIONS",
    "AttentionConfig",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "Recipe",
    "RecipeError",
    "ScheduleConfig",
    "SequenceConfig",
    "TrainConfig",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_dict",
    "save_recipe",
]


class RecipeError(ValueError):
    """A recipe problem, as one line: ``<source>: <key.path>: <problem>``."""

    def __init__(self, problem: str, *, source: str | None = None, key: str | None = None):
        self.problem, self.source, self.key = problem, source, key
        super().__init__(": ".join(part for part in (source, key, problem) if part))


def _bounded(default: Any, **bounds: Any) -> Any:
    """A dataclass field with range constraints (``min``, ``max``, ``min_exclusive``, ``max_exclusive``)."""
    return field(default=default, metadata=bounds)


def _unit_interval(default: float) -> Any:
    return _bounded(default, min=0, max=1, max_exclusive=True)


@dataclass
class AttentionConfig:
    name: str = "softmax"
    # the variant's keyword options (zoo.attention.attention_options), each checked against its annotation here;
    # ranges are checked when the model is built
    options: dict[str, Any] = field(default_factory=dict)

    def _problems(self) -> list[tuple[str, str]]:
        try:
            variant = get_attention(self.name)
        except ValueError as error:  # the registry's own message: did-you-mean and the known names
            return [("name", str(error))]
        allowed = attention_options(self.name)
        hints = typing.get_type_hints(variant.__init__)
        for key, value in self.options.items():
            if key not in allowed:
                return [(f"options.{key}", _unknown_key(key, list(allowed), f"option of {self.name!r}"))]
            try:
                _check(value, hints.get(key, Any), {}, "")
            except RecipeError as error:
                return [(f"options.{key}", error.problem)]
            except TypeError:
                pass  # an annotation this checker does not read (Sequence[int]): the constructor checks the value
        return []


@dataclass
class SequenceConfig:
    """The 1-D model's own options (``model.kind: sequence``); see ``zoo.models.create_sequence_model``, whose
    defaults these are. Width, depth, heads, MLP ratio, dropout and attention are the shared ``model`` keys."""

    # dna: one token per nucleotide; kmer: k-mers embedded from nucleotides; series: PatchTST patches
    input: Literal[INPUTS] = "dna"
    # null: rotary for causal_lm, learned otherwise
    positions: Optional[Literal[POSITIONS]] = None
    # classification only: how the tokens become one vector
    pool: Literal["cls", "mean", "attention"] = "cls"
    # entries of the learned position table; null: the training split's length in tokens
    max_len: Optional[int] = _bounded(None, min=1)
    kmer: int = _bounded(3, min=1, max=8)
    # null: non-overlapping k-mers (stride kmer), the only kind per-position labels allow
    kmer_stride: Optional[int] = _bounded(None, min=1)
    patch_len: int = _bounded(16, min=1)
    patch_stride: int = _bounded(8, min=1)
    channel_independent: bool = True
    revin: bool = True
    forecast_loss: Literal["mse", "mae"] = "mse"
    tie_embeddings: bool = True


# SequenceConfig keys that only some tasks or inputs use ("task" or "input", the values that use it): elsewhere they
# must keep their defaults, so that no setting is silently ignored.
_SEQUENCE_KEY_USE = {
    "pool": ("task", ("classification",)),
    "kmer": ("input", ("kmer",)),
    "kmer_stride": ("input", ("kmer",)),
    "patch_len": ("input", ("series",)),
    "patch_stride": ("input", ("series",)),
    "channel_independent": ("input", ("series",)),
    "revin": ("input", ("series",)),
    "forecast_loss": ("task", ("forecast",)),
    "tie_embeddings": ("task", ("causal_lm",)),
}

# ModelConfig keys that only timm's VisionTransformer uses: a sequence model must leave them at their defaults.
_VIT_ONLY = (
    "name", "img_size", "patch_size", "in_chans", "stem", "block", "block_options", "reversible", "ff_chunks",
    "dynamic_img_size", "pretrained", "pretrained_file", "timm_kwargs",
)


@dataclass
class ModelConfig:
    # vit: timm's VisionTransformer (images); sequence: zoo's 1-D SequenceModel (DNA, time series)
    kind: Literal["vit", "sequence"] = "vit"
    # any timm VisionTransformer architecture name; None sizes below keep the architecture's own values
    # (for a sequence model: create_sequence_model's, dim 128, depth 4, 4 heads, MLP ratio 4)
    name: str = "vit_small_patch16_224"
    img_size: int = _bounded(224, min=8)
    patch_size: Optional[int] = _bounded(None, min=1)
    embed_dim: Optional[int] = _bounded(None, min=1)
    depth: Optional[int] = _bounded(None, min=1)
    num_heads: Optional[int] = _bounded(None, min=1)
    mlp_ratio: Optional[float] = _bounded(None, min=0, min_exclusive=True)
    # None: taken from the dataset
    in_chans: Optional[int] = _bounded(None, min=1)
    # patch: timm's patchify convolution; conv: a convolutional stem of the same stride (zoo.models.stems)
    stem: Literal["patch", "conv"] = "patch"
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    # timm: timm's pre-norm blocks (attention + MLP); gau: FLASH blocks of two gated attention units, which bring
    # their own attention (attention.name must be gau) - see docs/gau.md
    block: Literal["timm", "gau"] = "timm"
    # gau blocks only: z_dim (shared query/key width, default 128) and expansion (value width / embed_dim, 2)
    block_options: dict[str, Any] = field(default_factory=dict)
    # RevNet couplings (Reformer): blocks recomputed in backward, activation memory independent of depth
    reversible: bool = False
    # the MLP runs over this many checkpointed chunks of the sequence (0 or 1: off); timm blocks only
    ff_chunks: int = _bounded(0, min=0)
    drop_rate: float = _unit_interval(0.0)
    drop_path_rate: float = _unit_interval(0.0)
    attn_drop_rate: float = _unit_interval(0.0)
    dynamic_img_size: bool = False
    grad_checkpointing: bool = False
    pretrained: bool = False
    pretrained_file: Optional[str] = None
    # extra keyword arguments for timm's VisionTransformer
    timm_kwargs: dict[str, Any] = field(default_factory=dict)
    sequence: SequenceConfig = field(default_factory=SequenceConfig)

    def _problems(self) -> list[tuple[str, str]]:
        problems = []
        defaults = ModelConfig()
        if self.kind == "sequence":
            problems += [
                (name, f"a ViT option, unused by model.kind 'sequence'; leave it out, got {_show(getattr(self, name))}")
                for name in _VIT_ONLY if getattr(self, name) != getattr(defaults, name)
            ]
        elif self.sequence != defaults.sequence:
            problems.append(("sequence", "only model.kind 'sequence' takes these options, got model.kind 'vit'"))
        seq = self.sequence
        if seq.kmer_stride is not None and seq.kmer_stride > seq.kmer:
            problem = f"must be <= kmer {seq.kmer} (no base skipped), got {seq.kmer_stride}"
            problems.append(("sequence.kmer_stride", problem))
        if self.embed_dim is not None and self.num_heads is not None and self.embed_dim % self.num_heads:
            problems.append(("num_heads", f"must divide embed_dim {self.embed_dim}, got {self.num_heads}"))
        if self.block == "gau" and self.attention.name != "gau":
            problems.append(("attention.name", f"must be 'gau' when block is 'gau', got {self.attention.name!r}"))
        if self.block == "gau" and self.ff_chunks > 1:
            problems.append(("ff_chunks", f"chunks the MLP of timm blocks; block 'gau' has none, got {self.ff_chunks}"))
        if self.block == "timm" and self.block_options:
            problems.append(("block_options", f"only block 'gau' takes options, got {self.block_options}"))
        return problems


# Options of each dataset under data.options (the ones a recipe sets; the trainer passes split, seed, sample counts
# and data.root itself). Declarations only, never instantiated: a field without a default is required, a field
# with one may be left out (the dataset's own default applies, see zoo.data).
def _option(**bounds: Any) -> Any:
    return field(default=None, metadata=bounds)


@dataclass(kw_only=True)
class _NoOptions:
    pass


@dataclass(kw_only=True)
class GenomesOptions:
    window: int = _option(min=1)
    # reverse-complement augmentation, training split only
    rc_prob: float = _option(min=0, max=1)


@dataclass(kw_only=True)
class YeastCodingOptions:
    window: int = _option(min=1)
    # the training split's window step; val and test never overlap (each position counted once)
    stride: int = _option(min=1)
    rc_prob: float = _option(min=0, max=1)


@dataclass(kw_only=True)
class FastaOptions:
    window: int = field(metadata={"min": 1})
    stride: int = _option(min=1)
    min_length: int = _option(min=1)
    rc_prob: float = _option(min=0, max=1)


@dataclass(kw_only=True)
class GenomicBenchmarksOptions:
    max_length: int = _option(min=1)
    rc_prob: float = _option(min=0, max=1)


@dataclass(kw_only=True)
class UCROptions:
    # a set bundled with sktime, e.g. ACSF1, PLAID (zoo.data.bundled_ucr_names)
    ucr_name: str = field()
    val_fraction: float = _option(min=0, max=1, max_exclusive=True)
    znorm: bool = _option()


@dataclass(kw_only=True)
class SeriesFileOptions:
    znorm: bool = _option()


@dataclass(kw_only=True)
class CsvOptions:
    label_column: str = _option()
    znorm: bool = _option()


@dataclass(kw_only=True)
class ForecastOptions:
    lookback: int = _option(min=1)
    # 96, 192, 336 or 720 in the long-horizon protocol
    horizon: int = _option(min=1)
    # column names; targets must be among the inputs (default: every column in)
    targets: list[str] = _option()  # noqa: RUF009 - None, a declaration only
    inputs: list[str] = _option()  # noqa: RUF009


@dataclass(kw_only=True)
class ForecastCsvOptions(ForecastOptions):
    targets: list[str] = field()


DATASET_OPTIONS: dict[str, type] = {
    "megamnist": _NoOptions, "folder": _NoOptions, "genomes": GenomesOptions, "yeast_coding": YeastCodingOptions,
    "splice": _NoOptions, "fasta": FastaOptions, "genomic_benchmarks": GenomicBenchmarksOptions, "ucr": UCROptions,
    "ts": SeriesFileOptions, "csv": CsvOptions, "elecdemand": ForecastOptions, "forecast_csv": ForecastCsvOptions,
}
# datasets read from the users' files at data.root; genomes, yeast_coding and splice take it as the Debian root
_NEEDS_ROOT = ("folder", "fasta", "genomic_benchmarks", "ts", "csv", "forecast_csv")
_NO_ROOT = ("megamnist", "ucr", "elecdemand")


@dataclass
class DataConfig:
    name: Literal[DATASETS] = "megamnist"
    # users' data: an image folder tree, a FASTA / Genomic Benchmarks tree, a folder of train/val/test .ts or .csv
    # files, the CSV file of forecast_csv; for genomes, yeast_coding and splice the Debian root (null: searched)
    root: Optional[str] = None
    # the options of data.name (DATASET_OPTIONS), e.g. {window: 16384, rc_prob: 0.5} for genomes
    options: dict[str, Any] = field(default_factory=dict, metadata={"schema_by": "name"})
    canvas_size: int = _bounded(1024, min=16)
    digit_size: int = _bounded(28, min=4)
    num_target: int = _bounded(3, min=1)
    num_other: int = _bounded(2, min=0)
    num_clutter: int = _bounded(4, min=0)
    # items per split of generated data: megamnist canvases, genomes windows
    train_samples: int = _bounded(10000, min=1)
    val_samples: int = _bounded(1000, min=1)
    test_samples: int = _bounded(1000, min=1)
    seed: int = 0
    batch_size: int = _bounded(64, min=1)
    eval_batch_size: Optional[int] = _bounded(None, min=1)
    num_workers: int = _bounded(2, min=0)

    def _problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.name in _NEEDS_ROOT and self.root is None:
            problems.append(("root", f"required when data.name is {self.name!r}, got null"))
        if self.name in _NO_ROOT and self.root is not None:
            problem = f"dataset {self.name!r} reads no files of yours; leave it out, got {_show(self.root)}"
            problems.append(("root", problem))
        if self.digit_size > self.canvas_size:
            problems.append(("digit_size", f"must be <= canvas_size {self.canvas_size}, got {self.digit_size}"))
        return problems


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = _bounded(1e-3, min=0, min_exclusive=True)
    weight_decay: float = _bounded(0.05, min=0)
    # the range applies to each beta
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999], metadata={"length": 2, "min": 0, "max": 1, "max_exclusive": True}
    )
    layer_decay: Optional[float] = _bounded(None, min=0, max=1, min_exclusive=True)


@dataclass
class ScheduleConfig:
    name: Literal["cosine", "constant", "step"] = "cosine"
    warmup_steps: int = _bounded(0, min=0)
    warmup_lr: float = _bounded(1e-6, min=0)
    min_lr: float = _bounded(1e-6, min=0)


@dataclass
class TrainConfig:
    epochs: int = _bounded(10, min=1)
    max_steps: Optional[int] = _bounded(None, min=1)
    grad_accum_steps: int = _bounded(1, min=1)
    clip_grad: Optional[float] = _bounded(1.0, min=0, min_exclusive=True)
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    label_smoothing: float = _unit_interval(0.0)
    eval_every_epochs: int = _bounded(1, min=1)
    log_every_steps: int = _bounded(10, min=1)
    checkpoint_every_steps: Optional[int] = _bounded(None, min=1)


@dataclass
class Recipe:
    name: str
    description: str = ""
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # what the model learns; the dataset must serve it (zoo.data.DATASET_TASKS)
    task: Literal[TASKS] = "classification"
    # the task's metrics (zoo.metrics.TASK_METRICS): classification top1 (accuracy), top5, f1 (macro), confusion,
    # mcc, auroc; token_classification the same per position; forecast mse, mae; causal_lm perplexity, top1.
    # Left out: the task's DEFAULT_METRICS (this default is classification's).
    metrics: list[Literal[METRICS]] = field(default_factory=lambda: ["top1", "top5", "f1"], metadata={"unique": True})
    output_dir: Optional[str] = None

    def _problems(self) -> list[tuple[str, str]]:
        problems = []
        served = DATASET_TASKS[self.data.name]
        if self.task not in served:
            datasets = ", ".join(name for name, tasks in DATASET_TASKS.items() if self.task in tasks)
            problem = f"data.name {self.data.name!r} serves {_names(served)}; task {self.task!r} needs {datasets}"
            problems.append(("task", problem))
        problems += self._model_problems()
        allowed = TASK_METRICS[self.task]
        problems += [
            (f"metrics[{i}]", f"task {self.task!r} takes one of {_names(allowed)}, got {name!r}")
            for i, name in enumerate(self.metrics) if name not in allowed
        ]
        if self.train.label_smoothing and self.task != "classification":
            problems.append(("train.label_smoothing", f"only task 'classification' uses it, got task {self.task!r}"))
        return problems

    def _model_problems(self) -> list[tuple[str, str]]:
        domain, kind = DATASET_DOMAINS[self.data.name], self.model.kind
        wanted = "vit" if domain == "image" else "sequence"
        if kind != wanted:
            return [("model.kind", f"data.name {self.data.name!r} holds {domain} data: needs {wanted!r}, got {kind!r}")]
        if kind == "vit":
            return []
        source = self.model.sequence.input
        inputs = ("series",) if domain == "series" else ("dna", "kmer")
        if source not in inputs:
            problem = f"data.name {self.data.name!r} holds {domain} data: takes {_names(inputs)}, got {source!r}"
            return [("model.sequence.input", problem)]
        if source not in TASK_INPUTS[self.task]:
            problem = f"task {self.task!r} takes {_names(TASK_INPUTS[self.task])}, got {source!r}"
            return [("model.sequence.input", problem)]
        return self._unused_sequence_keys()

    def _unused_sequence_keys(self) -> list[tuple[str, str]]:
        seq, defaults, problems = self.model.sequence, SequenceConfig(), []
        for name, (by, users) in _SEQUENCE_KEY_USE.items():
            current = self.task if by == "task" else seq.input
            value, default = getattr(seq, name), getattr(defaults, name)
            if value != default and current not in users:
                problem = f"only {by} {_names(users)} uses it ({by} is {current!r}); leave it at {_show(default)}"
                problems.append((f"model.sequence.{name}", f"{problem}, got {_show(value)}"))
        return problems


def _names(values: Sequence[str]) -> str:
    return ", ".join(repr(value) for value in values)


# YAML 1.2 booleans and floats: `no` stays a string, `1e-3` is a float.
_BOOL_TAG, _FLOAT_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and floats that rejects duplicate keys."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, Hashable) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, _BOOL_RE, list("tTfF"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


class _Dumper(yaml.SafeDumper):
    """SafeDumper that also quotes strings a YAML 1.2 reader would take for floats (`'1e5'`)."""


_Dumper.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = " ".join(str(part) for part in (err.context, err.problem) if part)
        raise RecipeError(f"invalid YAML: {problem}", source=source, key=where) from None
    except yaml.YAMLError as err:
        raise RecipeError(f"invalid YAML: {' '.join(str(err).split())}", source=source) from None


def _read_mapping(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError("file not found", source=str(path)) from None
    except UnicodeDecodeError:
        raise RecipeError("not a UTF-8 text file", source=str(path)) from None
    except OSError as err:
        raise RecipeError(f"cannot read: {err.strerror}", source=str(path)) from None
    data = _parse_yaml(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"expected a mapping at the top level, got {type(data).__name__}", source=str(path))
    return data


def _base_paths(value: Any, path: Path) -> list[Path]:
    entries = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(entries, list):
        raise RecipeError(f"expected a path or a list of paths, got {_show(value)}", source=str(path), key="base")
    bases = []
    for i, entry in enumerate(entries):
        key = "base" if isinstance(value, str) else f"base[{i}]"
        if not isinstance(entry, str) or not entry:
            raise RecipeError(f"expected a path, got {_show(entry)}", source=str(path), key=key)
        base = Path(entry).expanduser()
        bases.append(base if base.is_absolute() else path.parent / base)
    return bases


def _layers(path: Path, chain: tuple[Path, ...] = ()) -> list[tuple[str, dict]]:
    """``(source, mapping)`` for the file and its bases, in merge order (bases first)."""
    data = _read_mapping(path)
    chain = (*chain, path)
    layers = []
    for base in _base_paths(data.pop("base", None), path):
        if any(base.resolve() == seen.resolve() for seen in chain):
            cycle = " -> ".join(str(p) for p in (*chain, base))
            raise RecipeError(f"cycle of bases: {cycle}", source=str(path), key="base")
        if not base.exists():
            raise RecipeError(f"file not found: {base}", source=str(path), key="base")
        layers += _layers(base, chain)
    layers.append((str(path), data))
    return layers


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _merge(dst: dict, src: Mapping, source: str, origins: dict[str, str], prefix: str = "") -> None:
    """Deep-merge ``src`` into ``dst``, recording which source set each key path.

    An empty section (``model:`` with nothing under it, i.e. null) over a mapping keeps the mapping.
    """
    for key, value in src.items():
        path = _join(prefix, key)
        old = dst.get(key)
        if isinstance(old, dict) and (isinstance(value, Mapping) or value is None):
            _merge(old, value or {}, source, origins, path)
        else:
            dst[key] = copy.deepcopy(value)
            origins[path] = source


def _apply_override(tree: dict, item: str, origins: dict[str, str]) -> None:
    source = f"override {item!r}"
    key, sep, text = item.partition("=")
    parts = [part.strip() for part in key.split(".")]
    if not sep or not all(parts):
        raise RecipeError("expected KEY.PATH=VALUE, e.g. train.epochs=3", source=source)
    value = _parse_yaml(text, source)
    node, path = tree, ""
    for part in parts[:-1]:
        path = _join(path, part)
        if not isinstance(node.get(part), dict):
            node[part] = {}
            origins[path] = source
        node = node[part]
    node[parts[-1]] = value
    origins[_join(path, parts[-1])] = source


def _source_of(key: str | None, origins: Mapping[str, str], default: str) -> str:
    """The source that set the longest key path containing ``key``."""
    best, source = -1, default
    for path, origin in origins.items():
        inside = key == path or (key or "").startswith((path + ".", path + "["))
        if inside and len(path) > best:
            best, source = len(path), origin
    return source


def _build_recipe(tree: Mapping, origins: Mapping[str, str], default_source: str) -> Recipe:
    task = tree.get("task", "classification")
    if "metrics" not in tree and isinstance(task, str) and task in DEFAULT_METRICS:
        # the task's own default, not classification's
        tree = {**tree, "metrics": list(DEFAULT_METRICS[task])}
    try:
        return _build(Recipe, tree, "")
    except RecipeError as err:
        raise RecipeError(err.problem, source=_source_of(err.key, origins, default_source), key=err.key) from None


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Load a recipe file with its bases, apply ``KEY.PATH=VALUE`` overrides and validate it.

    ``name`` defaults to the file's stem when the file itself does not set it.
    """
    path = Path(path)
    layers = _layers(path)
    tree: dict = {}
    origins: dict[str, str] = {}
    for source, data in layers:
        _merge(tree, data, source, origins)
    if "name" not in layers[-1][1]:
        tree["name"] = path.stem
        origins["name"] = str(path)
    if isinstance(overrides, str):
        overrides = [overrides]
    for item in overrides:
        _apply_override(tree, item, origins)
    return _build_recipe(tree, origins, str(path))


def recipe_from_dict(data: Mapping, *, source: str = "<dict>") -> Recipe:
    """Validate a plain mapping (as read from YAML) into a :class:`Recipe`."""
    if not isinstance(data, Mapping):
        raise RecipeError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    return _build_recipe(data, {}, source)


def recipe_to_dict(recipe: Recipe) -> dict:
    """The recipe as plain dicts, lists and scalars."""
    return dataclasses.asdict(recipe)


def save_recipe(recipe: Recipe, path: str | Path) -> Path:
    """Write the resolved recipe as YAML (parent folders created); ``load_recipe(path) == recipe``."""
    path = Path(path)
    data = recipe_to_dict(recipe)
    # a recipe changed after loading is checked again, so that the saved file always loads
    recipe_from_dict(data, source=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    path.write_text(text, encoding="utf-8")
    return path


# The validator: walks the dataclass annotations.

_SCALAR_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLAIN_SCALARS = (type(None), bool, int, float, str, date)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _build(cls: type, value: Any, key: str) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise RecipeError(f"expected a mapping, got {_show(value)}", key=key or None)
    names = [f.name for f in dataclasses.fields(cls)]
    for name in value:
        if name not in names:
            raise RecipeError(_unknown_key(name, names), key=_join(key, name))
    kwargs = {}
    for f in dataclasses.fields(cls):
        if "schema_by" in f.metadata:
            # checked even when left out: the schema may require keys
            schema_key = f.metadata["schema_by"]
            schema = DATASET_OPTIONS[kwargs.get(schema_key, getattr(cls, schema_key))]
            kwargs[f.name] = _check_options(schema, value.get(f.name), _join(key, f.name))
        elif f.name in value:
            kwargs[f.name] = _check(value[f.name], _hints(cls)[f.name], f.metadata, _join(key, f.name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecipeError("missing required key", key=_join(key, f.name))
    obj = cls(**kwargs)
    for name, problem in getattr(obj, "_problems", list)():
        raise RecipeError(problem, key=_join(key, name))
    return obj


def _check_options(schema: type, value: Any, key: str) -> dict[str, Any]:
    """The keys ``value`` sets, each checked against the declaration ``schema``; no defaults filled in."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise _expected("a mapping", value, key, False)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for name in value:
        if name not in fields:
            raise RecipeError(_unknown_key(name, list(fields)), key=_join(key, name))
    for f in fields.values():
        if f.name not in value and f.default is dataclasses.MISSING:
            raise RecipeError("missing required key", key=_join(key, f.name))
    hints = _hints(schema)
    return {name: _check(item, hints[name], fields[name].metadata, _join(key, name)) for name, item in value.items()}


def _unknown_key(name: Any, names: list[str], what: str = "key") -> str:
    if not names:
        return f"unknown {what}; this section takes none"
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {what}{hint}; allowed: {', '.join(names)}"


def _check(value: Any, tp: Any, meta: Mapping, key: str, nullable: bool = False) -> Any:
    """``value`` checked against the annotation ``tp`` (and range ``meta``), converted where allowed."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [arg for arg in args if arg is not type(None)]
        if len(inner) != 1 or len(args) != 2:
            raise TypeError(f"unsupported annotation {tp!r}: only Optional[X] unions")
        return None if value is None else _check(value, inner[0], meta, key, nullable=True)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if origin is Literal:
        return _check_choice(value, args, key, nullable)
    if origin is list:
        return _check_list(value, args[0], meta, key, nullable)
    if origin is dict:
        return _check_dict(value, args, key, nullable)
    if tp is Any:
        return _plain(value, key)
    if tp in _SCALAR_NAMES:
        return _check_scalar(value, tp, meta, key, nullable)
    raise TypeError(f"unsupported annotation {tp!r}")


def _expected(what: str, value: Any, key: str, nullable: bool) -> RecipeError:
    return RecipeError(f"expected {what}{' or null' if nullable else ''}, got {_show(value)}", key=key)


def _check_scalar(value: Any, tp: type, meta: Mapping, key: str, nullable: bool) -> Any:
    # a float field takes an integer too (converted); bool is never taken as a number
    allowed = (int, float) if tp is float else tp
    if not isinstance(value, allowed) or (isinstance(value, bool) and tp is not bool):
        raise _expected(_SCALAR_NAMES[tp], value, key, nullable)
    if tp in (int, float) and not _in_range(value, meta):
        raise _expected(f"{_SCALAR_NAMES[tp]} {_range_text(meta)}", value, key, nullable)
    if tp is float:
        try:
            return float(value)
        except OverflowError:
            raise _expected("a number that fits a float", value, key, nullable) from None
    return value


def _in_range(value: float, meta: Mapping) -> bool:
    # written as `not (value >= low)` so that NaN is out of every range
    if "min" in meta and not (value > meta["min"] if meta.get("min_exclusive") else value >= meta["min"]):
        return False
    return "max" not in meta or bool(value < meta["max"] if meta.get("max_exclusive") else value <= meta["max"])


def _range_text(meta: Mapping) -> str:
    low, high = meta.get("min"), meta.get("max")
    if low is not None and high is not None:
        left = "(" if meta.get("min_exclusive") else "["
        right = ")" if meta.get("max_exclusive") else "]"
        return f"in {left}{low}, {high}{right}"
    if low is not None:
        return f"{'>' if meta.get('min_exclusive') else '>='} {low}"
    if high is not None:
        return f"{'<' if meta.get('max_exclusive') else '<='} {high}"
    return ""


def _check_choice(value: Any, choices: tuple, key: str, nullable: bool) -> Any:
    if any(type(value) is type(choice) and value == choice for choice in choices):
        return value
    raise _expected(f"one of {', '.join(repr(choice) for choice in choices)}", value, key, nullable)


def _check_list(value: Any, item_tp: Any, meta: Mapping, key: str, nullable: bool) -> list:
    length = meta.get("length")
    if not isinstance(value, (list, tuple)) or (length is not None and len(value) != length):
        raise _expected("a list" if length is None else f"a list of length {length}", value, key, nullable)
    items = [_check(item, item_tp, meta, f"{key}[{i}]") for i, item in enumerate(value)]
    if meta.get("unique"):
        for i, item in enumerate(items):
            if item in items[:i]:
                raise RecipeError(f"duplicate entry {_show(item)}", key=f"{key}[{i}]")
    return items


def _check_dict(value: Any, args: tuple, key: str, nullable: bool) -> dict:
    if not isinstance(value, Mapping):
        raise _expected("a mapping", value, key, nullable)
    key_tp, value_tp = args
    result = {}
    for name, item in value.items():
        if not isinstance(name, key_tp):
            raise RecipeError(f"expected {_SCALAR_NAMES[key_tp]} as key, got {_show(name)}", key=key)
        result[name] = _check(item, value_tp, {}, _join(key, name))
    return result


def _plain(value: Any, key: str) -> Any:
    """A copy of ``value`` if it is plain YAML data (scalars, lists, mappings), else an error."""
    if isinstance(value, _PLAIN_SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{key}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        for name in value:
            if not isinstance(name, _PLAIN_SCALARS):
                raise RecipeError(f"expected a string or number as key, got {_show(name)}", key=key)
        return {name: _plain(item, _join(key, name)) for name, item in value.items()}
    raise _expected("plain YAML data (null, true/false, number, string, list or mapping)", value, key, False)
