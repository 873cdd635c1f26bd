"""Model kinds: how a recipe's `model.kind` becomes a model sized from the training split, and what of a batch it
reads. Each kind is a `ModelKind` registered by name:

- `vit`: timm's VisionTransformer with any zoo attention (`zoo.models.create_model`), for image data;
- `sequence`: zoo's 1-D `SequenceModel` (`zoo.models.create_sequence_model`), for dna, series and tokens data.

The task (`zoo.tasks`) gives the sizes it needs (classes, vocabulary, horizon); the kind adds its own (input length,
channels) and reads its recipe section. The engine builds every model through `get_model_kind(recipe.model.kind)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.utils.data import Dataset

from ._validate import did_you_mean
from .models import create_model, create_sequence_model
from .tasks import Task, get_task

if TYPE_CHECKING:
    from .recipe import Recipe

__all__ = [
    "ModelKind",
    "get_model_kind",
    "list_model_kinds",
    "model_kind_for",
    "register_model_kind",
    "sequence_length",
]


@dataclass(frozen=True)
class ModelKind:
    name: str
    # data kind (zoo.data.INPUT_KINDS) -> the model.sequence.input values that read it (empty: no choice to make)
    data_kinds: Mapping[str, tuple[str, ...]]
    # (recipe, training split, task) -> the model, sized from the split
    build: Callable[[Recipe, Dataset, Task], nn.Module]
    # a batch (dict) -> the model's positional inputs
    inputs: Callable[[Mapping[str, Tensor]], tuple[Tensor, ...]]
    # the recipe section whose keys configure the task (`Task.configured`), None for none
    task_section: Callable[[Recipe], Any] = lambda recipe: None

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


def model_kind_for(data_kind: str) -> ModelKind:
    """The kind that reads data of `data_kind`."""
    for kind in _KINDS.values():
        if data_kind in kind.data_kinds:
            return kind
    raise ValueError(f"no model kind reads {data_kind!r} data; kinds: {', '.join(_KINDS)}")


def _build_vit(recipe: Recipe, train_set: Dataset, task: Task) -> nn.Module:
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
        in_chans=cfg.in_chans or train_set.in_chans,
        drop_rate=cfg.drop_rate,
        drop_path_rate=cfg.drop_path_rate,
        attn_drop_rate=cfg.attn_drop_rate,
        dynamic_img_size=cfg.dynamic_img_size,
        **task.model_sizes(train_set),
        **overrides,
        **cfg.timm_kwargs,
    )
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def sequence_length(dataset: Dataset) -> int:
    """Input length of the split: its look-back, window or longest series, else its longest sequence. Never
    the first item's: the learned position table would be stretched over every longer batch."""
    for attr in ("lookback", "window", "max_length"):
        if getattr(dataset, attr, None):
            return int(getattr(dataset, attr))
    sequences = getattr(dataset, "sequences", None)
    if sequences is not None:
        return max(len(sequence) for sequence in sequences)
    samples = (dataset[i] for i in range(len(dataset)))
    return max(len(sample["tokens"] if "tokens" in sample else sample["values"]) for sample in samples)


def _build_sequence(recipe: Recipe, train_set: Dataset, task: Task) -> nn.Module:
    """The 1-D model, sized from the training split: its length, channels (series), vocabulary (tokens), and
    what the task reads from it (classes, horizon, target channels)."""
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
    sizes: dict[str, Any] = {"seq_len": sequence_length(train_set)}
    if seq.input == "series":
        sizes["num_channels"] = train_set.in_chans
    elif seq.input == "tokens":
        sizes["vocab_size"] = train_set.vocab_size
    sizes.update(task.model_sizes(train_set))
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
        **sizes,
    )


def _sequence_inputs(batch: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
    """`(tokens [b, n] or values [b, n, c], mask [b, n])`."""
    return batch["tokens"] if "tokens" in batch else batch["values"], batch["mask"]


register_model_kind(ModelKind("vit", {"image": ()}, _build_vit, lambda batch: (batch["image"],)))
register_model_kind(
    ModelKind(
        "sequence",
        {"dna": ("dna", "kmer"), "series": ("series",), "tokens": ("tokens",)},
        _build_sequence,
        _sequence_inputs,
        task_section=lambda recipe: recipe.model.sequence,
    )
)
