"""Backbones: timm Vision Transformers with any zoo attention, the 1-D sequence model, and their parts."""

from ..tasks.heads import ClassificationHead, ForecastHead, LanguageModelHead, TokenClassificationHead
from .blocks import BLOCKS, Block, GAUBlock, ReversibleSequence, block_class
from .embeddings import KmerEmbedding, PatchEmbedding, RevIN, TokenEmbedding
from .generation import generate, supports_recurrent
from .naflex import NAFLEX_ARCHITECTURES, ZooNaFlexVit, create_naflex_model
from .segmentation import SegmentationViT
from .sequence import (
    INPUTS,
    POSITIONS,
    SequenceModel,
    SequenceTransformer,
    create_sequence_model,
    load_vit_weights,
)
from .vit import (
    VIT_ARCHITECTURES,
    LoadReport,
    ReversibleVisionTransformer,
    ZooVisionTransformer,
    create_model,
    load_timm_weights,
)

__all__ = [
    "BLOCKS",
    "INPUTS",
    "NAFLEX_ARCHITECTURES",
    "POSITIONS",
    "VIT_ARCHITECTURES",
    "Block",
    "ClassificationHead",
    "ForecastHead",
    "GAUBlock",
    "KmerEmbedding",
    "LanguageModelHead",
    "LoadReport",
    "PatchEmbedding",
    "RevIN",
    "ReversibleSequence",
    "ReversibleVisionTransformer",
    "SegmentationViT",
    "SequenceModel",
    "SequenceTransformer",
    "TokenClassificationHead",
    "TokenEmbedding",
    "ZooNaFlexVit",
    "ZooVisionTransformer",
    "block_class",
    "create_model",
    "create_naflex_model",
    "create_sequence_model",
    "generate",
    "load_timm_weights",
    "load_vit_weights",
    "supports_recurrent",
]
