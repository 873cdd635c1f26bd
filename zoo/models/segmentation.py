"""Semantic segmentation on a zoo ViT: per-pixel class logits from the backbone's patch tokens through a light
decoder, for the `segmentation` task (`zoo.tasks.segmentation`).

`SegmentationViT` is a `ZooVisionTransformer` (any attention, 2-D layouts and global blocks included) whose
classifier gives way to a decoder on its last patch-token map, taken through timm's `forward_intermediates`
(prefix tokens dropped, the final LayerNorm applied, `[b, d, h, w]`); the decoder's logits are upsampled
bilinearly to the input size. `timm.create_model('zoo_vit_small_patch16_224', decoder='linear', num_classes=11)`
builds one, `zoo.save_pretrained` / `zoo.load_model` round-trip it (its `zoo_args` record the decoder). Decoders
(`DECODERS`, chosen by name):

- `linear`: Segmenter's linear decoder (Strudel et al. 2021, https://arxiv.org/abs/2105.05633), SETR-naive without
  its hidden layer (Zheng et al. 2021, https://arxiv.org/abs/2012.15840): the backbone's final LayerNorm, then a 1x1
  convolution to the classes on the patch grid;
- `pyramid`: ViTDet's simple feature pyramid (Li et al. 2022, https://arxiv.org/abs/2203.16527) on that one map,
  levels at 4, 2, 1 and 1/2 times the patch grid (two / one stride-2 transposed convolutions, identity, max
  pooling), each projected to `channels` channels (1x1 and 3x3 convolutions, each with a LayerNorm); the levels are
  summed at the finest level's size, as Panoptic FPN's semantic branch sums them (Kirillov et al. 2019,
  https://arxiv.org/abs/1901.02446), and a 1x1 convolution gives the classes.

Letter legend: b - batch, c - channels, d - model width, e - decoder width, k - classes, h/w - patch grid,
H/W - input size.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from timm.layers import LayerNorm2d
from torch import Tensor, nn

from .._validate import unknown_name
from .vit import DECODER_MODELS, ZooVisionTransformer

__all__ = ["DECODERS", "LinearDecoder", "PyramidDecoder", "SegmentationViT"]


class LinearDecoder(nn.Module):
    """Patch features `[b, d, h, w]` (already layer-normalised) -> logits `[b, k, h, w]` by a 1x1 convolution."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.classifier = nn.Conv2d(dim, num_classes, 1)

    def forward(self, features: Tensor) -> Tensor:
        return self.classifier(features)


def _projection(channels: int, dim: int) -> nn.Sequential:
    """ViTDet's per-level projection: 1x1 then 3x3 convolution, each followed by a LayerNorm over channels."""
    return nn.Sequential(
        nn.Conv2d(channels, dim, 1, bias=False),
        LayerNorm2d(dim),
        nn.Conv2d(dim, dim, 3, padding=1, bias=False),
        LayerNorm2d(dim),
    )


class PyramidDecoder(nn.Module):
    """Patch features `[b, d, h, w]` -> logits `[b, k, 4h, 4w]`: ViTDet's simple feature pyramid (levels at 4, 2, 1
    and 1/2 times the grid, `channels` each), the levels summed at the finest size, a 1x1 convolution."""

    def __init__(self, dim: int, num_classes: int, *, channels: int = 128) -> None:
        super().__init__()
        if dim < 4:
            raise ValueError(f"the pyramid decoder halves the width twice: embed_dim must be >= 4, got {dim}")
        up4 = nn.Sequential(
            nn.ConvTranspose2d(dim, dim // 2, 2, stride=2),
            LayerNorm2d(dim // 2),
            nn.GELU(),
            nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2),
        )
        self.scales = nn.ModuleList([up4, nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), nn.Identity()])
        # ceil_mode: a grid of odd side keeps its last row and column in the coarsest level
        self.scales.append(nn.MaxPool2d(2, ceil_mode=True))
        widths = (dim // 4, dim // 2, dim, dim)
        self.projections = nn.ModuleList([_projection(width, channels) for width in widths])
        self.classifier = nn.Conv2d(channels, num_classes, 1)

    def forward(self, features: Tensor) -> Tensor:
        levels = [project(scale(features)) for scale, project in zip(self.scales, self.projections, strict=True)]
        size = levels[0].shape[-2:]
        fused = sum(F.interpolate(level, size=size, mode="bilinear", align_corners=False) for level in levels[1:])
        return self.classifier(levels[0] + fused)


# name -> the decoder class, called as (patch feature width, classes, **decoder_options)
DECODERS: dict[str, type[nn.Module]] = {"linear": LinearDecoder, "pyramid": PyramidDecoder}
# the options each decoder takes (decoder_options), with their defaults
DECODER_OPTIONS: dict[str, dict[str, Any]] = {"linear": {}, "pyramid": {"channels": 128}}


def build_decoder(name: str, dim: int, num_classes: int, options: dict[str, Any] | None = None) -> nn.Module:
    """Decoder `name` (`DECODERS`) from `dim`-wide patch features to `num_classes` logits; an unknown name or option
    is a one-line error naming what is allowed."""
    if name not in DECODERS:
        raise unknown_name("decoder", name, DECODERS)
    options = dict(options or {})
    unknown = sorted(set(options) - set(DECODER_OPTIONS[name]))
    if unknown:
        allowed = ", ".join(DECODER_OPTIONS[name]) or "none"
        raise ValueError(f"decoder {name!r} takes no option {unknown[0]!r}; it takes: {allowed}")
    return DECODERS[name](dim, num_classes, **options)


class SegmentationViT(ZooVisionTransformer):
    """A `ZooVisionTransformer` whose forward gives per-pixel logits: `[b, c, H, W]` -> `[b, k, H, W]`.

    `decoder` (`DECODERS`) with `decoder_options` reads the last block's patch tokens (`forward_intermediates`);
    `num_classes` is the number of pixel classes. `forward_features` and `forward_head` stay timm's (the classifier
    is an identity: `forward_head` gives the pooled embedding); `reset_classifier(k)` builds a decoder for `k`
    classes.
    """

    def __init__(
        self, *, decoder: str = "linear", decoder_options: dict[str, Any] | None = None, num_classes: int, **kwargs: Any
    ) -> None:
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"a segmentation model needs num_classes >= 1 (pixel classes), got {num_classes!r}")
        super().__init__(num_classes=num_classes, **kwargs)
        # the pooled classifier is not used: no parameter without a gradient
        self.head = nn.Identity()
        self.decoder_name, self.decoder_options = decoder, dict(decoder_options or {})
        self.decoder = build_decoder(decoder, self.embed_dim, num_classes, self.decoder_options)
        self.zoo_args.update(decoder=decoder, decoder_options=dict(self.decoder_options))

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool is not None:
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.decoder = build_decoder(self.decoder_name, self.embed_dim, num_classes, self.decoder_options)

    def forward(self, x: Tensor) -> Tensor:
        """images `[b, c, H, W]` -> logits `[b, k, H, W]`."""
        (features,) = self.forward_intermediates(x, indices=1, norm=True, output_fmt="NCHW", intermediates_only=True)
        logits = self.decoder(features)  # [b, k, h, w] or [b, k, 4h, 4w]
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


DECODER_MODELS["segmentation"] = SegmentationViT
