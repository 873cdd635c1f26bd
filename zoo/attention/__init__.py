"""Attention variants behind one interface; each family file registers itself on import."""

from . import (
    banded_conv,  # noqa: F401
    bigbird,  # noqa: F401
    dilated,  # noqa: F401
    gau,  # noqa: F401
    hedgehog,  # noqa: F401
    linear,  # noqa: F401
    linformer,  # noqa: F401
    local,  # noqa: F401
    longformer,  # noqa: F401
    neighborhood,  # noqa: F401
    nystrom,  # noqa: F401
    performer,  # noqa: F401
    reformer,  # noqa: F401
    softmax,  # noqa: F401  (registers "softmax")
    softmax1,  # noqa: F401
    sparse,  # noqa: F401
    synthesizer,  # noqa: F401
    vq,  # noqa: F401
    window2d,  # noqa: F401
)
from ._common import AttentionBase, key_padding_mask, masked_fill_keys, pad_to_multiple
from ._registry import (
    attention_class,
    attention_options,
    auxiliary_loss,
    create_attention,
    get_attention,
    list_attentions,
    on_optimizer_step,
    register_attention,
)

__all__ = [
    "AttentionBase",
    "attention_class",
    "attention_options",
    "auxiliary_loss",
    "create_attention",
    "get_attention",
    "key_padding_mask",
    "list_attentions",
    "masked_fill_keys",
    "on_optimizer_step",
    "pad_to_multiple",
    "register_attention",
]
