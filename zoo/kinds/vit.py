"""The `vit` model kind: timm's VisionTransformer with any zoo attention (`zoo.models.create_model`), for image
data; its options (`ViTOptions`), the timm preprocessing config model.json records (`pretrained_cfg`) and its
registration."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from torch import nn
from torch.utils.data import Dataset

from ..attention._config import AttentionConfig
from ..data._interface import split_attribute
from ..data._sizes import ModelSizes, plain
from ..models import create_model
from ..tasks import Task, get_task, list_tasks
from ._base import KindOptions, ModelKind, register_model_kind

if TYPE_CHECKING:
    from ..config import Recipe


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
    # task segmentation only (zoo.models.segmentation): linear (Segmenter's linear decoder), pyramid (ViTDet's
    # simple feature pyramid, decoder_channels per level) or progressive (SAM's upsampling with an image path)
    decoder: Literal["linear", "pyramid", "progressive"] = "linear"
    decoder_channels: int = field(default=128, metadata={"min": 1})

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


def _unused_task_options(recipe: Recipe) -> list[tuple[str, str]]:
    """Options only some tasks read (a task's `model_options`, e.g. segmentation's decoder) must keep their
    defaults under another task, so that no setting is silently ignored."""
    defaults, problems = ViTOptions(), []
    for name in ("decoder", "decoder_channels"):
        users = [task for task in list_tasks() if name in get_task(task).model_options]
        value = getattr(recipe.model.options, name)
        if value != getattr(defaults, name) and recipe.task not in users:
            problem = f"only task {', '.join(map(repr, users))} uses it (task is {recipe.task!r})"
            problems.append((f"model.{name}", f"{problem}; leave it at {getattr(defaults, name)!r}, got {value!r}"))
    if "decoder" in get_task(recipe.task).model_options and recipe.model.reversible:
        problem = f"task {recipe.task!r}'s decoder reads the blocks one at a time, which reversible couplings do not"
        problems.append(("model.reversible", f"{problem} allow; got true"))
    return problems


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


register_model_kind(
    ModelKind(
        "vit",
        {"image": ()},
        _build_vit,
        lambda batch: (batch["image"],),
        options=ViTOptions,
        describe=_describe_vit,
        task_section=lambda recipe: recipe.model.options,
        recipe_problems=_unused_task_options,
        data_context=lambda options: {
            "img_size": options.img_size,
            "in_chans": options.in_chans,
            "dynamic_img_size": options.dynamic_img_size,
        },
        without_pretrained=lambda options: dataclasses.replace(options, pretrained=False, pretrained_file=None),
    )
)
