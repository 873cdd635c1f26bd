"""Semantic segmentation on a zoo ViT: per-pixel class logits from the backbone's patch tokens through a light
decoder, for the `segmentation` task (`zoo.tasks.segmentation`).

`SegmentationViT` is a `ZooVisionTransformer` (any attention, 2-D layouts and global blocks included) whose
classifier gives way to a decoder on its last patch-token map, taken through timm's `forward_intermediates`
(prefix tokens dropped, the final LayerNorm applied, `[b, d, h, w]`); the decoder's logits are upsampled
bilinearly to the input size (the `progressive` decoder also reads the image and gives logits at its size). An
average-pooled ViT (`global_pool: avg`) has its final LayerNorm after the pooling (timm's `fc_norm`), so its decoder
reads the last block's tokens as they are: applying that norm to every patch token kept the 2-D recall probe
(`recipes/recall2d_quick.yaml`) near its guessing rule at the recipe's budget, where without it softmax recalls.
`timm.create_model('zoo_vit_small_patch16_224', decoder='linear', num_classes=11)` builds one,
`zoo.save_pretrained` / `zoo.load_model` round-trip it (its `zoo_args` record the decoder). Decoders (`DECODERS`,
chosen by name):

- `linear`: Segmenter's linear decoder (Strudel et al. 2021, https://arxiv.org/abs/2105.05633), SETR-naive without
  its hidden layer (Zheng et al. 2021, https://arxiv.org/abs/2012.15840): the backbone's final LayerNorm, then a 1x1
  convolution to the classes on the patch grid;
- `pyramid`: ViTDet's simple feature pyramid (Li et al. 2022, https://arxiv.org/abs/2203.16527) on that one map,
  levels at 4, 2, 1 and 1/2 times the patch grid (two / one stride-2 transposed convolutions, identity, max
  pooling), each projected to `channels` channels (1x1 and 3x3 convolutions, each with a LayerNorm); the levels are
  summed at the finest level's size, as Panoptic FPN's semantic branch sums them (Kirillov et al. 2019,
  https://arxiv.org/abs/1901.02446), and a 1x1 convolution gives the classes;
- `progressive`: SAM's mask decoder shape (Kirillov et al. 2023, https://arxiv.org/abs/2304.02643): the patch map
  upsampled by stride-2 transposed convolutions (log2 of the patch size of them, each with a LayerNorm and a GELU)
  up to the input size, fused, as SAM-HQ fuses early high-resolution features (Ke et al. 2023,
  https://arxiv.org/abs/2306.01567), with a shallow full-resolution convolution path from the image itself (two 3x3
  convolutions); a 3x3 and a 1x1 convolution give the classes. The patch map says what is where; the image path
  says which pixels, for strokes thinner than a patch.

Letter legend: b - batch, c - channels, d - model width, e - decoder width, k - classes, h/w - patch grid,
H/W - input size.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm2d
from torch import Tensor, nn

from .._validate import unknown_name
from .vit import DECODER_MODELS, ZooVisionTransformer

__all__ = ["DECODERS", "LinearDecoder", "ProgressiveDecoder", "PyramidDecoder", "SegmentationViT"]


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


class ProgressiveDecoder(nn.Module):
    """Patch features `[b, d, h, w]` and the image `[b, c, H, W]` -> logits `[b, k, H, W]`: the map upsampled by
    `log2(patch_size)` stride-2 transposed convolutions (`channels` wide), concatenated with a shallow
    full-resolution convolution path from the image, then a 3x3 and a 1x1 convolution (SAM's mask decoder shape)."""

    # SegmentationViT hands this decoder the input image as well
    reads_image = True

    def __init__(self, dim: int, num_classes: int, *, channels: int = 32, patch_size: int = 16, in_chans: int = 3):
        super().__init__()
        if patch_size < 1 or patch_size & (patch_size - 1):
            raise ValueError(
                "the progressive decoder doubles the grid up to the input size: patch_size must be a power of 2, "
                f"got {patch_size}"
            )
        self.neck = nn.Sequential(nn.Conv2d(dim, channels, 1, bias=False), LayerNorm2d(channels))
        ups = []
        for _ in range(int(math.log2(patch_size))):
            ups += [nn.ConvTranspose2d(channels, channels, 2, stride=2), LayerNorm2d(channels), nn.GELU()]
        self.up = nn.Sequential(*ups)
        # two 3x3 convolutions see 5 x 5 pixels: where a stroke is, not which digit it belongs to
        self.image_path = nn.Sequential(
            nn.Conv2d(in_chans, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.GELU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.GELU(),
        )
        self.fuse = nn.Sequential(
            nn.Conv2d(2 * channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.GELU(),
            nn.Conv2d(channels, num_classes, 1),
        )

    def forward(self, features: Tensor, image: Tensor) -> Tensor:
        up = self.up(self.neck(features))  # [b, e, h * patch, w * patch]
        if up.shape[-2:] != image.shape[-2:]:
            # a padded last patch (dynamic_img_pad): the grid covers a little more than the image
            up = F.interpolate(up, size=image.shape[-2:], mode="bilinear", align_corners=False)
        return self.fuse(torch.cat([up, self.image_path(image)], dim=1))


# name -> the decoder class, called as (patch feature width, classes, **decoder_options), and with the patch size
# and the image's channels (patch_size=, in_chans=) when it reads the image (`reads_image`)
DECODERS: dict[str, type[nn.Module]] = {
    "linear": LinearDecoder,
    "pyramid": PyramidDecoder,
    "progressive": ProgressiveDecoder,
}
# the options each decoder takes (decoder_options), with their defaults
DECODER_OPTIONS: dict[str, dict[str, Any]] = {
    "linear": {},
    "pyramid": {"channels": 128},
    "progressive": {"channels": 32},
}


def build_decoder(
    name: str,
    dim: int,
    num_classes: int,
    options: dict[str, Any] | None = None,
    *,
    patch_size: int = 16,
    in_chans: int = 3,
) -> nn.Module:
    """Decoder `name` (`DECODERS`) from `dim`-wide patch features (of `patch_size`-px patches of `in_chans`-channel
    images) to `num_classes` logits; an unknown name or option is a one-line error naming what is allowed."""
    if name not in DECODERS:
        raise unknown_name("decoder", name, DECODERS)
    options = dict(options or {})
    unknown = sorted(set(options) - set(DECODER_OPTIONS[name]))
    if unknown:
        allowed = ", ".join(DECODER_OPTIONS[name]) or "none"
        raise ValueError(f"decoder {name!r} takes no option {unknown[0]!r}; it takes: {allowed}")
    if getattr(DECODERS[name], "reads_image", False):
        options.update(patch_size=patch_size, in_chans=in_chans)
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
        # nor is an average-pooled ViT's fc_norm: frozen, so that data-parallel training does not wait on its
        # gradient, and kept, so that checkpoints saved with it still load
        self.fc_norm.requires_grad_(False)
        self.decoder_name, self.decoder_options = decoder, dict(decoder_options or {})
        self.decoder = self._decoder(num_classes)
        self.zoo_args.update(decoder=decoder, decoder_options=dict(self.decoder_options))

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool is not None:
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.decoder = self._decoder(num_classes)

    def _decoder(self, num_classes: int) -> nn.Module:
        patch_size = self.patch_embed.patch_size
        if patch_size[0] != patch_size[1] and getattr(DECODERS.get(self.decoder_name), "reads_image", False):
            raise ValueError(f"decoder {self.decoder_name!r} needs square patches, got {patch_size}")
        return build_decoder(
            self.decoder_name,
            self.embed_dim,
            num_classes,
            self.decoder_options,
            patch_size=patch_size[0],
            in_chans=self.zoo_args.get("in_chans", 3),
        )

    def forward(self, x: Tensor) -> Tensor:
        """images `[b, c, H, W]` -> logits `[b, k, H, W]`."""
        (features,) = self.forward_intermediates(x, indices=1, norm=True, output_fmt="NCHW", intermediates_only=True)
        if getattr(self.decoder, "reads_image", False):
            return self.decoder(features, x)  # [b, k, H, W]
        logits = self.decoder(features)  # [b, k, h, w] or [b, k, 4h, 4w]
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


DECODER_MODELS["segmentation"] = SegmentationViT
