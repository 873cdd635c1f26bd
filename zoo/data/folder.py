"""Users' own images in the ImageFolder layout ``ROOT/<split>/<class>/*.png``, at any resolution.

Reading and transforms are timm's (``ImageDataset`` over its folder reader, ``create_transform``); this module
adds the checks that turn a wrong path or an empty folder into an error that says what was expected, and one
class index shared by every split.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from .._validate import check_int
from ._registry import DataContext, register_dataset

__all__ = ["FolderOptions", "ImageFolderDataset"]

_LAYOUT = "ROOT/<split>/<class>/*.png|*.jpg|*.jpeg (one sub-folder per class)"
_IMG_MODES = {1: "L", 3: "RGB"}
# ImageNet statistics; for one channel, their mean over the three channels
_DEFAULT_MEAN = {1: (0.449,), 3: (0.485, 0.456, 0.406)}
_DEFAULT_STD = {1: (0.226,), 3: (0.229, 0.224, 0.225)}


def _class_folders(folder: str) -> list[str]:
    """Names of the visible sub-folders of ``folder``, in timm's natural order."""
    from timm.utils.misc import natural_key

    names = [e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith(".")]
    return sorted(names, key=natural_key)


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
    """

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
    ):
        from timm.data import ImageDataset, create_transform

        if in_chans not in _IMG_MODES:
            raise ValueError(f"in_chans must be one of {sorted(_IMG_MODES)}, got {in_chans!r}")
        check_int("img_size", img_size, 1)
        self.root = os.fspath(root)
        self.split = split
        self.in_chans = in_chans
        self.img_size = img_size
        self.mean = _check_stats("mean", mean, in_chans, _DEFAULT_MEAN[in_chans])
        self.std = _check_stats("std", std, in_chans, _DEFAULT_STD[in_chans])
        split_dir = self._split_dir()
        self.classes = tuple(self._class_index(split_dir))
        transform = create_transform(
            input_size=(in_chans, img_size, img_size), is_training=is_training, mean=self.mean, std=self.std
        )
        self._dataset = ImageDataset(
            split_dir, reader=self._reader(split_dir), input_img_mode=_IMG_MODES[in_chans], transform=transform
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

    def _reader(self, split_dir: str):
        """timm's folder reader over ``split_dir`` with the shared class index; ValueError when it finds no image."""
        from timm.data.readers.reader_image_folder import ReaderImageFolder

        class_map = {name: idx for idx, name in enumerate(self.classes)}
        try:
            return ReaderImageFolder(split_dir, class_map=class_map)
        except RuntimeError as err:
            raise ValueError(f"no images found in the class folders of {split_dir!r}; expected {_LAYOUT}") from err

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Image ``index``: float32 ``[in_chans, img_size, img_size]``, normalised, and its class index."""
        image, label = self._dataset[index]
        return image, int(label)

    def __repr__(self) -> str:
        return (
            f"ImageFolderDataset(root={self.root!r}, split={self.split!r}, img_size={self.img_size}, "
            f"in_chans={self.in_chans}, num_classes={self.num_classes}, len={len(self)})"
        )


@dataclass(kw_only=True)
class FolderOptions:
    """``data.options`` of folder: the normalisation per channel (or one value for all); null: ImageNet's."""

    mean: list[float] | None = None
    std: list[float] | None = None


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
    )
