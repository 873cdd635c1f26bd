"""zoo: efficient attention on timm backbones, trained from YAML recipes through accelerate."""
from .attention import (
    AttentionBase,
    attention_class,
    create_attention,
    list_attentions,
    on_optimizer_step,
    register_attention,
)

__version__ = "0.1.0"
from .models import create_model, load_pretrained  # noqa: E402
