"""`data.options.augment` of the image sets (folder, megamnist): timm's training transforms, on the training split
only (`create_transform(is_training=True, auto_augment=..., re_prob=..., scale=..., ratio=...)`): a random resized
crop of `scale` x `ratio`, a horizontal flip with probability `hflip`, timm's RandAugment policy string, then random
erasing with probability `re_prob`. Validation and test images are never augmented."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

__all__ = ["AugmentOptions", "AugmentedImages", "augment_kwargs"]


@dataclass(kw_only=True)
class AugmentOptions:
    """``data.options.augment``: timm's training augmentation (null: none beyond the set's own)."""

    # timm's RandAugment (or AutoAugment / AugMix) policy string; null: none
    auto_augment: str | None = "rand-m9-mstd0.5"
    # probability of random erasing (timm's re_prob, per image)
    re_prob: float = field(default=0.25, metadata={"min": 0, "max": 1})
    # area share and aspect ratio range of the random resized crop (timm's defaults)
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0], metadata={"length": 2, "min": 0, "max": 1})
    ratio: list[float] = field(default_factory=lambda: [0.75, 4 / 3], metadata={"length": 2, "min": 0})
    # probability of a horizontal flip
    hflip: float = field(default=0.5, metadata={"min": 0, "max": 1})

    def problems(self) -> list[tuple[str, str]]:
        if self.scale[0] > self.scale[1] or self.ratio[0] > self.ratio[1] or not self.scale[1] or not self.ratio[0]:
            return [("scale", f"scale and ratio are [low, high] with 0 < high, got {self.scale} and {self.ratio}")]
        if self.auto_augment is not None and not self.auto_augment.startswith(("rand", "augmix", "v0", "original")):
            problem = "a timm policy string: rand-m9-mstd0.5 (RandAugment), augmix-..., v0 or original"
            return [("auto_augment", f"{problem}; got {self.auto_augment!r}")]
        return []


def augment_kwargs(augment: AugmentOptions) -> dict[str, Any]:
    """The `create_transform` arguments of `augment`."""
    return {
        "auto_augment": augment.auto_augment,
        "re_prob": augment.re_prob,
        "scale": tuple(augment.scale),
        "ratio": tuple(augment.ratio),
        "hflip": augment.hflip,
    }


class AugmentedImages(Dataset):
    """`dataset`'s `(image [C, H, W] float in [0, 1], label)` items through timm's training transform of `augment`
    (the image as an 8-bit PIL image, normalised back with the set's `mean` / `std`); every other attribute is the
    dataset's."""

    def __init__(self, dataset: Dataset, augment: AugmentOptions, img_size: int) -> None:
        from timm.data import create_transform

        self.dataset = dataset
        mean, std = tuple(dataset.mean), tuple(dataset.std)
        self.transform: Callable = create_transform(
            input_size=(dataset.in_chans, img_size, img_size),
            is_training=True,
            mean=mean,
            std=std,
            interpolation="bilinear",
            # colour jitter is timm's default without a policy string; these are 8-bit grey canvases
            color_jitter=None,
            **augment_kwargs(augment),
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        image, label = self.dataset[index]
        pixels = (image * 255).round().to(torch.uint8).numpy()  # [C, H, W]
        mode = "L" if pixels.shape[0] == 1 else "RGB"
        picture = Image.fromarray(pixels[0] if mode == "L" else np.moveaxis(pixels, 0, -1), mode)
        return self.transform(picture), label

    def __getattr__(self, name: str) -> Any:
        # called only for names this class lacks: the dataset's (num_classes, classes, mean, ...)
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
