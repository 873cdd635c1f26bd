"""Users' own images in the ImageFolder layout ``ROOT/<split>/<class>/<image files>``, at any resolution.

Files are listed here (every format PIL reads: PNG, JPEG, GIF, BMP, TIFF, WebP, ...; sub-folders of a class folder
included) and decoded by ``zoo.data.images.decode.open_image`` with their real bit depth and mode (16-bit scaled,
palette and alpha converted, the first frame of a GIF); timm's ``create_transform`` resizes, crops and normalises. Files
of another kind (``.txt``, ``.csv``), hidden files and folders (``.DS_Store``, ``.ipynb_checkpoints``) and files beside
the class folders are left out with a warning that counts them. ``data.<split>_samples`` set in a recipe keeps that many
images of the split, drawn from ``data.seed`` and counted in a warning (``DataContext.subset``).

An image that cannot be decoded (truncated, not an image) is named by its path, never replaced by another:
``on_bad_image: error`` (the default) stops at the first one read; ``skip`` decodes every image once when the split
is built and leaves the unreadable ones out, with a warning that counts them.
"""

import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils.data import Dataset

from ..._validate import check_int
from .._registry import DataContext, register_dataset
from ._augment import AugmentOptions, augment_kwargs
from .decode import ImageError, open_image

__all__ = ["BadImageError", "FolderOptions", "ImageFolderDataset"]

_logger = logging.getLogger(__name__)

_LAYOUT = "ROOT/<split>/<class>/*.png|*.jpg|*.gif|... (one sub-folder per class)"
_IMG_MODES = {1: "L", 3: "RGB"}
BAD_IMAGE_POLICIES = ("error", "skip")
# ImageNet statistics; for one channel, their mean over the three channels
_DEFAULT_MEAN = {1: (0.449,), 3: (0.485, 0.456, 0.406)}
_DEFAULT_STD = {1: (0.226,), 3: (0.229, 0.224, 0.225)}


class BadImageError(ValueError):
    """An image of the dataset that cannot be decoded, named by path (one argument: a DataLoader worker re-raises
    it with its type)."""


def _class_folders(folder: str) -> list[str]:
    """Names of the visible sub-folders of ``folder``, in timm's natural order."""
    from timm.utils.misc import natural_key

    names = [e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith(".")]
    return sorted(names, key=natural_key)


def _image_suffixes() -> frozenset[str]:
    """File suffixes of the formats PIL reads (`.png`, `.gif`, `.tif`, ...), lower case."""
    from PIL import Image

    Image.init()
    return frozenset(suffix.lower() for suffix in Image.registered_extensions())


def _check_stats(name: str, value: Sequence[float] | None, in_chans: int, default: tuple[float, ...]) -> tuple:
    """Normalisation ``mean`` or ``std``: one value per channel, or one value for all of them."""
    if value is None:
        return default
    stats = tuple(float(v) for v in value)
    if len(stats) == 1:
        stats = stats * in_chans
    if len(stats) != in_chans:
        raise ValueError(f"{name} must have 1 or in_chans={in_chans} values, got {tuple(value)!r}")
    if name == "std" and min(stats) <= 0:
        raise ValueError(f"std values must be > 0, got {tuple(value)!r}")
    return stats


class ImageFolderDataset(Dataset):
    """Labelled images from ``root/split/<class>/``, resized, cropped and normalised by timm's transforms.

    Each sample is ``(image, label)``: ``image`` float32 ``[in_chans, img_size, img_size]``, ``label`` an int.
    The class index comes from the class folders of ``root/train`` when it exists (else of ``root/split``),
    so that every split maps a class name to the same index; a class folder that train lacks is an error.

    Args:
        root: dataset folder holding one folder per split.
        split: name of the split folder, e.g. ``train``, ``val`` or ``test``.
        img_size: side of the square images produced.
        is_training: timm's training augmentation (random resized crop, flip, colour jitter) when True,
            resize and centre crop otherwise.
        in_chans: 1 (images converted to grayscale) or 3 (RGB).
        mean, std: normalisation per channel (or one value for all); default ImageNet's.
        on_bad_image: ``error`` (an unreadable image stops the run when it is read, named by path) or ``skip``
            (every image decoded now, the unreadable ones left out and counted).
        subset: ``(count, what) -> indices or None``, the images kept of the split's list (``DataContext.subset``);
            None keeps every image.
        augment: timm's RandAugment, random erasing and crop ranges for training (``data.options.augment``); only
            read when ``is_training``.
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
        in_chans: int = 3,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        on_bad_image: str = "error",
        subset: Callable[[int, str], Sequence[int] | None] | None = None,
        augment: AugmentOptions | None = None,
    ):
        from timm.data import create_transform

        if in_chans not in _IMG_MODES:
            raise ValueError(f"in_chans must be one of {sorted(_IMG_MODES)}, got {in_chans!r}")
        if on_bad_image not in BAD_IMAGE_POLICIES:
            raise ValueError(f"on_bad_image must be one of {', '.join(BAD_IMAGE_POLICIES)}, got {on_bad_image!r}")
        check_int("img_size", img_size, 1)
        self.root = os.fspath(root)
        self.split = split
        self.in_chans = in_chans
        self.img_size = img_size
        self.on_bad_image = on_bad_image
        self.mean = _check_stats("mean", mean, in_chans, _DEFAULT_MEAN[in_chans])
        self.std = _check_stats("std", std, in_chans, _DEFAULT_STD[in_chans])
        split_dir = self._split_dir()
        self.classes = tuple(self._class_index(split_dir))
        self.samples = self._list_images(split_dir)
        if subset is not None:
            kept = subset(len(self.samples), f"images of {split_dir!r}")
            self.samples = self.samples if kept is None else [self.samples[i] for i in kept]
        if on_bad_image == "skip":
            self.samples = self._readable(self.samples, split_dir)
        augmented = augment_kwargs(augment) if is_training and augment is not None else {}
        self.transform = create_transform(
            input_size=(in_chans, img_size, img_size),
            is_training=is_training,
            mean=self.mean,
            std=self.std,
            **augmented,
        )

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def _split_dir(self) -> str:
        """``root/split``, or a FileNotFoundError naming the missing path and the expected layout."""
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"dataset root {self.root!r} is not a folder; expected the layout {_LAYOUT}")
        split_dir = os.path.join(self.root, self.split)
        if not os.path.isdir(split_dir):
            found = ", ".join(_class_folders(self.root)) or "nothing"
            raise FileNotFoundError(
                f"split folder {split_dir!r} does not exist (found in root: {found}); expected the layout {_LAYOUT}"
            )
        return split_dir

    def _class_index(self, split_dir: str) -> list[str]:
        """Class names from ``root/train`` when it exists, checked against the class folders of this split."""
        here = _class_folders(split_dir)
        if not here:
            raise ValueError(f"no class folders in {split_dir!r}; expected the layout {_LAYOUT}")
        train_dir = os.path.join(self.root, "train")
        if self.split == "train" or not os.path.isdir(train_dir):
            return here
        classes = _class_folders(train_dir)
        unknown = sorted(set(here) - set(classes))
        if unknown:
            raise ValueError(
                f"class folders {unknown} of {split_dir!r} are missing from {train_dir!r}, whose classes are "
                f"{classes}; every split must use the training classes"
            )
        return classes

    def _list_images(self, split_dir: str) -> list[tuple[str, int]]:
        """``(path, class index)`` of every image file under the class folders, in natural order; other files are
        counted in a warning; a split without images is a ValueError."""
        from timm.utils.misc import natural_key

        suffixes, samples = _image_suffixes(), []
        beside = [e.name for e in os.scandir(split_dir) if not e.is_dir()]
        others = Counter({"beside the class folders": len(beside)} if beside else {})
        others["hidden"] += sum(e.name.startswith(".") and e.is_dir() for e in os.scandir(split_dir))
        for label, name in enumerate(self.classes):
            folder = os.path.join(split_dir, name)
            if not os.path.isdir(folder):
                continue
            for parent, dirs, files in os.walk(folder, followlinks=True):
                others["hidden"] += sum(entry.startswith(".") for entry in [*dirs, *files])
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                for file in (f for f in files if not f.startswith(".")):
                    suffix = os.path.splitext(file)[1].lower()
                    if suffix in suffixes:
                        samples.append((os.path.join(parent, file), label))
                    else:
                        others[suffix or "(no suffix)"] += 1
        others = +others
        if others:
            kinds = ", ".join(f"{count} {kind}" for kind, count in others.most_common())
            _logger.warning("%s: left out %d files that are not images (%s)", split_dir, sum(others.values()), kinds)
        if not samples:
            raise ValueError(f"no images found in the class folders of {split_dir!r}; expected {_LAYOUT}")
        empty = sorted(set(self.classes) - {self.classes[label] for _, label in samples})
        if empty and self.split == "train":
            _logger.warning("%s: the classes %s have no image: the model cannot learn them", split_dir, empty)
        return sorted(samples, key=lambda sample: natural_key(sample[0]))

    def _readable(self, samples: list[tuple[str, int]], split_dir: str) -> list[tuple[str, int]]:
        """The samples whose image decodes (every one decoded once, in threads); the others counted in a warning."""
        mode = _IMG_MODES[self.in_chans]

        def problem(sample: tuple[str, int]) -> str | None:
            try:
                open_image(sample[0], mode)
            except ImageError as error:
                return str(error)
            return None

        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            problems = list(pool.map(problem, samples))
        bad = [text for text in problems if text is not None]
        if bad:
            _logger.warning(
                "%s: left out %d unreadable image(s) of %d (on_bad_image: skip), e.g. %s",
                split_dir,
                len(bad),
                len(samples),
                bad[0],
            )
        return [sample for sample, text in zip(samples, problems, strict=True) if text is None]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Image ``index``: float32 ``[in_chans, img_size, img_size]``, normalised, and its class index; a
        BadImageError naming the file when it cannot be decoded."""
        path, label = self.samples[index]
        try:
            image = open_image(path, _IMG_MODES[self.in_chans])
        except ImageError as error:
            hint = (
                "; data.options.on_bad_image: skip leaves unreadable images out" if self.on_bad_image == "error" else ""
            )
            raise BadImageError(f"image {error}{hint}") from None
        return self.transform(image), label

    def __repr__(self) -> str:
        return (
            f"ImageFolderDataset(root={self.root!r}, split={self.split!r}, img_size={self.img_size}, "
            f"in_chans={self.in_chans}, num_classes={self.num_classes}, len={len(self)})"
        )


@dataclass(kw_only=True)
class FolderOptions:
    """``data.options`` of folder: the normalisation per channel (or one value for all; null: ImageNet's) and what
    an unreadable image does (error: stops the run, named by path; skip: left out when the split is built)."""

    mean: list[float] | None = None
    std: list[float] | None = None
    on_bad_image: Literal["error", "skip"] = "error"
    # timm's training augmentation of the train split (zoo.data.images._augment); null: timm's default training
    # transform (random resized crop, flip, colour jitter)
    augment: AugmentOptions | None = None


@register_dataset("folder", options=FolderOptions, kind="image", tasks=("classification",), root="required")
def build_folder(options: FolderOptions, context: DataContext) -> ImageFolderDataset:
    """Your images at data.root (ROOT/<split>/<class>/*.png), resized to model.img_size, model.in_chans (3)."""
    if context.img_size is None:
        raise ValueError("dataset 'folder' resizes to the model's image size: the context needs img_size")
    return ImageFolderDataset(
        context.root,
        context.split,
        img_size=context.img_size,
        is_training=context.is_training,
        in_chans=context.in_chans or 3,
        mean=options.mean,
        std=options.std,
        on_bad_image=options.on_bad_image,
        subset=context.subset,
        augment=options.augment,
    )
