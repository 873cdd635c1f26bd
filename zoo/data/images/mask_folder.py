"""Your own images with segmentation masks: ``ROOT/images/`` beside ``ROOT/masks/``, paired by the file's path
without its suffix (``images/a.jpg`` with ``masks/a.png``, ``images/day/b.tif`` with ``masks/day/b.png``), either
once for the whole set or in each of ``ROOT/train``, ``ROOT/val`` and ``ROOT/test``.

Without split folders the pairs are divided into test, val and train (``data.options.test_fraction`` and
``val_fraction``, 0.1 each) by a permutation drawn from ``data.seed``: the same pairs in each split every run.

Images are decoded as ``folder``'s are (``zoo.data.images.decode.open_image``) and preprocessed by timm's
``create_transform``; each mask goes through the same geometry (the same random resized crop and flip in training,
timm's resize and centre crop in evaluation) with nearest-neighbour resampling, so class values are never blended.
A mask holds class indices: palette (``P``) indices or grey (``L``, 16-bit ``I;16``, 1-bit) values; an RGB(A) mask
whose three channels are equal everywhere is read as grey. ``data.options.ignore_value`` (255) marks pixels nothing
is asked of: they become ``IGNORE_INDEX`` (-100). ``data.options.mask_values`` reads values as others before
anything else (``{255: 1}``: a black-and-white mask saved as 0 / 255 as classes 0 and 1). The classes are
``data.options.classes`` (their names), ``num_classes`` (named ``0``, ``1``, ...) or the lines of
``ROOT/classes.txt``.

Odd folders: an image without a mask, and a mask without an image, are left out, each kind counted in one warning
that names the first few; other files and hidden ones are counted as ``folder`` counts them. When a pair is read, a
mask of another size than its image, a class value that is neither a class nor the ignore value, a mask of colours
(RGB) and an unreadable file are each an error naming the file (``data.options.mask_size: resize`` resizes such
masks to their image instead, nearest neighbour; ``on_bad_image: skip`` reads every pair when the split is built
and leaves the failing ones out, counted). Every pair's sizes and mask mode are checked when the split is built, from
the files' headers (PIL opens lazily: thousands of pairs in seconds; an RGB mask is read whole, to tell grey from
colours), so that such a pair stops the run before training rather than at the step that draws it; a class value
outside the classes is found when its mask is read. When the split's first masks hold nothing but 0 and the
ignore value, a warning says that they label background alone (a black-and-white mask saved as 0 / 255 reads so
unless ``mask_values`` says otherwise).
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from PIL import Image, ImageOps
from torch.utils.data import Dataset

from ..._validate import check_int, first_line
from .._interface import IGNORE_INDEX
from .._registry import DataContext, register_dataset
from .decode import ImageError, open_image
from .folder import (
    _DEFAULT_MEAN,
    _DEFAULT_STD,
    _IMG_MODES,
    BAD_IMAGE_POLICIES,
    BadImageError,
    _check_stats,
    _image_suffixes,
)

__all__ = ["MaskFolderDataset", "MaskFolderOptions", "read_mask"]

_logger = logging.getLogger(__name__)

_LAYOUT = "ROOT/images/* + ROOT/masks/* (same names, masks as PNG), or both folders in ROOT/train, ROOT/val, ROOT/test"
_SPLITS = ("train", "val", "test")
# PIL modes whose values are class indices as they stand (1-bit, grey, 16- and 32-bit grey, palette indices)
_INDEX_MODES = ("1", "L", "P", "I;16", "I;16L", "I;16B", "I;16N", "I")
MASK_SIZE_POLICIES = ("error", "resize")
# how many file names a warning about left-out files shows
_SHOWN = 3


class MaskError(ValueError):
    """A mask file that is not a mask of class indices, or does not fit its image; one argument, naming the file."""


def read_mask(path: str) -> np.ndarray:
    """The class indices of the mask file at `path`: int64 `[h, w]`; an ImageError naming the path when it cannot be
    decoded, a MaskError when its pixels are colours rather than indices."""
    if not os.path.isfile(path):
        raise ImageError(path, "no such file" if not os.path.exists(path) else "not a file")
    try:
        with Image.open(path) as mask:
            mask.seek(0)
            mask.load()
            mask = ImageOps.exif_transpose(mask)
    # PIL's decoders fail with many exception types on malformed files; each is this file's fault
    except Exception as error:
        reason = "not an image file PIL can read" if isinstance(error, Image.UnidentifiedImageError) else None
        reason = reason or f"cannot decode the mask ({type(error).__name__}: {first_line(error, '')})"
        raise ImageError(path, reason) from error
    if mask.mode in _INDEX_MODES:
        return np.asarray(mask).astype(np.int64)
    if mask.mode in ("RGB", "RGBA"):
        rgb = np.asarray(mask.convert("RGB"))
        if (rgb == rgb[..., :1]).all():
            return rgb[..., 0].astype(np.int64)
        colours = np.unique(rgb.reshape(-1, 3), axis=0)
        example = tuple(int(c) for c in colours[-1])
        raise MaskError(
            f"mask {path} is an {mask.mode} image of {len(colours)} colours, e.g. {example}: "
            "save masks as palette (P) or grey (L) PNGs whose pixel values are the class indices"
        )
    raise MaskError(f"mask {path} has the PIL mode {mask.mode!r}; masks are palette (P) or grey (L, I;16) images")


def _oriented(image: Image.Image) -> tuple[int, int]:
    """`(width, height)` of an opened (not decoded) image once its EXIF orientation is applied, as reading it does."""
    width, height = image.size
    # orientations 5 to 8 turn the picture by a quarter
    return (height, width) if image.getexif().get(0x0112, 1) in (5, 6, 7, 8) else (width, height)


def _header_reason(error: Exception) -> str:
    if isinstance(error, FileNotFoundError):
        return "no such file"
    if isinstance(error, Image.UnidentifiedImageError):
        return "not an image file PIL can read"
    return f"cannot read its header ({type(error).__name__}: {first_line(error, '')})"


def _header_size(path: str) -> tuple[int, int]:
    """`(width, height)` of the image at `path` as it reads, from its header; an ImageError naming the file."""
    try:
        with Image.open(path) as image:
            return _oriented(image)
    except Exception as error:  # PIL's decoders fail with many types; each is this file's fault
        raise ImageError(path, _header_reason(error)) from error


def _resized(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`mask` `[h, w]` resized to `size` (width, height) by nearest neighbour."""
    image = Image.fromarray(mask.astype(np.int32)).resize(size, Image.Resampling.NEAREST)
    return np.asarray(image).astype(np.int64)


class PairTransform:
    """timm's transform of an image, and the same geometry, by nearest neighbour, for its mask.

    Training: timm's random resized crop (the same box for both), horizontal flip (both or neither), then colour
    jitter, tensor and normalisation of the image only. Evaluation: timm's resize of the shorter side and centre crop.
    """

    def __init__(self, img_size: int, *, is_training: bool, in_chans: int, mean: tuple, std: tuple):
        from timm.data import create_transform
        from torchvision import transforms

        size = (in_chans, img_size, img_size)
        self.is_training = is_training
        if is_training:
            parts = create_transform(size, is_training=True, mean=mean, std=std, separate=True)
            primary, self.colour, self.final = parts
            self.crop, self.flip = primary.transforms
        else:
            self.image = create_transform(size, is_training=False, mean=mean, std=std)
            resize, crop = self.image.transforms[:2]
            assert isinstance(resize, transforms.Resize) and isinstance(crop, transforms.CenterCrop), self.image
            self.mask = transforms.Compose([transforms.Resize(resize.size, transforms.InterpolationMode.NEAREST), crop])

    def __call__(self, image: Image.Image, mask: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """PIL image (`w x h`) and mask `[h, w]` -> image `[c, s, s]` float32, mask `[s, s]` int64 (s: img_size)."""
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        indices = Image.fromarray(mask.astype(np.int32))
        if not self.is_training:
            return self.image(image), torch.from_numpy(np.asarray(self.mask(indices)).astype(np.int64))
        top, left, height, width = self.crop.get_params(image, self.crop.scale, self.crop.ratio)
        # timm's crop picks its interpolation at random when configured with several
        interpolation = self.crop.interpolation
        interpolation = random.choice(interpolation) if isinstance(interpolation, (tuple, list)) else interpolation
        image = F.resized_crop(image, top, left, height, width, self.crop.size, interpolation)
        indices = F.resized_crop(indices, top, left, height, width, self.crop.size, InterpolationMode.NEAREST)
        if torch.rand(1).item() < self.flip.p:
            image, indices = F.hflip(image), F.hflip(indices)
        return self.final(self.colour(image)), torch.from_numpy(np.asarray(indices).astype(np.int64))


class MaskFolderDataset(Dataset):
    """Images and their masks (see the module docstring for the layout and the mask files).

    Each sample is ``(image, mask)``: ``image`` float32 ``[in_chans, img_size, img_size]``, ``mask`` int64
    ``[img_size, img_size]`` of class indices, ``IGNORE_INDEX`` where the file holds ``ignore_value``.

    Args:
        root: the dataset folder.
        split: ``train``, ``val`` or ``test``: the split folder, or the share of the pairs drawn from ``seed``.
        img_size: side of the square images and masks produced.
        is_training: timm's training augmentation (random resized crop and flip of both, colour jitter of the image)
            when True, resize and centre crop otherwise.
        classes: one name per class; class ``i`` is the mask value ``i``.
        ignore_value: the mask value of unlabelled pixels (not a class).
        mask_values: ``{value in the file: value read}``, applied before anything else (None: none).
        in_chans, mean, std, on_bad_image: as ``ImageFolderDataset``'s (``skip`` also leaves out pairs whose mask
            does not fit).
        mask_size: ``error`` (a mask of another size than its image is an error naming both) or ``resize`` (resized
            to its image by nearest neighbour).
        val_fraction, test_fraction: without split folders, the shares of the pairs in val and test.
        seed: without split folders, draws which pairs go to which split.
        subset: ``(count, what) -> indices or None``, the pairs kept of the split (``DataContext.subset``).
    """

    # what the evaluation transform does (timm's create_transform defaults), recorded in a run's model.json
    interpolation = "bilinear"
    crop_pct = 0.875

    def __init__(
        self,
        root: str,
        split: str,
        *,
        img_size: int,
        is_training: bool,
        classes: Sequence[str],
        ignore_value: int = 255,
        mask_values: dict[int, int] | None = None,
        in_chans: int = 3,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        on_bad_image: str = "error",
        mask_size: str = "error",
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        subset: Callable[[int, str], Sequence[int] | None] | None = None,
    ):
        if in_chans not in _IMG_MODES:
            raise ValueError(f"in_chans must be one of {sorted(_IMG_MODES)}, got {in_chans!r}")
        if on_bad_image not in BAD_IMAGE_POLICIES:
            raise ValueError(f"on_bad_image must be one of {', '.join(BAD_IMAGE_POLICIES)}, got {on_bad_image!r}")
        if mask_size not in MASK_SIZE_POLICIES:
            raise ValueError(f"mask_size must be one of {', '.join(MASK_SIZE_POLICIES)}, got {mask_size!r}")
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {', '.join(_SPLITS)}, got {split!r}")
        check_int("img_size", img_size, 1)
        self.root, self.split, self.img_size, self.in_chans = os.fspath(root), split, img_size, in_chans
        self.classes = tuple(classes)
        self.ignore_value = check_int("ignore_value", ignore_value, 0)
        if self.ignore_value < self.num_classes:
            raise ValueError(
                f"ignore_value {ignore_value} is a class (num_classes {self.num_classes}): choose a value of at "
                f"least {self.num_classes}, e.g. 255"
            )
        self.on_bad_image, self.mask_size = on_bad_image, mask_size
        self.mask_values = dict(mask_values or {})
        self.mean = _check_stats("mean", mean, in_chans, _DEFAULT_MEAN[in_chans])
        self.std = _check_stats("std", std, in_chans, _DEFAULT_STD[in_chans])
        self.samples, where = self._pairs(val_fraction, test_fraction, seed)
        if subset is not None:
            kept = subset(len(self.samples), f"image-mask pairs of {where!r}")
            self.samples = self.samples if kept is None else [self.samples[i] for i in kept]
        if on_bad_image == "skip":
            self.samples = self._readable(self.samples, where)
        else:
            self._check_headers(self.samples, where)
        self._warn_if_background_alone(where)
        self.transform = PairTransform(
            img_size, is_training=is_training, in_chans=in_chans, mean=self.mean, std=self.std
        )

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def _pairs(self, val_fraction: float, test_fraction: float, seed: int) -> tuple[list[tuple[str, str]], str]:
        """The split's `(image path, mask path)` pairs in natural order, and the folder they are read from."""
        from timm.utils.misc import natural_key

        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"dataset root {self.root!r} is not a folder; expected {_LAYOUT}")
        split_folders = [s for s in _SPLITS if os.path.isdir(os.path.join(self.root, s, "images"))]
        if split_folders:
            where = os.path.join(self.root, self.split)
            if self.split not in split_folders:
                raise FileNotFoundError(
                    f"split folder {os.path.join(where, 'images')!r} does not exist (found: "
                    f"{', '.join(f'{s}/images' for s in split_folders)}); expected {_LAYOUT}"
                )
            return sorted(_paired(where), key=lambda pair: natural_key(pair[0])), where
        if not os.path.isdir(os.path.join(self.root, "images")):
            found = ", ".join(sorted(e.name for e in os.scandir(self.root) if not e.name.startswith("."))) or "nothing"
            raise FileNotFoundError(f"no images folder in {self.root!r} (found: {found}); expected {_LAYOUT}")
        pairs = sorted(_paired(self.root), key=lambda pair: natural_key(pair[0]))
        order = np.random.default_rng(seed).permutation(len(pairs))
        num_test, num_val = round(len(pairs) * test_fraction), round(len(pairs) * val_fraction)
        chosen = {"test": order[:num_test], "val": order[num_test : num_test + num_val]}
        chosen["train"] = order[num_test + num_val :]
        return [pairs[i] for i in sorted(chosen[self.split])], f"{self.root} ({self.split} share)"

    def _read_mask(self, path: str) -> np.ndarray:
        """The mask file at `path` as `read_mask` reads it, `mask_values` applied."""
        mask = read_mask(path)
        if not self.mask_values:
            return mask
        read = mask.copy()
        for value, new in self.mask_values.items():
            read[mask == value] = new
        return read

    def _warn_if_background_alone(self, where: str, count: int = 4) -> None:
        """A warning when the split's first `count` masks hold nothing but 0 and the ignore value: as read they
        label background alone, which is what a black-and-white mask saved as 0 / 255 reads as by default."""
        paths = [mask_path for _, mask_path in self.samples[:count]]
        try:
            values = [set(np.unique(self._read_mask(path)).tolist()) for path in paths]
        except ValueError:  # a mask that does not read stops the run where it is read, with its hint
            return
        if paths and all(found == {0, self.ignore_value} for found in values):
            _logger.warning(
                "%s: the first %d masks (%s, ...) hold only 0 and %d, the ignore value: they label background alone. "
                "For black-and-white masks saved as 0 / %d set data.options.mask_values: {%d: 1}",
                where, len(paths), paths[0], self.ignore_value, self.ignore_value, self.ignore_value,
            )  # fmt: skip

    def _checked_mask(self, image: Image.Image, image_path: str, mask_path: str) -> np.ndarray:
        """The mask of `image`, read, sized and checked: an error naming the file when it does not fit."""
        mask = self._read_mask(mask_path)
        if mask.shape != (image.height, image.width):
            if self.mask_size == "error":
                raise MaskError(
                    f"mask {mask_path} is {mask.shape[1]}x{mask.shape[0]} pixels, its image {image_path} "
                    f"{image.width}x{image.height}; data.options.mask_size: resize resizes masks to their image"
                )
            mask = _resized(mask, image.size)
        unknown = np.unique(mask[(mask != self.ignore_value) & ((mask < 0) | (mask >= self.num_classes))])
        if unknown.size:
            row, column = np.argwhere(mask == unknown[0])[0]
            raise MaskError(
                f"mask {mask_path} holds the value(s) {', '.join(map(str, unknown[:5].tolist()))} (first at row {row}, "
                f"column {column}); allowed: the classes 0 to {self.num_classes - 1} and the ignore value "
                f"{self.ignore_value} (data.options.num_classes / classes / ignore_value)"
            )
        return mask

    def _load(self, index: int) -> tuple[Image.Image, np.ndarray]:
        image_path, mask_path = self.samples[index]
        try:
            image = open_image(image_path, _IMG_MODES[self.in_chans])
            return image, self._checked_mask(image, image_path, mask_path)
        except ImageError as error:
            hint = "; data.options.on_bad_image: skip leaves such pairs out" if self.on_bad_image == "error" else ""
            what = "mask" if error.path == mask_path else "image"
            raise BadImageError(f"{what} {error}{hint}") from None

    def _header_problem(self, image_path: str, mask_path: str) -> str | None:
        """What is wrong with a pair by its files' headers (sizes, mask mode), else None."""
        try:
            width, height = _header_size(image_path)
        except ImageError as error:
            return f"image {error}"
        try:
            with Image.open(mask_path) as mask:
                mode, (mask_width, mask_height) = mask.mode, _oriented(mask)
        except Exception as error:  # PIL's decoders fail with many types; each is this file's fault
            return f"mask {ImageError(mask_path, _header_reason(error))}"
        if mode not in _INDEX_MODES:
            try:
                read_mask(mask_path)  # colours, or a mode that holds no indices; an RGB mask of one grey passes
            except ValueError as error:
                return str(error)
        if (mask_width, mask_height) != (width, height) and self.mask_size == "error":
            return (
                f"mask {mask_path} is {mask_width}x{mask_height} pixels, its image {image_path} {width}x{height}; "
                "data.options.mask_size: resize resizes masks to their image"
            )
        return None

    def _check_headers(self, samples: list[tuple[str, str]], where: str) -> None:
        """Every pair's sizes and mask mode, from the headers (in threads): a MaskError naming the first pair that
        does not fit, and how many do not."""
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            problems = [text for text in pool.map(lambda pair: self._header_problem(*pair), samples) if text]
        if problems:
            more = f" ({len(problems)} of the {len(samples)} pairs of {where} do not fit)" if len(problems) > 1 else ""
            raise MaskError(f"{problems[0]}{more}; data.options.on_bad_image: skip leaves such pairs out")

    def _readable(self, samples: list[tuple[str, str]], where: str) -> list[tuple[str, str]]:
        """The pairs that read and fit (every one read once, in threads); the others counted in a warning."""

        def problem(index: int) -> str | None:
            try:
                self._load(index)
            except ValueError as error:
                return str(error)
            return None

        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            problems = list(pool.map(problem, range(len(samples))))
        bad = [text for text in problems if text is not None]
        if bad:
            _logger.warning(
                "%s: left out %d image-mask pair(s) of %d that do not read or fit (on_bad_image: skip), e.g. %s",
                where,
                len(bad),
                len(samples),
                bad[0],
            )
        return [sample for sample, text in zip(samples, problems, strict=True) if text is None]

    def baselines(self, train_set: MaskFolderDataset | None = None) -> dict[str, dict[str, float]]:
        """The most-frequent-class rule: every pixel of this split predicted the class most frequent in the training
        masks (`train_set`'s files, else this split's). Scored on this split's masks as the model sees them (after
        the evaluation crop): its IoU is that class's share of the labelled pixels and 0 for every other class
        present, so its mIoU (macro over the classes present, as the ``miou`` metric takes it) is the share over the
        classes present (that class included); its pixel accuracy is the share."""
        reference = train_set if train_set is not None else self
        train_counts = np.zeros(self.num_classes, dtype=np.int64)
        for _, mask_path in reference.samples:
            mask = reference._read_mask(mask_path)
            train_counts += np.bincount(mask[mask < self.num_classes].ravel(), minlength=self.num_classes)
        majority = int(train_counts.argmax())
        counts = np.zeros(self.num_classes, dtype=np.int64)
        for index in range(len(self)):
            mask = self[index][1].numpy()
            counts += np.bincount(mask[mask != IGNORE_INDEX].ravel(), minlength=self.num_classes)
        share = float(counts[majority] / max(counts.sum(), 1))
        present = int((counts > 0).sum()) + int(counts[majority] == 0)
        return {"most_frequent_class": {"miou": share / present, "pixel_accuracy": share}}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pair `index`: image `[in_chans, s, s]` float32, normalised, and mask `[s, s]` int64 (s: img_size); an error
        naming the file when it does not read or fit."""
        image, mask = self._load(index)
        image, mask = self.transform(image, mask)
        return image, mask.masked_fill(mask == self.ignore_value, IGNORE_INDEX)

    def __repr__(self) -> str:
        return (
            f"MaskFolderDataset(root={self.root!r}, split={self.split!r}, img_size={self.img_size}, "
            f"in_chans={self.in_chans}, num_classes={self.num_classes}, len={len(self)})"
        )


def _files(folder: str, counts: Counter) -> dict[str, str]:
    """`{path below folder without suffix: path}` of the image files under `folder`; others counted in `counts`."""
    suffixes, found = _image_suffixes(), {}
    for parent, dirs, files in os.walk(folder, followlinks=True):
        counts["hidden"] += sum(entry.startswith(".") for entry in [*dirs, *files])
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for file in (f for f in files if not f.startswith(".")):
            stem, suffix = os.path.splitext(os.path.relpath(os.path.join(parent, file), folder))
            if suffix.lower() not in suffixes:
                counts[suffix.lower() or "(no suffix)"] += 1
            elif stem in found:
                raise ValueError(
                    f"{found[stem]!r} and {os.path.join(parent, file)!r}: two files for {stem!r} (images and masks "
                    "are paired by name without the suffix); keep one"
                )
            else:
                found[stem] = os.path.join(parent, file)
    return found


def _paired(where: str) -> list[tuple[str, str]]:
    """`(image, mask)` paths of `where/images` and `where/masks`; unpaired and other files counted in warnings."""
    images_dir, masks_dir = os.path.join(where, "images"), os.path.join(where, "masks")
    if not os.path.isdir(masks_dir):
        raise FileNotFoundError(f"no masks folder {masks_dir!r} beside {images_dir!r}; expected {_LAYOUT}")
    others = Counter()
    images, masks = _files(images_dir, others), _files(masks_dir, others)
    others = +others
    if others:
        kinds = ", ".join(f"{count} {kind}" for kind, count in others.most_common())
        _logger.warning("%s: left out %d files that are not images (%s)", where, sum(others.values()), kinds)
    for found, missing, what in ((images, masks, "images without a mask"), (masks, images, "masks without an image")):
        lonely = sorted(os.path.relpath(found[stem], where) for stem in set(found) - set(missing))
        if lonely:
            shown = ", ".join(lonely[:_SHOWN]) + (", ..." if len(lonely) > _SHOWN else "")
            _logger.warning("%s: left out %d %s (of %d): %s", where, len(lonely), what, len(found), shown)
    return [(images[stem], masks[stem]) for stem in set(images) & set(masks)]


def _classes_file(root: str) -> list[str] | None:
    """The class names of `root/classes.txt` (one a line, blank lines left out), None without the file."""
    path = os.path.join(root, "classes.txt")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


@dataclass(kw_only=True)
class MaskFolderOptions:
    """``data.options`` of mask_folder: the classes (``num_classes``, and or their names ``classes``; without either,
    ``ROOT/classes.txt``), the mask value of unlabelled pixels, values read as others (``mask_values``), what a
    mask of another size than its image does, the shares of val and test without split folders, and ``folder``'s
    normalisation and ``on_bad_image``."""

    num_classes: int | None = field(default=None, metadata={"min": 1})
    classes: list[str] | None = field(default=None, metadata={"unique": True})
    ignore_value: int = field(default=255, metadata={"min": 0})
    mask_values: dict[int, int] | None = None
    mask_size: Literal["error", "resize"] = "error"
    val_fraction: float = field(default=0.1, metadata={"min": 0, "max": 1})
    test_fraction: float = field(default=0.1, metadata={"min": 0, "max": 1})
    mean: list[float] | None = None
    std: list[float] | None = None
    on_bad_image: Literal["error", "skip"] = "error"

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.classes is not None and self.num_classes is not None and len(self.classes) != self.num_classes:
            problems.append(("classes", f"names {len(self.classes)} classes, num_classes is {self.num_classes}"))
        known = len(self.classes) if self.classes is not None else self.num_classes
        if known is not None and self.ignore_value < known:
            problems.append(("ignore_value", f"{self.ignore_value} is a class (of {known}): use at least {known}"))
        for value, new in (self.mask_values or {}).items():
            if min(value, new) < 0 or (known is not None and new >= known and new != self.ignore_value):
                allowed = f"a class (0 to {known - 1}) or {self.ignore_value}" if known is not None else "values >= 0"
                problems.append(("mask_values", f"reads {value} as {new}; allowed: {allowed}"))
        if self.val_fraction + self.test_fraction >= 1:
            problems.append(("test_fraction", f"plus val_fraction must be < 1, got {self.test_fraction}"))
        return problems

    def class_names(self, root: str) -> list[str]:
        """The class names from the options, else from ``root/classes.txt``, checked against each other."""
        for key, problem in self.problems():
            raise ValueError(f"data.options.{key}: {problem}")
        if self.classes is not None:
            return list(self.classes)
        from_file = _classes_file(root)
        if from_file is None:
            if self.num_classes is None:
                raise ValueError(
                    f"dataset 'mask_folder' needs data.options.num_classes (mask values 0 to num_classes - 1), "
                    f"data.options.classes (their names) or {os.path.join(root, 'classes.txt')!r} (a name a line)"
                )
            return [str(i) for i in range(self.num_classes)]
        if self.num_classes is not None and len(from_file) != self.num_classes:
            raise ValueError(
                f"{os.path.join(root, 'classes.txt')!r} names {len(from_file)} classes, "
                f"data.options.num_classes is {self.num_classes}"
            )
        duplicates = sorted(name for name, count in Counter(from_file).items() if count > 1)
        if duplicates:
            raise ValueError(f"{os.path.join(root, 'classes.txt')!r} names {duplicates} more than once")
        return from_file


@register_dataset("mask_folder", options=MaskFolderOptions, kind="image", tasks=("segmentation",), root="required")
def build_mask_folder(options: MaskFolderOptions, context: DataContext) -> MaskFolderDataset:
    """Your images and masks at data.root (ROOT/images/a.jpg + ROOT/masks/a.png), resized to model.img_size."""
    if context.img_size is None:
        raise ValueError("dataset 'mask_folder' resizes to the model's image size: the context needs img_size")
    if not os.path.isdir(context.root):
        raise FileNotFoundError(f"dataset root {context.root!r} is not a folder; expected {_LAYOUT}")
    return MaskFolderDataset(
        context.root,
        context.split,
        img_size=context.img_size,
        is_training=context.is_training,
        classes=options.class_names(context.root),
        ignore_value=options.ignore_value,
        mask_values=options.mask_values,
        in_chans=context.in_chans or 3,
        mean=options.mean,
        std=options.std,
        on_bad_image=options.on_bad_image,
        mask_size=options.mask_size,
        val_fraction=options.val_fraction,
        test_fraction=options.test_fraction,
        seed=context.seed,
        subset=context.subset,
    )
