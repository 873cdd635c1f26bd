"""Backbones: timm Vision Transformers with any zoo attention, and the block options they share."""
from .blocks import BLOCKS, Block, GAUBlock, ReversibleSequence, block_class, build_blocks
from .vit import VIT_ARCHITECTURES, LoadReport, ReversibleVisionTransformer, create_model, load_pretrained

__all__ = [
    "BLOCKS",
    "VIT_ARCHITECTURES",
    "Block",
    "GAUBlock",
    "LoadReport",
    "ReversibleSequence",
    "ReversibleVisionTransformer",
    "block_class",
    "build_blocks",
    "create_model",
    "load_pretrained",
]
