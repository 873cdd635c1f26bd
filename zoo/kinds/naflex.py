"""The `naflex` model kind: timm's NaFlex ViT with any zoo attention (`zoo.models.naflex`), for images at their own
size and aspect ratio (the native-resolution sets of `zoo.data.images.native`: `native_folder`, `native_megamnist`,
`native_megamnist_seg`, `native_mask_folder`), for classification and for segmentation (`NaFlexSegmentation`:
logits at each image's own size); its options (`NaFlexOptions`, the `model.naflex` section) and its registration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from torch import nn
from torch.utils.data import Dataset

from ..attention._config import AttentionConfig
from ..data._interface import split_attribute
from ..data._sizes import ModelSizes, plain
from ..tasks import Task
from ._base import KindOptions, ModelKind, register_model_kind

if TYPE_CHECKING:
    from ..config import Recipe

# the datasets that give NaFlex patch sequences
NATIVE_DATASETS = ("native_folder", "native_megamnist", "native_megamnist_seg", "native_mask_folder")
TASKS = ("classification", "segmentation")
PATCH_KEYS = ("patches", "patch_coord", "patch_valid")


@dataclass
class NaFlexConfig:
    """`model.naflex`: the architecture and what the ViT kind's options are for it."""

    # a zoo NaFlex architecture (zoo.models.naflex.NAFLEX_ARCHITECTURES)
    name: str = "naflexvit_small_patch16_gap"
    # must equal data.options.patch_size
    patch_size: int = field(default=16, metadata={"min": 1})
    # None: taken from the dataset (a folder is read as RGB unless this is 1)
    in_chans: int | None = field(default=None, metadata={"min": 1})
    # per-block layouts: these blocks (0-based, < depth) use global_attention instead
    global_blocks: list[int] = field(default_factory=list, metadata={"min": 0, "unique": True})
    global_attention: AttentionConfig = field(default_factory=AttentionConfig)
    ff_chunks: int = field(default=0, metadata={"min": 0})
    # a timm NaFlex (or classic ViT) weights file, loaded where the shapes match
    pretrained_file: str | None = None
    # extra NaFlexVitCfg fields (pos_embed_grid_size, global_pool, reg_tokens, ...)
    timm_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class NaFlexOptions(KindOptions):
    """`model.kind: naflex`: timm's NaFlex ViT with any zoo attention, configured under `model.naflex`."""

    naflex: NaFlexConfig = field(default_factory=NaFlexConfig)
    # task segmentation only, as for the ViT kind (zoo.models.segmentation): each image's tokens decoded on its grid
    decoder: Literal["linear", "pyramid", "progressive"] = "linear"
    decoder_channels: int = field(default=128, metadata={"min": 1})


def _problems(recipe: Recipe) -> list[tuple[str, str]]:
    problems = []
    if recipe.data.name not in NATIVE_DATASETS:
        problems.append(
            ("data.name", f"model.kind 'naflex' reads {' or '.join(NATIVE_DATASETS)}, got {recipe.data.name!r}")
        )
    else:
        options = recipe.data.options
        patch = options.get("patch_size", 16) if isinstance(options, dict) else options.patch_size
        if patch != recipe.model.naflex.patch_size:
            message = f"must equal data.options.patch_size {patch}, got {recipe.model.naflex.patch_size}"
            problems.append(("model.naflex.patch_size", message))
    if recipe.task not in TASKS:
        problems.append(("task", f"model.kind 'naflex' trains {' or '.join(TASKS)}, got {recipe.task!r}"))
    return problems


def _build(recipe: Recipe, sizes: ModelSizes, task: Task) -> nn.Module:
    from ..models.naflex import create_naflex_model

    cfg, naflex = recipe.model, recipe.model.naflex
    overrides = {k: getattr(cfg, k) for k in ("embed_dim", "depth", "num_heads", "mlp_ratio") if getattr(cfg, k)}
    model = create_naflex_model(
        naflex.name,
        attention=cfg.attention.name,
        attention_options=cfg.attention.options,
        global_blocks=naflex.global_blocks,
        global_attention=naflex.global_attention.name,
        global_attention_options=naflex.global_attention.options,
        ff_chunks=naflex.ff_chunks,
        pretrained_file=naflex.pretrained_file,
        patch_size=naflex.patch_size,
        in_chans=naflex.in_chans or sizes.in_chans,
        drop_rate=cfg.drop_rate,
        drop_path_rate=cfg.drop_path_rate,
        attn_drop_rate=cfg.attn_drop_rate,
        **task.model_sizes(sizes),
        **overrides,
        **naflex.timm_kwargs,
    )
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def _describe(recipe: Recipe, train_set: Dataset, task: Task) -> dict[str, Any]:
    """What model.json records of how images are read: the patch size, the token budget, the resize rule and the
    normalisation (zoo.predict reads files the same way)."""
    native = train_set
    while not hasattr(native, "max_tokens") and hasattr(native, "dataset"):
        native = native.dataset  # a Subset or another wrapper
    mean, std = plain(split_attribute(train_set, "mean")), plain(split_attribute(train_set, "std"))
    return {
        "naflex": {
            "patch_size": recipe.model.naflex.patch_size,
            "max_tokens": native.max_tokens,
            "resize": native.resize,
            "mean": [float(v) for v in (mean.flatten().tolist() if hasattr(mean, "flatten") else mean)],
            "std": [float(v) for v in (std.flatten().tolist() if hasattr(std, "flatten") else std)],
        }
    }


register_model_kind(
    ModelKind(
        "naflex",
        {"image": ()},
        _build,
        lambda batch: ({key: batch[key] for key in PATCH_KEYS},),
        options=NaFlexOptions,
        task_section=lambda recipe: recipe.model.options,
        describe=_describe,
        recipe_problems=_problems,
        data_context=lambda options: {"in_chans": options.naflex.in_chans},
        without_pretrained=lambda options: dataclasses.replace(
            options, naflex=dataclasses.replace(options.naflex, pretrained_file=None)
        ),
    )
)
