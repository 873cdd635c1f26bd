"""Backbones: timm Vision Transformers with any zoo attention."""
from .vit import VIT_ARCHITECTURES, LoadReport, create_model, load_pretrained

__all__ = ["create_model", "load_pretrained", "LoadReport", "VIT_ARCHITECTURES"]
