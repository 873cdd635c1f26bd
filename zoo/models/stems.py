"""Patch embeddings for timm's `embed_layer` slot.

`ConvStemPatchEmbed`: "Early Convolutions Help Transformers See Better" (Xiao et al. 2021),
https://arxiv.org/abs/2106.14881. The single patchify convolution is replaced by stride-2 3x3 convolutions
(BatchNorm, ReLU) and a 1x1 projection; the token grid is the same, and ViTs trained from scratch converge
faster and are less sensitive to the learning rate.
"""

from __future__ import annotations

import math

from timm.layers import PatchEmbed
from torch import nn

__all__ = ["STEMS", "ConvStemPatchEmbed"]


class ConvStemPatchEmbed(PatchEmbed):
    """A drop-in `PatchEmbed` whose `proj` is a convolutional stem of total stride `patch_size` (a power of 2)."""

    def __init__(
        self,
        img_size=224,
        patch_size=16,
        in_chans=3,
        embed_dim=768,
        bias=True,
        device=None,
        dtype=None,
        **patch_embed_args,
    ) -> None:
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            bias=bias,
            device=device,
            dtype=dtype,
            **patch_embed_args,
        )
        height, width = self.patch_size
        if height != width or height < 2 or height & (height - 1):
            raise ValueError(f"the conv stem needs a square power-of-2 patch_size >= 2, got {self.patch_size}")
        dd = {"device": device, "dtype": dtype}
        stages = int(math.log2(height))
        layers, channels = [], in_chans
        # widths double stage by stage and reach embed_dim at the last stride-2 convolution
        for stage in range(stages):
            width = max(embed_dim // 2 ** (stages - 1 - stage), 8)
            layers += [
                nn.Conv2d(channels, width, 3, stride=2, padding=1, bias=False, **dd),
                nn.BatchNorm2d(width, **dd),
                nn.ReLU(inplace=True),
            ]
            channels = width
        layers.append(nn.Conv2d(channels, embed_dim, 1, bias=bias, **dd))
        self.proj = nn.Sequential(*layers)


STEMS = {"patch": PatchEmbed, "conv": ConvStemPatchEmbed}
