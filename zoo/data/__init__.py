"""Datasets that load with no network: MegaMNIST canvases and users' own image folders."""

import difflib

from torch.utils.data import Dataset

from .folder import ImageFolderDataset
from .megamnist import MegaMNIST

__all__ = ["DATASETS", "ImageFolderDataset", "MegaMNIST", "build_dataset"]

DATASETS = ("megamnist", "folder")

_OPTIONS = {
    "megamnist": (
        "canvas_size",
        "num_samples",
        "num_target",
        "num_other",
        "num_clutter",
        "digit_size",
        "seed",
        "pool_fractions",
    ),
    "folder": ("root", "img_size", "in_chans", "mean", "std"),
}
_REQUIRED = {"megamnist": (), "folder": ("root", "img_size")}


def build_dataset(name: str, split: str, *, is_training: bool, **options) -> Dataset:
    """The dataset ``name`` for ``split``, built from ``options``.

    Args:
        name: one of ``DATASETS``.
        split: ``train``, ``val`` or ``test`` for megamnist; the split folder name for folder.
        is_training: training augmentation for folder; MegaMNIST canvases are fixed by (seed, split, index),
            so it has no effect there.
        options: megamnist takes canvas_size, num_samples, num_target, num_other, num_clutter, digit_size,
            seed, pool_fractions (see ``MegaMNIST``); folder takes root and img_size (both required), in_chans,
            mean, std (see ``ImageFolderDataset``).

    Returns:
        a map-style dataset of ``(image [C, H, W] float32, label int)``.
    """
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown dataset {name!r}{hint} (known: {', '.join(DATASETS)})")
    allowed = _OPTIONS[name]
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown option {key!r} for dataset {name!r}{hint} (allowed: {', '.join(allowed)})")
    missing = [key for key in _REQUIRED[name] if key not in options]
    if missing:
        raise ValueError(f"dataset {name!r} needs the option(s) {', '.join(missing)}")
    if name == "megamnist":
        return MegaMNIST(split, **options)
    return ImageFolderDataset(split=split, is_training=is_training, **options)
