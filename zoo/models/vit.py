"""timm Vision Transformers with any registered attention, in every block or per block: the zoo's model file.

Shaped like timm's own model files (`timm/models/deit.py`): `ZooVisionTransformer` (timm's `VisionTransformer`
built through its `attn_layer`, `block_fn` and `embed_layer` slots) and `ReversibleVisionTransformer`, a
`checkpoint_filter_fn`, `default_cfgs` and one `@register_model` entry point `zoo_<timm name>` per architecture,
so `timm.create_model('zoo_vit_small_patch16_224', attention='performer')` works like any timm model, and
`zoo.create_model('vit_small_patch16_224', ...)` is the same model with the file route for weights.

`forward_features`, `forward_head`, `reset_classifier`, `set_grad_checkpointing` and `dynamic_img_size` behave
as in timm. The backbone options of `zoo.models.blocks` (`block='gau'`, `reversible=True`, `ff_chunks=4`) work
with any attention; `global_blocks=[2, 5, 8, 11]` puts `global_attention` in those blocks (ViTDet's layout).
Variants that attend on the patch grid (`needs_grid`) get `grid_size` and `num_prefix_tokens` from the model,
and, with `dynamic_img_size=True`, the grid of every input.

Pretrained timm weights load into any variant: from a file (`pretrained_file=`, or timm's
`pretrained_cfg_overlay=dict(file=...)`) or from the hub (`pretrained=True`), both through timm's
`load_pretrained` with every adaptation in `checkpoint_filter_fn`: `pos_embed` is resampled to the new resolution,
the input channels adapted, the classifier kept at its initialisation when the class count differs, and the only
other keys allowed to stay unfilled are a variant's own attention parameters (`load_timm_weights` loads a file into
a model already built, the same way). Without a network set `HF_HUB_OFFLINE=1` (the hub client's
own switch): a cached checkpoint then loads at once and a missing one fails at once, naming the file route.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import timm
import torch
from huggingface_hub import is_offline_mode
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD
from timm.layers import to_2tuple, use_reentrant_ckpt
from timm.models import (
    build_model_with_cfg,
    generate_default_cfgs,
    load_pretrained,
    register_model,
    register_notrace_module,
)
from timm.models._manipulate import adapt_input_conv
from timm.models.vision_transformer import VisionTransformer
from timm.models.vision_transformer import checkpoint_filter_fn as vit_checkpoint_filter_fn
from torch import nn

from .._validate import first_line, unknown_name
from .._weights import WeightsError, check_state_dict, read_weights
from ..attention import attention_class, get_attention
from ..attention._common import TIMM_ATTENTION_KEYS, AttentionBase
from .blocks import ReversibleSequence, block_class
from .stems import STEMS

__all__ = [
    "VIT_ARCHITECTURES",
    "LoadReport",
    "ReversibleVisionTransformer",
    "ZooVisionTransformer",
    "checkpoint_filter_fn",
    "create_model",
    "load_timm_weights",
]  # register_model adds each entry point

_logger = logging.getLogger(__name__)

# timm's fx feature extraction (`create_feature_extractor`, `features_only=True, feature_cls="fx"`) traces the model
# symbolically; an attention's forward branches on its input's length and mask (block sizes, padding, fast paths),
# which a symbolic trace cannot follow, so every zoo attention is one leaf node of the graph, as timm's own
# non-traceable layers are. Feature nodes are then the blocks (and anything outside the attention).
register_notrace_module(AttentionBase)


class ZooVisionTransformer(VisionTransformer):
    """timm's `VisionTransformer` whose blocks use zoo attention `attention` (with `attention_options`), and
    `global_attention` in the blocks `global_blocks`; the other arguments are timm's.

    `block`: `timm` or `gau` (FLASH blocks, with `attention='gau'`; `block_options` may set `z_dim` and
    `expansion`); `ff_chunks`: the MLP runs over that many checkpointed chunks of the sequence (see
    `zoo.models.blocks`); `stem`: `patch` (timm's patchify convolution) or `conv` (`zoo.models.stems`).
    Parameter names are timm's whatever the attention, so timm checkpoints load. `zoo_args` records every
    construction argument, the attention and block choices included (`zoo.hub.load.model_args` rebuilds from it).

    Variants that attend on the patch grid (`needs_grid`) get `grid_size` from the patch embedding and
    `num_prefix_tokens` from the model. With `dynamic_img_size=True` a forward pre-hook on `patch_embed` (where
    `forward`, `forward_features` and `forward_intermediates` all start) calls their `set_grid` with the grid of
    each input; `set_input_size` does the same for a fixed size.
    """

    reversible: ClassVar[bool] = False

    def __init__(
        self,
        *,
        attention: str = "softmax",
        attention_options: dict[str, Any] | None = None,
        global_blocks: Sequence[int] = (),
        global_attention: str = "softmax",
        global_attention_options: dict[str, Any] | None = None,
        block: str = "timm",
        block_options: dict[str, Any] | None = None,
        ff_chunks: int = 0,
        stem: str = "patch",
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        depth: int = 12,
        class_token: bool = True,
        reg_tokens: int = 0,
        dynamic_img_pad: bool = False,
        **kwargs: Any,
    ) -> None:
        for slot, option in (("attn_layer", "attention"), ("block_fn", "block"), ("embed_layer", "stem")):
            if slot in kwargs:
                raise ValueError(f"{slot} is set from {option}=; choose the layer with {option}= instead")
        if stem not in STEMS:
            raise unknown_name("stem", stem, STEMS)
        # What timm's PatchEmbed and VisionTransformer will build (checked below): 2-D attention needs it now.
        grid = _patch_grid(img_size, patch_size, dynamic_img_pad)
        prefix = int(class_token) + reg_tokens
        layout = _check_global_blocks(global_blocks, depth, global_attention, global_attention_options)
        attn_layer = _attention_layer(attention, attention_options, grid, prefix)
        global_layer = _attention_layer(global_attention, global_attention_options, grid, prefix) if layout else None
        block_fn = block_class(
            block, attention=attention, attention_options=attention_options, block_options=block_options,
            ff_chunks=ff_chunks, attn_layers=dict.fromkeys(layout, global_layer),
        )  # fmt: skip
        super().__init__(
            img_size=img_size, patch_size=patch_size, depth=depth, class_token=class_token, reg_tokens=reg_tokens,
            dynamic_img_pad=dynamic_img_pad, attn_layer=attn_layer, block_fn=block_fn, embed_layer=STEMS[stem],
            **kwargs,
        )  # fmt: skip
        assert tuple(self.patch_embed.grid_size) == grid and self.num_prefix_tokens == prefix, "grid mismatch"
        # The one record of the construction: the keyword arguments of create_model(architecture, ...) that rebuild
        # this model (save_pretrained; zoo.convert.model.swap_attention updates its attention entries).
        self.zoo_args = {
            "attention": attention, "attention_options": dict(attention_options or {}), "global_blocks": layout,
            "global_attention": global_attention, "global_attention_options": dict(global_attention_options or {}),
            "block": block, "block_options": dict(block_options or {}), "reversible": self.reversible,
            "ff_chunks": ff_chunks, "stem": stem, "img_size": img_size, "patch_size": patch_size, "depth": depth,
            "class_token": class_token, "reg_tokens": reg_tokens, "dynamic_img_pad": dynamic_img_pad, **kwargs,
        }  # fmt: skip
        if self.dynamic_img_size:
            # Also when no block needs the grid yet: an attention swapped in later (zoo.convert.model) gets it too.
            self.patch_embed.register_forward_pre_hook(self._grid_from_input)

    def _grid_attentions(self) -> list[nn.Module]:
        return [module for module in self.blocks.modules() if getattr(module, "needs_grid", False)]

    def _set_grid(self, grid_size: tuple[int, int]) -> None:
        for module in self._grid_attentions():
            module.set_grid(tuple(grid_size))

    def _grid_from_input(self, patch_embed: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        """Forward pre-hook of `patch_embed` (every forward path starts there): the grid of this `[b, c, H, W]`."""
        self._set_grid(patch_embed.dynamic_feat_size(args[0].shape[-2:]))

    def set_input_size(
        self, img_size: tuple[int, int] | None = None, patch_size: tuple[int, int] | None = None
    ) -> None:
        super().set_input_size(img_size=img_size, patch_size=patch_size)
        self._set_grid(self.patch_embed.grid_size)
        if hasattr(self, "pretrained_cfg"):
            _report_own_input(self)

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        # Reentrant checkpointing runs the first forward without a graph and back-propagates only the blocks'
        # outputs: an auxiliary loss would get no gradient. The default (non-reentrant) keeps it.
        if enable and use_reentrant_ckpt():
            losing = sorted({type(m).__name__ for m in self.modules() if hasattr(m, "aux_loss")})
            if losing:
                raise ValueError(
                    f"reentrant gradient checkpointing (TIMM_REENTRANT_CKPT / timm.layers.set_reentrant_ckpt) "
                    f"would drop the auxiliary loss of {', '.join(losing)}; use timm's default, non-reentrant"
                )
        super().set_grad_checkpointing(enable)


class ReversibleVisionTransformer(ZooVisionTransformer):
    """`ZooVisionTransformer` whose `blocks` is a `ReversibleSequence`: RevNet couplings, activation memory
    independent of depth; the weights and their names are those of the plain model.

    `forward_features` always runs the stack as a whole: with a mask, causally, and under
    `set_grad_checkpointing(True)` (which changes nothing here: the couplings already recompute every block).
    """

    reversible: ClassVar[bool] = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.blocks = ReversibleSequence(*self.blocks)

    def forward_features(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        x = self.norm_pre(self.patch_drop(self._pos_embed(self.patch_embed(x))))
        return self.norm(self.blocks(x, attn_mask=attn_mask, is_causal=is_causal))

    def forward_intermediates(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(
            "forward_intermediates runs blocks one at a time, which reversible couplings do not allow; build the "
            "model with reversible=False to take intermediate features"
        )


def _patch_grid(img_size, patch_size, dynamic_img_pad: bool) -> tuple[int, int]:
    """The token grid of timm's `PatchEmbed` for these arguments (padded up with `dynamic_img_pad`)."""
    (height, width), (ph, pw) = to_2tuple(img_size), to_2tuple(patch_size)
    if dynamic_img_pad:
        return -(-height // ph), -(-width // pw)
    return height // ph, width // pw


def _attention_layer(name: str, options: dict[str, Any] | None, grid: tuple[int, int], prefix: int) -> type[nn.Module]:
    """The bound attention class; a variant that attends on the patch grid gets the grid and prefix count."""
    options = dict(options or {})
    if getattr(get_attention(name), "needs_grid", False):
        for key, value in (("grid_size", grid), ("num_prefix_tokens", prefix)):
            given = options.setdefault(key, value)
            if (tuple(given) if isinstance(given, (list, tuple)) else given) != value:
                raise ValueError(
                    f"attention {name!r}: {key}={given!r} contradicts the model's {value!r} (patch grid {grid}, "
                    f"{prefix} prefix tokens); leave {key} out, the model sets it"
                )
    return attention_class(name, **options)


def _check_global_blocks(
    blocks: Sequence[int], depth: int, attention: str, options: dict[str, Any] | None
) -> list[int]:
    """`blocks` as a sorted list of distinct indices in `0..depth-1`; one-line errors naming the bad ones."""
    if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Sequence):
        raise ValueError(f"global_blocks={blocks!r} must be a list of block indices in 0..{depth - 1}")
    blocks = list(blocks)
    wrong = [b for b in blocks if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < depth]
    if wrong:
        raise ValueError(f"global_blocks {wrong} out of range for depth {depth}: indices must be in 0..{depth - 1}")
    if len(set(blocks)) != len(blocks):
        raise ValueError(f"global_blocks {blocks} names a block twice")
    if not blocks and (attention != "softmax" or options):
        raise ValueError(
            f"global_attention {attention!r} with options {options or {}} applies only to the blocks named in "
            "global_blocks, which is empty; name the blocks or leave global_attention out"
        )
    return sorted(blocks)


def _create_zoo_vit(variant: str, pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    reversible = kwargs.pop("reversible", False)
    if not isinstance(reversible, bool):
        raise ValueError(f"reversible={reversible!r} must be True or False")
    out_indices = kwargs.pop("out_indices", 3)
    # A feature extractor is wrapped once its weights are in: timm loads those itself, through the same filter.
    features = bool(kwargs.get("features_only"))
    if features and reversible:
        raise ValueError(
            "features_only=True takes the blocks' outputs one at a time (forward_intermediates), which reversible "
            "couplings do not allow: build the feature extractor with reversible=False"
        )
    model = build_model_with_cfg(
        _vit_class(reversible, dense="decoder" in kwargs),
        variant,
        pretrained and features,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg={"out_indices": out_indices, "feature_cls": "getter"},
        **kwargs,
    )
    if pretrained and not features:
        _load_pretrained_weights(model)
    if features:
        # timm's FeatureGetterNet wraps the model (as .model) and carries a cfg of its own: both report the input
        _report_own_input(model.model)
        _report_own_input(model, backbone=model.model)
    else:
        _report_own_input(model)
    return model


def _vit_class(reversible: bool, dense: bool) -> type[ZooVisionTransformer]:
    """The class `_create_zoo_vit` builds: with `decoder=` a segmentation model (`zoo.models.segmentation`), which
    reads the blocks one at a time and so cannot be reversible."""
    if not dense:
        return ReversibleVisionTransformer if reversible else ZooVisionTransformer
    if reversible:
        raise ValueError(
            "a segmentation model (decoder=...) reads the blocks one at a time (forward_intermediates), which "
            "reversible couplings do not allow: build it with reversible=False"
        )
    return DECODER_MODELS["segmentation"]


# ViT classes that take a decoder (`decoder=`): zoo.models.segmentation registers its SegmentationViT here (zoo.models
# imports it), so that this module does not import it back
DECODER_MODELS: dict[str, type[ZooVisionTransformer]] = {}


def _load_pretrained_weights(model: ZooVisionTransformer) -> None:
    """timm's `load_pretrained` of the weights `model.pretrained_cfg` names (a `file`, else the hub), with every
    adaptation in `checkpoint_filter_fn`: the cfg handed to timm names no first convolution or classifier for timm
    to adapt as well (timm 1.0.29 and 1.0.31 adapt them differently). A file is read by `zoo._weights.read_weights`
    (one-line errors for what is not weights); the hub's failures are one line naming the file route."""
    cfg = dict(model.pretrained_cfg)
    in_chans = model.zoo_args.get("in_chans", 3)
    source = {**cfg, "first_conv": None, "classifier": None, "input_size": (in_chans, *cfg["input_size"][1:])}
    if source.get("file") and source.get("state_dict") is None:
        source["state_dict"] = read_weights(Path(source["file"]).expanduser())
    try:
        load_pretrained(
            model, pretrained_cfg=source, num_classes=model.num_classes, in_chans=in_chans,
            filter_fn=checkpoint_filter_fn,
        )  # fmt: skip
    except (EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled) as error:
        raise RuntimeError(_hub_failure(model.pretrained_cfg["architecture"], error)) from None


def per_channel(name: str, values: Sequence[float], in_chans: int) -> list[float]:
    """`values` (a mean or std) for `in_chans` channels: as they are, one repeated, or three averaged into one."""
    values = [float(v) for v in values]
    if len(values) == in_chans:
        return values
    if len(values) == 1:
        return values * in_chans
    if len(values) == 3 and in_chans == 1:
        # the convention of zoo.data's image folders: one channel gets the mean of the three
        return [sum(values) / 3]
    raise ValueError(
        f"{name} has {len(values)} values for a model of {in_chans} input channels: pass "
        f"data_config={{'{name}': [...]}} with 1 or {in_chans} values"
    )


def _report_own_input(model: nn.Module, backbone: ZooVisionTransformer | None = None) -> None:
    """timm keeps the architecture's `input_size` (3, 224, 224) in `pretrained_cfg` whatever size the model was
    built for, so `timm.data.resolve_data_config(model=model)` would shrink every image to 224 px for a 1024-px
    model: the model's own channels and size go there instead, with a mean and std per channel, as a loaded run
    records them (`zoo.hub.load`). A cfg that already agrees (a loaded run's) is left as it is. `backbone`: the ViT
    that `model` wraps (timm's feature extractor), `model` itself by default."""
    backbone = model if backbone is None else backbone
    cfg, in_chans = dict(model.pretrained_cfg), backbone.zoo_args.get("in_chans", 3)
    size = (in_chans, *backbone.patch_embed.img_size)
    if tuple(cfg.get("input_size", ())) != size:
        cfg["input_size"] = size
    cfg["fixed_input_size"] = not backbone.dynamic_img_size
    for key in ("mean", "std"):
        if key in cfg and len(cfg[key]) != in_chans:
            cfg[key] = tuple(_architecture_stat(key, cfg[key], in_chans))
    model.pretrained_cfg = model.default_cfg = cfg


def _architecture_stat(name: str, values: Sequence[float], in_chans: int) -> list[float]:
    """The architecture's RGB mean or std for a model of `in_chans` channels. Three values for a channel count
    other than 1 or 3 (a 2-channel microscope, a 4-channel satellite image) say nothing per channel: each channel
    gets their mean, as one channel does. A user's own values (`data_config`) go through `per_channel`, strictly."""
    if len(values) == 3 and in_chans not in (1, 3):
        return [sum(float(v) for v in values) / 3] * in_chans
    return per_channel(name, values, in_chans)


def _hub_failure(variant: str, error: Exception) -> str:
    """One line: why the hub gave no weights, and how to load them from a file instead."""
    if is_offline_mode():
        reason = "the hub is not reachable in offline mode (HF_HUB_OFFLINE=1) and the checkpoint is not cached"
    elif isinstance(error, EntryNotFoundError):
        reason = "the hub is not reachable and the checkpoint is not cached (set HF_HUB_OFFLINE=1 to skip the retries)"
    else:
        reason = f"{type(error).__name__}: {first_line(error, 'no message')}"
    return (
        f"could not fetch pretrained weights for {variant!r} from the Hugging Face hub: {reason}. Download the timm "
        f"checkpoint elsewhere and pass it as a file: zoo.create_model(..., pretrained_file='model.safetensors'), "
        f"timm.create_model(..., pretrained=True, pretrained_cfg_overlay=dict(file=...)) or model.pretrained_file "
        f"in a recipe"
    )


def _is_attention_extra(key: str) -> bool:
    """True for a parameter or buffer of a variant that timm's `Attention` does not have."""
    if ".attn." not in key:
        return False
    return not key.split(".attn.", 1)[1].startswith(TIMM_ATTENTION_KEYS)


def checkpoint_filter_fn(state_dict: dict[str, torch.Tensor], model: VisionTransformer) -> dict[str, torch.Tensor]:
    """timm ViT weights adapted to `model`, whatever its attention variant: timm's ViT filter (other key layouts,
    `pos_embed` and the patch size resampled), the input channels (3 to any count, any count to 1), a classifier of
    another size and a variant's own attention parameters (missing from the file, or of another shape) kept at the
    model's initialisation (and logged). Weights that fit nowhere are a one-line `WeightsError` naming the file."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    source = str(cfg.get("file") or cfg.get("hf_hub_id") or cfg.get("architecture"))
    return _adapt(state_dict, model, source)[0]


@dataclass
class LoadReport:
    """What loading pretrained weights left out: a variant's own attention parameters, a resized head."""

    source: str
    missing_attention_keys: list[str] = field(default_factory=list)
    dropped_keys: list[str] = field(default_factory=list)


def _fit_to_model(state: dict[str, torch.Tensor], model: VisionTransformer, source: str) -> dict[str, torch.Tensor]:
    """timm's ViT filter (other key layouts converted, `pos_embed` and a patch embedding of another patch size
    resampled), then a `WeightsError` for what loading cannot adapt: another architecture, width, depth, MLP width."""
    try:
        fitted = vit_checkpoint_filter_fn(state, model)
    except Exception as error:  # noqa: BLE001 - re-raised below as a WeightsError naming the file
        # timm's filter fails in many ways on weights of another shape or layout: the check names what differs
        check_state_dict(model, state, source, adapt=True)
        raise WeightsError(f"{source}: timm's ViT conversion failed: {first_line(error)}") from None
    check_state_dict(model, fitted, source, adapt=True)
    conv = "patch_embed.proj.weight"
    if conv in state and conv in fitted and state[conv].shape[-2:] != fitted[conv].shape[-2:]:
        _logger.warning(
            "%s: patch embedding resampled from patch size %s to %s (FlexiViT)",
            source, tuple(state[conv].shape[-2:]), tuple(fitted[conv].shape[-2:]),
        )  # fmt: skip
    return fitted


def _adapt_input_channels(state: dict[str, torch.Tensor], target: dict[str, torch.Tensor], source: str) -> None:
    """timm's rule for a first convolution of other input channels: 3 channels become any number, any number
    become 1; nothing else is defined."""
    conv = "patch_embed.proj.weight"
    if conv in state and conv in target and state[conv].shape[1] != target[conv].shape[1]:
        channels = state[conv].shape[1], target[conv].shape[1]
        if channels[0] != 3 and channels[1] != 1:
            raise WeightsError(
                f"{source}: input channels (in_chans) {channels[0]} in the file, {channels[1]} in the model: only "
                "3 channels adapt to another count (and any count to 1)"
            )
        state[conv] = adapt_input_conv(channels[1], state[conv])


def _adapt(state: dict[str, torch.Tensor], model: VisionTransformer, source: str) -> tuple[dict, LoadReport]:
    """`state` fitted to `model` key for key (see `checkpoint_filter_fn`), and what was left out."""
    state = _fit_to_model(state, model, source)
    target = model.state_dict()
    _adapt_input_channels(state, target, source)
    dropped = [
        k for k, v in state.items()
        if (k.startswith("head") or _is_attention_extra(k)) and (k not in target or v.shape != target[k].shape)
    ]  # fmt: skip
    for key in dropped:
        del state[key]
    missing = [k for k in target if k not in state]
    missing_extra = [k for k in missing if _is_attention_extra(k)]
    # a segmentation decoder (zoo.models.segmentation) is new to any classification checkpoint
    bad_missing = [k for k in missing if k not in missing_extra and k not in dropped and not k.startswith("decoder.")]
    unexpected = [k for k in state if k not in target]
    if unexpected or bad_missing:
        raise WeightsError(
            f"{source}: weights do not fit the model: missing {bad_missing[:8]}, unexpected {unexpected[:8]}"
            f"{' (and more)' if len(bad_missing) > 8 or len(unexpected) > 8 else ''}"
        )
    _log_left_out(source, missing_extra, dropped)
    # what stays at the model's initialisation is filled from it: the state fits the model exactly
    kept = {k: target[k] for k in missing}
    return {**state, **kept}, LoadReport(source, missing_extra, dropped)


def _log_left_out(source: str, missing_extra: list[str], dropped: list[str]) -> None:
    if missing_extra:
        _logger.warning(
            "%s: %d attention parameters not in the checkpoint keep their initialisation: %s",
            source, len(missing_extra), sorted({k.split(".attn.")[1] for k in missing_extra}),
        )  # fmt: skip
    heads = [k for k in dropped if k.startswith("head")]
    if heads:
        _logger.warning("%s: classifier %s has another class count and was re-initialised", source, heads)
    if len(heads) < len(dropped):
        _logger.warning(
            "%s: attention parameters of another variant or shape left out: %s",
            source, sorted({k.split(".attn.")[1] for k in dropped if k not in heads}),
        )  # fmt: skip


def load_state_dict_into(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> LoadReport:
    """Load `state` (timm ViT keys) into `model` adapted as `checkpoint_filter_fn` adapts pretrained weights; a
    key that fits nowhere is a one-line `WeightsError` naming `source`."""
    state, report = _adapt(state, model, source)
    model.load_state_dict(state)
    return report


def load_timm_weights(model: VisionTransformer, path: str | Path) -> LoadReport:
    """Load a timm weights file (`.safetensors`, `.pth`, `.bin`, read by `zoo._weights.read_weights`) into the
    built `model`, whatever its attention variant, adapted as `checkpoint_filter_fn` adapts pretrained weights;
    weights that do not fit are a one-line `WeightsError` naming the file. To build a model with a file's weights,
    pass `pretrained_file=` to `create_model` (timm's `pretrained_cfg_overlay=dict(file=...)`)."""
    path = Path(path).expanduser()
    return load_state_dict_into(model, read_weights(path), str(path))


def create_model(
    name: str,
    *,
    attention: str = "softmax",
    attention_options: dict[str, Any] | None = None,
    global_blocks: Sequence[int] = (),
    global_attention: str = "softmax",
    global_attention_options: dict[str, Any] | None = None,
    block: str = "timm",
    block_options: dict[str, Any] | None = None,
    reversible: bool = False,
    ff_chunks: int = 0,
    stem: str = "patch",
    pretrained: bool = False,
    pretrained_file: str | Path | None = None,
    **timm_kwargs: Any,
) -> ZooVisionTransformer:
    """ViT `name` (`vit_small_patch16_224` or `zoo_vit_small_patch16_224`, see `VIT_ARCHITECTURES`) whose blocks
    use attention `attention`, and `global_attention` in blocks `global_blocks` (e.g. `[2, 5, 8, 11]`).

    `reversible`: RevNet couplings (`ReversibleVisionTransformer`); the other options: `ZooVisionTransformer`.
    Weights: `pretrained_file` (a timm `.safetensors` / `.pth`, offline) or `pretrained=True` (the hub).
    `timm_kwargs` go to timm (`img_size`, `num_classes`, `in_chans`, `dynamic_img_size`, `drop_path_rate`, ...).
    """
    if pretrained_file is not None:
        # timm's file route: the weights named in the cfg, adapted by checkpoint_filter_fn
        overlay = {**(timm_kwargs.pop("pretrained_cfg_overlay", None) or {}), "file": str(pretrained_file)}
        timm_kwargs["pretrained_cfg_overlay"] = overlay
    model = timm.create_model(
        _variant(name),
        pretrained=pretrained or pretrained_file is not None,
        attention=attention,
        attention_options=attention_options,
        global_blocks=global_blocks,
        global_attention=global_attention,
        global_attention_options=global_attention_options,
        block=block,
        block_options=block_options,
        reversible=reversible,
        ff_chunks=ff_chunks,
        stem=stem,
        **timm_kwargs,
    )
    return model


def _variant(name: str) -> str:
    base = name.removeprefix("zoo_")
    if base not in VIT_ARCHITECTURES:
        raise unknown_name("model", name, VIT_ARCHITECTURES)
    return f"zoo_{base}"


def _cfg(hf_hub_id: str, **kwargs: Any) -> dict[str, Any]:
    """timm's weights `hf_hub_id` and their preprocessing (as timm's own config of that checkpoint)."""
    return {
        "hf_hub_id": hf_hub_id, "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 0.9, "interpolation": "bicubic", "fixed_input_size": True,
        "mean": IMAGENET_INCEPTION_MEAN, "std": IMAGENET_INCEPTION_STD,
        "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0",
        **kwargs,
    }  # fmt: skip


_AT_384 = {"input_size": (3, 384, 384), "crop_pct": 1.0}

default_cfgs = generate_default_cfgs({
    "zoo_vit_tiny_patch16_224.augreg_in21k_ft_in1k": _cfg("timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"),
    "zoo_vit_small_patch16_224.augreg_in21k_ft_in1k": _cfg("timm/vit_small_patch16_224.augreg_in21k_ft_in1k"),
    "zoo_vit_base_patch16_224.augreg2_in21k_ft_in1k": _cfg("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"),
    "zoo_vit_large_patch16_224.augreg_in21k_ft_in1k": _cfg("timm/vit_large_patch16_224.augreg_in21k_ft_in1k"),
    "zoo_vit_tiny_patch16_384.augreg_in21k_ft_in1k": _cfg(
        "timm/vit_tiny_patch16_384.augreg_in21k_ft_in1k", **_AT_384),
    "zoo_vit_small_patch16_384.augreg_in21k_ft_in1k": _cfg(
        "timm/vit_small_patch16_384.augreg_in21k_ft_in1k", **_AT_384),
    "zoo_vit_base_patch16_384.augreg_in21k_ft_in1k": _cfg(
        "timm/vit_base_patch16_384.augreg_in21k_ft_in1k", **_AT_384),
    "zoo_vit_small_patch8_224.dino": _cfg(
        "timm/vit_small_patch8_224.dino", num_classes=0, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD),
    "zoo_vit_base_patch8_224.augreg2_in21k_ft_in1k": _cfg("timm/vit_base_patch8_224.augreg2_in21k_ft_in1k"),
})  # fmt: skip

# The timm architectures with a zoo entry point, `zoo_<name>`.
VIT_ARCHITECTURES = tuple(variant.removeprefix("zoo_") for variant in default_cfgs)


@register_model
def zoo_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-Ti/16 at 224 px with a zoo attention (`attention=`, `attention_options=`, ...)."""
    model_args = {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3}
    return _create_zoo_vit("zoo_vit_tiny_patch16_224", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def zoo_vit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-S/16 at 224 px with a zoo attention (`attention=`, `attention_options=`, ...)."""
    model_args = {"patch_size": 16, "embed_dim": 384, "depth": 12, "num_heads": 6}
    return _create_zoo_vit("zoo_vit_small_patch16_224", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def zoo_vit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-B/16 at 224 px with a zoo attention (`attention=`, `attention_options=`, ...)."""
    model_args = {"patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12}
    return _create_zoo_vit("zoo_vit_base_patch16_224", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def zoo_vit_large_patch16_224(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-L/16 at 224 px with a zoo attention (`attention=`, `attention_options=`, ...)."""
    model_args = {"patch_size": 16, "embed_dim": 1024, "depth": 24, "num_heads": 16}
    return _create_zoo_vit("zoo_vit_large_patch16_224", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def zoo_vit_tiny_patch16_384(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-Ti/16 at 384 px with a zoo attention (`attention=`, `attention_options=`, ...)."""
    model_args = {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3}
    return _create_zoo_vit("zoo_vit_tiny_patch16_384", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def zoo_vit_small_patch16_384(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-S/16 at 384 px with a zoo attention (`attention=`, `attention_options=`, ...)."""
    model_args = {"patch_size": 16, "embed_dim": 384, "depth": 12, "num_heads": 6}
    return _create_zoo_vit("zoo_vit_small_patch16_384", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def zoo_vit_base_patch16_384(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-B/16 at 384 px with a zoo attention (`attention=`, `attention_options=`, ...)."""
    model_args = {"patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12}
    return _create_zoo_vit("zoo_vit_base_patch16_384", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def zoo_vit_small_patch8_224(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-S/8 at 224 px with a zoo attention (`attention=`, `attention_options=`, ...); DINO weights."""
    model_args = {"patch_size": 8, "embed_dim": 384, "depth": 12, "num_heads": 6}
    return _create_zoo_vit("zoo_vit_small_patch8_224", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def zoo_vit_base_patch8_224(pretrained: bool = False, **kwargs: Any) -> ZooVisionTransformer:
    """ViT-B/8 at 224 px with a zoo attention (`attention=`, `attention_options=`, ...)."""
    model_args = {"patch_size": 8, "embed_dim": 768, "depth": 12, "num_heads": 12}
    return _create_zoo_vit("zoo_vit_base_patch8_224", pretrained=pretrained, **dict(model_args, **kwargs))
