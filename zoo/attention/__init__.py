"""Attention variants behind one interface; each family file registers itself on import."""
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
from . import softmax  # noqa: E402,F401  (registers "softmax")
from . import performer  # noqa: E402,F401
from . import local  # noqa: E402,F401
from . import dilated  # noqa: E402,F401
from . import sparse  # noqa: E402,F401
from . import longformer  # noqa: E402,F401
from . import bigbird  # noqa: E402,F401
from . import linformer  # noqa: E402,F401
from . import nystrom  # noqa: E402,F401
from . import synthesizer  # noqa: E402,F401
from . import softmax1  # noqa: E402,F401
from . import reformer  # noqa: E402,F401
from . import vq  # noqa: E402,F401
from . import banded_conv  # noqa: E402,F401
from . import linear  # noqa: E402,F401
from . import gau  # noqa: E402,F401
from . import window2d  # noqa: E402,F401
from . import neighborhood  # noqa: E402,F401
from . import hedgehog  # noqa: E402,F401
