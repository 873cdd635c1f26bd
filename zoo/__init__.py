"""zoo: efficient attention on timm backbones, trained from YAML recipes through accelerate."""

from .attention import (
    AttentionBase,
    attention_class,
    auxiliary_loss,
    create_attention,
    list_attentions,
    on_optimizer_step,
    register_attention,
)
from .hub.load import WeightsError, load_model, push_to_hub, save_pretrained
from .models import create_model, load_timm_weights

__all__ = [
    "AttentionBase",
    "WeightsError",
    "attention_class",
    "auxiliary_loss",
    "create_attention",
    "create_model",
    "list_attentions",
    "load_model",
    "load_timm_weights",
    "on_optimizer_step",
    "push_to_hub",
    "register_attention",
    "save_pretrained",
]
__version__ = "0.1.0"
