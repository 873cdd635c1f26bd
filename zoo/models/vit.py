"""timm Vision Transformers with any registered attention in every block.

`create_model('vit_small_patch16_224', attention='performer', img_size=1024)` builds timm's own
`VisionTransformer` through its `attn_layer` and `block_fn` arguments, so `forward_features`, `forward_head`,
`reset_classifier`, `set_grad_checkpointing` and `dynamic_img_size` behave as in timm. The backbone options of
`zoo.models.blocks` (`block='gau'`, `reversible=True`, `ff_chunks=4`) work with any attention. Named variants
`zoo_<timm name>` are registered with timm, so `timm.create_model('zoo_vit_small_patch16_224',
attention='performer')` works too.

Pretrained timm weights load into any variant: from a file (`pretrained_file=`, offline) or from the hub
(`pretrained=True`, online). `pos_embed` is resampled to the new resolution, the classifier is dropped when the
class count differs, and the only keys allowed to stay unfilled are a variant's own attention parameters.
"""
from __future__ import annotations

import difflib
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from unittest import mock
from urllib.parse import urlsplit

import timm
import torch
from timm.models import register_model
from timm.models._manipulate import adapt_input_conv
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from torch import nn

from ..attention import attention_class
from ..attention._common import TIMM_ATTENTION_KEYS
from .blocks import ReversibleSequence, block_class
from .stems import STEMS

__all__ = ["VIT_ARCHITECTURES", "LoadReport", "ReversibleVisionTransformer", "create_model", "load_pretrained"]

_logger = logging.getLogger(__name__)

# Architectures registered as `zoo_<name>`; `create_model` accepts any timm VisionTransformer name.
VIT_ARCHITECTURES = (
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "vit_large_patch16_224",
    "vit_tiny_patch16_384",
    "vit_small_patch16_384",
    "vit_base_patch16_384",
    "vit_small_patch8_224",
    "vit_base_patch8_224",
)


@dataclass
class LoadReport:
    """What loading pretrained weights left out: a variant's own attention parameters, a resized head."""

    source: str
    missing_attention_keys: list[str] = field(default_factory=list)
    dropped_keys: list[str] = field(default_factory=list)


def _vit_name(name: str) -> str:
    base = name.removeprefix("zoo_")
    if not timm.is_model(base) or not timm.models.is_model_in_modules(base, ["vision_transformer"]):
        known = timm.list_models("vit_*")
        close = difflib.get_close_matches(base, known, n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}: expected a timm VisionTransformer name such as {VIT_ARCHITECTURES[:3]}")
    return base


def create_model(
    name: str,
    *,
    attention: str = "softmax",
    attention_options: Optional[dict[str, Any]] = None,
    block: str = "timm",
    block_options: Optional[dict[str, Any]] = None,
    reversible: bool = False,
    ff_chunks: int = 0,
    pretrained: bool = False,
    pretrained_file: Optional[str | Path] = None,
    stem: str = "patch",
    **timm_kwargs: Any,
) -> VisionTransformer:
    """A timm VisionTransformer `name` whose every block uses attention `attention` with `attention_options`.

    `block`: `timm` or `gau` (FLASH blocks, with `attention='gau'`; `block_options` may set `z_dim` and
    `expansion`); `reversible`: RevNet couplings, activation memory independent of depth; `ff_chunks`: the MLP
    runs over that many checkpointed chunks of the sequence (see `zoo.models.blocks`). `stem`: `patch` (timm's
    patchify convolution) or `conv` (a convolutional stem of the same stride, see `zoo.models.stems`).
    `timm_kwargs` go to timm (`img_size`, `num_classes`, `in_chans`, `dynamic_img_size`, `drop_path_rate`, ...).
    """
    base = _vit_name(name)
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}; allowed: {', '.join(STEMS)}")
    if not isinstance(reversible, bool):
        raise ValueError(f"reversible={reversible!r} must be True or False")
    attn_layer = attention_class(attention, **(attention_options or {}))
    block_fn = block_class(
        block, attention=attention, attention_options=attention_options, block_options=block_options,
        ff_chunks=ff_chunks,
    )
    model = timm.create_model(
        base, pretrained=False, attn_layer=attn_layer, block_fn=block_fn, embed_layer=STEMS[stem], **timm_kwargs
    )
    if reversible:
        model.blocks = ReversibleSequence(*model.blocks)
        # timm's forward_features runs `blocks` one by one under a mask or gradient checkpointing, which would
        # bypass the couplings: the subclass always runs them as one stack (and adds only that).
        model.__class__ = ReversibleVisionTransformer
    model.zoo_attention = {"name": attention, "options": dict(attention_options or {})}
    model.zoo_blocks = {
        "block": block, "options": dict(block_options or {}), "reversible": reversible, "ff_chunks": ff_chunks
    }
    if pretrained_file is not None:
        load_pretrained(model, pretrained_file)
    elif pretrained:
        _load_from_hub(model, base, timm_kwargs)
    return model


class ReversibleVisionTransformer(VisionTransformer):
    """timm's VisionTransformer whose `blocks` is a `ReversibleSequence` (built by `create_model(reversible=True)`).

    `forward_features` always runs the stack as a whole: with a mask, causally, and under
    `set_grad_checkpointing(True)` (which changes nothing here: the couplings already recompute every block).
    """

    def forward_features(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        x = self.norm_pre(self.patch_drop(self._pos_embed(self.patch_embed(x))))
        return self.norm(self.blocks(x, attn_mask=attn_mask, is_causal=is_causal))

    def forward_intermediates(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(
            "forward_intermediates runs blocks one at a time, which reversible couplings do not allow; build the "
            "model with reversible=False to take intermediate features"
        )


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"pretrained file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    if path.suffix == ".npz":
        raise ValueError(f"{path}: .npz (JAX) checkpoints are not supported; convert to .safetensors or .pth")
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    return state


def _fit_to_model(state: dict[str, torch.Tensor], model: VisionTransformer) -> tuple[dict, list[str]]:
    """Resample pos_embed, adapt the input channels, drop a classifier of another size."""
    state = checkpoint_filter_fn(state, model)
    target = model.state_dict()
    conv = "patch_embed.proj.weight"
    if conv in state and state[conv].shape[1] != target[conv].shape[1]:
        state[conv] = adapt_input_conv(target[conv].shape[1], state[conv])
    dropped = [k for k, v in state.items() if k in target and v.shape != target[k].shape and k.startswith("head")]
    for key in dropped:
        del state[key]
    return state, dropped


def _is_attention_extra(key: str) -> bool:
    """True for a parameter or buffer of a variant that timm's `Attention` does not have."""
    if ".attn." not in key:
        return False
    return not key.split(".attn.", 1)[1].startswith(TIMM_ATTENTION_KEYS)


def load_state_dict_into(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> LoadReport:
    state, dropped = _fit_to_model(state, model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing_extra = [k for k in missing if _is_attention_extra(k)]
    bad_missing = [k for k in missing if k not in missing_extra and k not in dropped]
    if unexpected or bad_missing:
        raise ValueError(
            f"{source}: weights do not fit the model: missing {bad_missing[:8]}, unexpected {unexpected[:8]}"
            f"{' (and more)' if len(bad_missing) > 8 or len(unexpected) > 8 else ''}"
        )
    if missing_extra:
        _logger.warning("%s: %d attention parameters not in the checkpoint keep their initialisation: %s",
                        source, len(missing_extra), sorted({k.split('.attn.')[1] for k in missing_extra}))
    if dropped:
        _logger.warning("%s: classifier %s has another class count and was re-initialised", source, dropped)
    return LoadReport(source, missing_extra, dropped)


def load_pretrained(model: VisionTransformer, path: str | Path) -> LoadReport:
    """Load timm weights (`.safetensors`, `.pth`, `.bin`) into `model`, whatever its attention variant."""
    path = Path(path).expanduser()
    return load_state_dict_into(model, _read_state_dict(path), str(path))


_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def _hub_unreachable(endpoint_url: str, timeout: float = 3.0) -> bool:
    """True when no TCP connection to the hub at `endpoint_url` opens within `timeout` s (never asserted behind
    a proxy)."""
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return False
    endpoint = urlsplit(endpoint_url)
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
    except OSError:
        return True
    return False


def _load_from_hub(model: VisionTransformer, base: str, timm_kwargs: dict[str, Any]) -> LoadReport:
    from huggingface_hub import constants

    kwargs = {k: timm_kwargs[k] for k in ("num_classes", "in_chans", "img_size") if k in timm_kwargs}
    # Without a network the hub client retries for about 50 s before failing; in its offline mode a cached
    # checkpoint still loads and a missing one fails at once.
    offline = constants.HF_HUB_OFFLINE or _hub_unreachable(constants.ENDPOINT)
    try:
        with mock.patch.object(constants, "HF_HUB_OFFLINE", offline):
            stock = timm.create_model(base, pretrained=True, **kwargs)
    except Exception as error:  # the hub raises several unrelated types when offline
        raise RuntimeError(
            f"could not fetch pretrained weights for {base!r} from the Hugging Face hub ({type(error).__name__}"
            f"{', the hub is not reachable' if offline else ''}). "
            f"Offline, download the timm checkpoint elsewhere and pass it as a file: "
            f"create_model(..., pretrained_file='model.safetensors') or model.pretrained_file in a recipe"
        ) from None
    return load_state_dict_into(model, stock.state_dict(), f"hf-hub:{base}")


def _register(base: str) -> None:
    def entrypoint(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
        return create_model(base, pretrained=pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = f"zoo_{base}"
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = f"timm {base} with a zoo attention (`attention=`, `attention_options=`)."
    globals()[entrypoint.__name__] = entrypoint
    register_model(entrypoint)


for _base in VIT_ARCHITECTURES:
    _register(_base)
