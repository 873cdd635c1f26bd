"""Pathfinder and Path-X (Long Range Arena): are the two markers joined by one dashed contour? Generated on the fly.

Linsley et al., "Learning long-range spatial dependencies with horizontal gated recurrent units", NeurIPS 2018,
https://arxiv.org/abs/1805.08315 (the ``snakes2`` generator of github.com/drewlinsley/pathfinder), at the sizes of
Tay et al., "Long Range Arena", ICLR 2021, https://arxiv.org/abs/2011.04006 (Pathfinder 32 and 64, Path-X 128).

An image holds two target snakes, each a chain of ``contour_length`` short line segments ("paddles") separated by
gaps, whose tails start ``seed_distance`` px apart, plus short distractor snakes. One marker sits on the tail of a
target snake; the other on the far end of the same snake (label 1, "connected") or of the other one (label 0).
Each paddle continues the previous one: its far end is drawn on a circle of radius ``paddle_length + margin``
around a pivot ``margin`` px past the previous paddle, favouring small turns by ``cos(continuity * turn)^2``, and
no paddle may come near an earlier one (other than its own predecessor); a snake that runs into a dead end is
redrawn, so the snakes that remain curl within the image.

Settings (LRA's ``lra_benchmarks/data/pathfinder.py`` docstrings, which list what LRA changed from the defaults of
Linsley's ``snakes2_wrapper.py``; the defaults fill the rest: paddle length 5, paddle contrast 1, no single-paddle
distractors, 3 tries per paddle, 5 per distractor snake):

================  ======  ======  ============
resolution        32      64      128 (Path-X)
================  ======  ======  ============
paddle length     2       5       5
paddle thickness  0.5     1       1.5
paddle margin     1       1       2 or 3
seed distance     7       12      20
marker radius     1.5     2.5     3
continuity        1.0     1.8     1.8
snake contrast    2       0.8     0.9
paddle contrast   0.75    1       1
distractors       20      22      35  (paddles, over snakes of ``contour_length / 3`` paddles)
================  ======  ======  ============

Contour length is 14 paddles for ``hard`` (LRA's task), 9 for ``intermediate``, 6 for ``easy``; anti-aliasing at
2x, a 1 px border kept free. Target paddles shine at ``paddle contrast * snake contrast``, distractors at ``snake
contrast``, markers at 1, and each image is scaled so that its brightest pixel is 255.

Differences from snakes2, for exact labels and speed (about 500 images/s at 32 px on one CPU core):
(1) geometry is continuous (paddles start on a half-pixel grid, whole-degree orientations) and a paddle's centre
line must stay ``max(thickness, 1) + 2 * margin`` px from every other paddle but its own predecessor; snakes2 compares
anti-aliased masks on the pixel grid and skips the other target snake's newest paddle, so its two target snakes
can touch. Here distinct snakes never touch, even through the gaps, which the tests check by flood fill.
(2) A far end is drawn among all candidates that fit (snakes2 gives up after 3 draws).
(3) The first target snake is redrawn until one grows in full, then the second; snakes2 grows both in turns and
redraws the pair at any dead end. (4) Labels alternate with the index (exactly balanced) instead of being drawn.

Sample ``i`` depends only on (seed, split, i) and the options. The datasets built from recipes cache the images
of a split on disk (``data.options.cache``, on by default): drawn once, on every core, into
``cache_dir() / "pathfinder"`` (``$ZOO_CACHE``, else ``~/.cache/zoo``; 1 KiB per image at 32 px, 16 KiB at
Path-X), then read from that file by every later epoch, run and process.

``pathfinder`` gives dicts (``tokens`` int64 ``[H*W]``, the grey levels 0-255 row by row; ``mask`` bool, all True;
``label`` int64 ``[]``) for 1-D models; ``pathfinder_image`` gives ``(image float32 [1, H, W] in [0, 1], label)``
pairs for ViTs.
"""

from __future__ import annotations

import bisect
import logging
import math
import multiprocessing
import operator
import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from .._validate import check_bool, check_int
from ._cache import cache_dir, cache_lock, write_atomic
from ._registry import DataContext, register_dataset

__all__ = ["CONTOUR_LENGTHS", "RESOLUTIONS", "Pathfinder", "PathfinderOptions"]


class _Settings(NamedTuple):
    paddle_length: int
    thickness: float
    margins: tuple[int, ...]
    seed_distance: int
    marker_radius: float
    continuity: float
    snake_contrast: float
    paddle_contrast: float
    # distractor paddles in all: snakes of contour_length / 3 paddles until this many
    distractor_paddles: int


RESOLUTIONS = {
    32: _Settings(2, 0.5, (1,), 7, 1.5, 1.0, 2.0, 0.75, 20),
    64: _Settings(5, 1.0, (1,), 12, 2.5, 1.8, 0.8, 1.0, 22),
    128: _Settings(5, 1.5, (2, 3), 20, 3.0, 1.8, 0.9, 1.0, 35),
}
CONTOUR_LENGTHS = {"easy": 6, "intermediate": 9, "hard": 14}
_SPLITS = ("train", "val", "test")
# 200k images per difficulty, split 80/10/10 as LRA's loaders do
_DEFAULT_NUM_SAMPLES = {"train": 160_000, "val": 20_000, "test": 20_000}
_BORDER = 1  # snakes2's padding: a ring of this width stays free of paddles
_FINE = 2  # keep-out raster cells per pixel (per side); paddles start on this grid
_SAMPLE_SPACING = 1.0  # px between the samples of a paddle checked against the raster
# px added to the keep-out radius for rounding a paddle's samples to raster cells (0.36 px at most) and for the
# centre line between two samples (0.05 px at most, for keep-out radii of 3 px and more)
_SNAP = 0.45
_SUBSAMPLES = 4  # anti-aliased markers: coverage from 4 x 4 points per pixel
_DISTRACTOR_TRIES = 5  # snakes2's max_distractor_contour_retrial = 4
_POSITION_TRIES = 8  # random places tried for a distractor's first paddle before an exact search
_SNAKE_TRIES = 500  # draws of each target snake before the pair is redrawn (hard: 1 in 13 to 27 grows in full)
_PAIR_TRIES = 20  # target pairs drawn before giving up
# Bump when a change to the generator changes any image: cache files of another version are never read.
_GENERATOR_VERSION = 1
_CHUNK = 512  # images per task when the cache is filled in parallel
_PARALLEL_FROM = 2 * _CHUNK  # fewer missing images are drawn in this process

_logger = logging.getLogger(__name__)


class _Geometry:
    """Everything one resolution and paddle margin need, precomputed for the 360 whole-degree orientations.

    Paddles start on a raster of ``_FINE`` x ``_FINE`` cells per pixel. Each drawn paddle marks its keep-out zone
    (the cells within ``max(thickness, 1) + 2 * margin`` px of its centre line) on the raster; a paddle fits when
    its centre line, sampled every ``_SAMPLE_SPACING`` px, meets no zone. The raster is one Python integer, a bit
    per cell at its flat index ``row * side + col`` (shifts, ANDs and ORs of integers are far cheaper than
    numpy calls on a few cells); the zones and samples are precomputed as bit masks.
    """

    def __init__(self, resolution: int, margin: int):
        settings = RESOLUTIONS[resolution]
        self.size, self.margin, self.length = resolution, margin, settings.paddle_length
        self.dirs = np.stack([np.sin(np.deg2rad(np.arange(360))), np.cos(np.deg2rad(np.arange(360)))], -1)
        # a gap between two paddles of a snake is 2 * margin + 0.71 px at most (grid rounding), so centre lines
        # max(thickness, 1) + 2 * margin apart keep the gaps of distinct snakes 0.29 px apart or more
        radius = max(settings.thickness, 1.0) + 2 * margin + _SNAP
        self.half = math.ceil((self.length + radius) * _FINE) + 1
        stamps = self._keep_out(radius)  # bool [360, 2 * half + 1, 2 * half + 1]
        # padding that holds every stamp, and every candidate around a pivot just outside the frame
        self.pad = max(self.half, math.ceil(2 * (self.length + 2 * margin) * _FINE)) + 2
        self.side = side = (resolution - 1) * _FINE + 1 + 2 * self.pad
        low, high = (_BORDER + margin) * _FINE + self.pad, (resolution - 1 - _BORDER - margin) * _FINE + self.pad
        inside = (np.arange(side) >= low) & (np.arange(side) <= high)
        # centre lines stay margin + border px inside the image: the frame is a zone of its own
        self.frame = _bits(~(inside[:, None] & inside[None, :]))
        # a zone as bits from the corner of its box: OR it in shifted by (start - corner)
        box = np.zeros((len(stamps), stamps.shape[1], side), dtype=bool)
        box[:, :, : stamps.shape[2]] = stamps
        self.stamps = [_bits(stamp) for stamp in box]
        self.corner = self.half * side + self.half

        def flat(offsets: np.ndarray) -> np.ndarray:
            cells = np.rint(offsets * _FINE).astype(np.int64)
            return cells[..., 0] * side + cells[..., 1]

        along = np.linspace(0.0, self.length, math.ceil(self.length / _SAMPLE_SPACING) + 1)  # [P]
        samples = flat(along[None, :, None] * self.dirs[:, None, :])  # [360, P] from a paddle's start
        self.samples = samples
        # first paddles: samples as bits from start + seed_low
        self.seed_low = int(samples.min())
        self.seed_bits = [sum(1 << int(offset - self.seed_low) for offset in set(row)) for row in samples.tolist()]
        # flat index of every pixel centre
        pixels = np.arange(resolution) * _FINE + self.pad
        self.pixels = (pixels[:, None] * side + pixels[None, :]).reshape(-1)
        # snakes2's pivot, margin px past a paddle's far end, from its start
        self.to_pivot = flat((self.length + margin) * self.dirs).tolist()  # [360]
        # candidates: far ends one pixel of arc apart on the circle of radius length + margin around the pivot
        # (snakes2's), turning less than pi / (2 * continuity) (the rest have weight 0)
        step = 1.0 / (self.length + margin)
        widest = math.ceil(math.pi / 2 / (settings.continuity * step)) - 1
        turns = np.arange(-widest, widest + 1) * step
        self.weights = (np.cos(turns * settings.continuity) ** 2).tolist()  # [J]
        self.cumulative = np.cumsum(self.weights)[:-1].tolist()
        self.total = sum(self.weights)
        candidates = (np.arange(360)[:, None] + np.rint(np.rad2deg(turns)).astype(np.int64)) % 360  # [360, J]
        self.candidates = candidates.tolist()
        # from the pivot to each candidate's start [360][J], and its samples as bits of the window from
        # pivot + low to pivot + high
        self.to_start = flat(margin * self.dirs)[candidates].tolist()
        offsets = np.asarray(self.to_start)[..., None] + samples[candidates]  # [360, J, P]
        self.low = int(offsets.min())
        self.window = (1 << int(offsets.max() - self.low + 1)) - 1
        self.candidate_bits = [
            [sum(1 << int(offset - self.low) for offset in set(row)) for row in heading] for heading in offsets.tolist()
        ]

    def _keep_out(self, radius: float) -> np.ndarray:
        """Cells within ``radius`` px of a paddle from the box centre, at each whole-degree orientation."""
        grid = (np.arange(2 * self.half + 1) - self.half) / _FINE
        cells = np.stack(np.meshgrid(grid, grid, indexing="ij"), axis=-1)  # [B, B, 2] (y, x) px
        ends = self.length * self.dirs  # [360, 2]
        t = np.clip((cells[None] * ends[:, None, None]).sum(-1) / self.length**2, 0.0, 1.0)  # [360, B, B]
        gap = cells[None] - t[..., None] * ends[:, None, None]
        return (gap**2).sum(-1) <= radius**2

    def position(self, y: float, x: float) -> int:
        """Flat raster index of the pixel point (y, x), rounded to the nearest cell."""
        return (round(y * _FINE) + self.pad) * self.side + round(x * _FINE) + self.pad

    def segment(self, paddle: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (y, x) px of a paddle."""
        row, col = divmod(paddle[0], self.side)
        start = np.array([(row - self.pad) / _FINE, (col - self.pad) / _FINE])
        return start, start + self.length * self.dirs[paddle[1]]


def _bits(cells: np.ndarray) -> int:
    """A boolean array as one integer, bit i set when ``cells.flat[i]``."""
    return int.from_bytes(np.packbits(cells.reshape(-1), bitorder="little").tobytes(), "little")


@lru_cache(maxsize=8)
def _geometry(resolution: int, margin: int) -> _Geometry:
    return _Geometry(resolution, margin)


@lru_cache(maxsize=4)
def _marker(radius: float) -> np.ndarray:
    """Anti-aliased disc of ``radius`` px around the centre of a ``[2B+1, 2B+1]`` box, float32 in [0, 1]."""
    half = math.ceil(radius) + 1
    fine = (np.arange((2 * half + 1) * _SUBSAMPLES) + 0.5) / _SUBSAMPLES - 0.5 - half
    inside = (fine[:, None] ** 2 + fine[None, :] ** 2) <= radius**2
    return inside.reshape(2 * half + 1, _SUBSAMPLES, 2 * half + 1, _SUBSAMPLES).mean(axis=(1, 3)).astype(np.float32)


_Paddle = tuple[int, int]  # flat raster index of its start, orientation in whole degrees


class _Canvas:
    """The keep-out raster of one scene being drawn, as an integer (see ``_Geometry``).

    A snake is a list of paddles. While it grows, its newest paddle is left off the raster (snakes2: a paddle may
    come close to its own predecessor) and marked when the next one is added. A snake that dead-ends is undone by
    putting back the raster from before it.
    """

    def __init__(self, geometry: _Geometry, rnd: random.Random):
        self.geometry, self.random = geometry, rnd.random
        self.cells = geometry.frame

    def fits(self, start: int, degree: int) -> bool:
        """Whether a paddle from flat index ``start`` along ``degree`` meets no keep-out zone."""
        geometry = self.geometry
        return not (self.cells >> (start + geometry.seed_low)) & geometry.seed_bits[degree]

    def free_start(self, degree: int, rnd: random.Random) -> int | None:
        """A whole-pixel start, uniform among those where a paddle along ``degree`` fits (snakes2's seed_snake),
        or None: a few random tries, then an exact search."""
        geometry, size = self.geometry, self.geometry.size
        for _ in range(_POSITION_TRIES):
            start = geometry.position(int(rnd.random() * size), int(rnd.random() * size))
            if self.fits(start, degree):
                return start
        raw = self.cells.to_bytes(-(-(geometry.side**2) // 8), "little")
        cells = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
        starts = geometry.pixels[cells[geometry.pixels] == 0]
        starts = starts[~cells[starts[:, None] + geometry.samples[degree]].any(axis=1)]
        return int(starts[int(rnd.random() * len(starts))]) if len(starts) else None

    def _mark(self, paddle: _Paddle) -> None:
        self.cells |= self.geometry.stamps[paddle[1]] << (paddle[0] - self.geometry.corner)

    def grow(self, tail: int, degree: int, length: int) -> list[_Paddle] | None:
        """A snake of ``length`` paddles from a first paddle at ``tail`` along ``degree`` (check it with ``fits``),
        marked; None at a dead end (snakes2 then redraws the snake), leaving the raster as it was."""
        before, snake = self.cells, [(tail, degree)]
        while len(snake) < length and self._extend(snake):
            pass
        if len(snake) < length:
            self.cells = before
            return None
        self._mark(snake[-1])
        return snake

    def _extend(self, snake: list[_Paddle]) -> bool:
        """Add one paddle (snakes2's extend_snake): a far end drawn by continuity weight among those whose paddle
        fits (snakes2 gives up after 3 draws); False at a dead end."""
        geometry = self.geometry
        start, heading = snake[-1]
        pivot = start + geometry.to_pivot[heading]
        window = (self.cells >> (pivot + geometry.low)) & geometry.window
        candidates = geometry.candidate_bits[heading]
        # draw j with probability weights[j] / total; a drawn candidate that does not fit gets weight 0
        j = bisect.bisect_right(geometry.cumulative, self.random() * geometry.total)
        weights, total = None, geometry.total
        while window & candidates[j]:
            if weights is None:
                weights = geometry.weights.copy()
            total -= weights[j]
            weights[j] = 0.0
            if total <= 1e-9:
                return False
            target = self.random() * total
            for j, weight in enumerate(weights):
                if target < weight:
                    break
                target -= weight
            else:
                # rounding left the target past the end: the last candidate still in the draw
                j = max(k for k, weight in enumerate(weights) if weight > 0)
        self._mark(snake[-1])
        snake.append((pivot + geometry.to_start[heading][j], geometry.candidates[heading][j]))
        return True


class _Scene(NamedTuple):
    image: np.ndarray  # uint8 [S, S]
    label: int
    targets: tuple[np.ndarray, np.ndarray]  # polyline of each target snake, [2 * paddles, 2]
    markers: tuple[np.ndarray, np.ndarray]  # (y, x) of the origin and the terminal marker


class _Generator:
    """Draws scenes for one resolution and contour length; holds no state between scenes."""

    def __init__(self, resolution: int, contour_length: int):
        self.size, self.contour_length = resolution, contour_length
        self.settings = settings = RESOLUTIONS[resolution]
        # LRA: 32 px uses whole-number division, 64 and 128 px true division (snakes2 then stops at the ceiling)
        if resolution == 32:
            self.distractor_length = contour_length // 3
            self.num_distractors = settings.distractor_paddles // self.distractor_length
        else:
            self.distractor_length = int(contour_length / 3)
            self.num_distractors = math.ceil(settings.distractor_paddles * 3 / contour_length)

    def scene(self, rnd: random.Random, label: int) -> _Scene:
        settings = self.settings
        geometry = _geometry(self.size, rnd.choice(settings.margins))
        for _ in range(_PAIR_TRIES):
            canvas = _Canvas(geometry, rnd)
            targets = self._targets(canvas, rnd)
            if targets is not None:
                break
        else:
            raise RuntimeError(f"no pair of target snakes fitted a {self.size} px image in {_PAIR_TRIES} tries")
        distractors = [self._distractor(canvas, rnd) for _ in range(self.num_distractors)]
        origin = rnd.randrange(2)
        terminal = origin if label else 1 - origin
        lines = tuple(self._polyline(snake, geometry) for snake in targets)
        # the origin marker sits on a tail, the terminal one on a far end
        markers = (lines[origin][0], lines[terminal][-1])
        contrast = settings.paddle_contrast * settings.snake_contrast
        painted = [(line, contrast) for line in lines]
        painted += [(self._polyline(snake, geometry), settings.snake_contrast) for snake in distractors if snake]
        return _Scene(self._render(painted, markers), label, lines, markers)

    def _targets(self, canvas: _Canvas, rnd: random.Random) -> tuple[list[_Paddle], list[_Paddle]] | None:
        """Two snakes of ``contour_length`` paddles whose tails are ``seed_distance`` px apart, or None.

        snakes2 grows the two in turns and redraws both at any dead end; here the first is drawn until one grows in
        full (from snakes2's seed: in the centre square, at least twice the seed distance from every edge), then
        the second from a tail ``seed_distance`` away."""
        geometry, distance, size = canvas.geometry, self.settings.seed_distance, self.size
        for _ in range(_SNAKE_TRIES):
            y, x = rnd.randrange(2 * distance, size - 2 * distance), rnd.randrange(2 * distance, size - 2 * distance)
            first = self._snake(canvas, geometry.position(y, x), rnd.randrange(360), self.contour_length)
            if first is not None:
                break
        else:
            return None
        for _ in range(_SNAKE_TRIES):
            dy, dx = geometry.dirs[rnd.randrange(360)]
            tail = geometry.position(round(y + distance * dy), round(x + distance * dx))
            second = self._snake(canvas, tail, rnd.randrange(360), self.contour_length)
            if second is not None:
                return first, second
        return None

    @staticmethod
    def _snake(canvas: _Canvas, tail: int | None, degree: int, length: int) -> list[_Paddle] | None:
        """A snake of ``length`` paddles grown from ``tail``, or None (leaving the canvas as it was)."""
        if tail is None or not canvas.fits(tail, degree):
            return None
        return canvas.grow(tail, degree, length)

    def _distractor(self, canvas: _Canvas, rnd: random.Random) -> list[_Paddle] | None:
        """A distractor snake where one fits within ``_DISTRACTOR_TRIES`` tries, else None."""
        for _ in range(_DISTRACTOR_TRIES):
            degree = rnd.randrange(360)
            snake = self._snake(canvas, canvas.free_start(degree, rnd), degree, self.distractor_length)
            if snake is not None:
                return snake
        return None

    @staticmethod
    def _polyline(snake: list[_Paddle], geometry: _Geometry) -> np.ndarray:
        """Start and end of every paddle in order, ``[2 * paddles, 2]`` (y, x) px."""
        return np.array([point for paddle in snake for point in geometry.segment(paddle)])

    def _render(self, painted: list[tuple[np.ndarray, float]], markers: tuple[np.ndarray, ...]) -> np.ndarray:
        """Paddles drawn at 2x and averaged down (snakes2's anti-aliasing), markers on top, the brightest pixel
        scaled to 255: uint8 ``[S, S]``."""
        size, settings = self.size, self.settings
        canvas = Image.new("F", (2 * size, 2 * size), 0.0)
        draw = ImageDraw.Draw(canvas)
        width = max(1, round(2 * settings.thickness))
        for line, contrast in painted:
            # pixel centre c of the image is at 2c + 0.5 in the 2x drawing; PIL takes (x, y)
            points = (2 * line[:, ::-1] + 0.5).tolist()
            for start, end in zip(points[0::2], points[1::2], strict=True):
                draw.line([tuple(start), tuple(end)], fill=contrast, width=width)
        image = np.asarray(canvas).reshape(size, 2, size, 2).mean(axis=(1, 3))
        disc = _marker(settings.marker_radius)
        half = disc.shape[0] // 2
        padded = np.pad(image, half)
        for y, x in np.rint(markers).astype(np.int64):
            region = padded[y : y + 2 * half + 1, x : x + 2 * half + 1]
            np.maximum(region, disc, out=region)
        image = padded[half:-half, half:-half]
        return np.rint(image * (255.0 / image.max())).astype(np.uint8)


class Pathfinder(Dataset):
    """Pathfinder images generated on the fly; label 1 when the two markers lie on one snake.

    Args:
        split: ``train``, ``val`` or ``test`` (different draws of the same distribution).
        resolution: 32, 64 or 128 (Path-X) px, each with LRA's settings (module docstring).
        difficulty: ``hard`` (contour length 14, LRA's task), ``intermediate`` (9) or ``easy`` (6).
        num_samples: length of the split; default LRA's 160,000 / 20,000 / 20,000. Sample ``i`` does not depend on it.
        seed: seed of the draws.
        as_tokens: samples as pixel tokens (dicts) for 1-D models, else ``(image [1, H, W], label)`` pairs.
        cache: read the images from a file under ``cache_dir() / "pathfinder"``, drawing (on every core) and
            saving those it lacks first; the same images as without it. Off: each one drawn when indexed.

    Attributes:
        vocab_size (256 grey levels), num_classes (2), class_names, max_length (``H * W``), image_size, in_chans.
    """

    num_classes = 2
    class_names = classes = ("disconnected", "connected")
    vocab_size = 256
    in_chans = 1
    mean = (0.0,)
    std = (1.0,)

    def __init__(
        self,
        split: str,
        *,
        resolution: int = 32,
        difficulty: str = "hard",
        num_samples: int | None = None,
        seed: int = 0,
        as_tokens: bool = True,
        cache: bool = False,
    ):
        if split not in _SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(_SPLITS)}")
        if resolution not in RESOLUTIONS or isinstance(resolution, bool):
            raise ValueError(f"resolution={resolution!r} must be one of {', '.join(map(str, RESOLUTIONS))}")
        if difficulty not in CONTOUR_LENGTHS:
            raise ValueError(f"difficulty={difficulty!r} must be one of {', '.join(CONTOUR_LENGTHS)}")
        self.split, self.resolution, self.difficulty = split, resolution, difficulty
        self.num_samples = check_int(
            "num_samples", _DEFAULT_NUM_SAMPLES[split] if num_samples is None else num_samples, 1
        )
        self.seed = check_int("seed", seed, 0)
        self.as_tokens = bool(as_tokens)
        self.image_size = resolution
        self.max_length = resolution * resolution
        self._split_id = _SPLITS.index(split)
        self._generator = _Generator(resolution, CONTOUR_LENGTHS[difficulty])
        # uint8 [>= num_samples, S, S]: a read-only memory map of the cache file (opened again in each process)
        self._images: np.ndarray | None = None
        self.cache_path = None
        if check_bool("cache", cache):
            name = f"v{_GENERATOR_VERSION}_{resolution}px_{difficulty}_seed{self.seed}_{split}.npy"
            self.cache_path = cache_dir() / "pathfinder" / name
            self._images = self._fill_cache()

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor] | tuple[torch.Tensor, int]:
        """Tokens: ``tokens`` int64 ``[H*W]`` (grey levels, row by row), ``mask`` bool ``[H*W]``, ``label`` int64
        ``[]``. Images: float32 ``[1, H, W]`` in [0, 1] and the label."""
        index = self._check_index(index)
        if self._images is None and self.cache_path is not None:
            self._images = np.load(self.cache_path, mmap_mode="r")
        image = self._scene(index).image if self._images is None else np.array(self._images[index])
        label = index % 2
        pixels = torch.from_numpy(image)
        if not self.as_tokens:
            return pixels.unsqueeze(0).to(torch.float32).div_(255.0), label
        tokens = pixels.reshape(-1).to(torch.int64)
        return {"tokens": tokens, "mask": torch.ones(len(tokens), dtype=torch.bool), "label": torch.tensor(label)}

    def __getstate__(self) -> dict:
        # a memory map travels as its path (a worker process maps the file again), not as a copy of every image
        state = self.__dict__.copy()
        if isinstance(state["_images"], np.memmap):
            state["_images"] = None
        return state

    def _check_index(self, index: int) -> int:
        index = operator.index(index)
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for Pathfinder {self.split!r} of {self.num_samples} samples")
        return index % self.num_samples

    def _fill_cache(self) -> np.ndarray:
        """The images of samples 0..num_samples-1 (at least) from the cache file, drawing and saving those it lacks
        first: a memory map of the file, or the images in memory when it cannot be written."""
        path = self.cache_path
        with cache_lock(path):
            cached = self._read_cache()
            have = 0 if cached is None else len(cached)
            if have >= self.num_samples:
                return cached
            images = self._draw(have, self.num_samples)
            if cached is not None:
                images = np.concatenate([cached, images])
            if write_atomic(path, lambda f: np.save(f, images)):
                return np.load(path, mmap_mode="r")
            self.cache_path = None
            return images

    def _read_cache(self) -> np.ndarray | None:
        """The cache file's images, or None without a readable one (a damaged file is drawn again, with a warning)."""
        path = self.cache_path
        if not path.is_file():
            return None
        try:
            images = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as err:
            _logger.warning("%s: unreadable Pathfinder cache (%s); drawing its images again", path, err)
            return None
        side = self.resolution
        if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (side, side):
            _logger.warning(
                "%s holds %s %s, not Pathfinder images; drawing them again", path, images.dtype, images.shape
            )
            return None
        return images

    def _draw(self, start: int, stop: int) -> np.ndarray:
        """Images of samples start..stop-1, uint8 ``[stop - start, S, S]``, on every core when there are many."""
        workers = min(len(os.sched_getaffinity(0)), -(-(stop - start) // _CHUNK))
        if stop - start < _PARALLEL_FROM or workers < 2 or multiprocessing.current_process().daemon:
            return _draw_images(self._arguments(start, stop))
        _logger.info(
            "drawing %d Pathfinder-%d %s images into %s on %d processes (once)",
            stop - start, self.resolution, self.split, self.cache_path, workers,
        )  # fmt: skip
        tasks = [self._arguments(low, min(low + _CHUNK, stop)) for low in range(start, stop, _CHUNK)]
        with ProcessPoolExecutor(workers) as pool:
            parts = list(tqdm(pool.map(_draw_images, tasks), total=len(tasks), desc="pathfinder cache", leave=False))
        return np.concatenate(parts)

    def _arguments(self, start: int, stop: int) -> tuple:
        return (self.split, self.resolution, self.difficulty, self.seed, start, stop)

    def _scene(self, index: int) -> _Scene:
        index = self._check_index(index)
        state = np.random.SeedSequence([self.seed, self._split_id, index]).generate_state(2, dtype=np.uint64)
        return self._generator.scene(random.Random(int(state[0]) << 64 | int(state[1])), label=index % 2)

    def _path_render(self, index: int, scale: int = 8) -> tuple[np.ndarray, tuple[int, int], tuple[int, int], int]:
        """The two target snakes of sample ``index`` before distractors and markers, for checking labels.

        Each snake is drawn ``scale`` times larger as one 1-px polyline through its paddles, gaps bridged, so that
        a snake is one connected component and two snakes are two. Returns the uint8 ``[S * scale, S * scale]``
        drawing (255 on a snake), the (row, col) of both markers in it, and the label.
        """
        scene = self._scene(index)
        side = self.resolution * scale
        drawing = Image.new("L", (side, side), 0)
        draw = ImageDraw.Draw(drawing)

        def fine(point: np.ndarray) -> tuple[int, int]:
            # pixel centres map to the centre of their scale x scale block
            return tuple(round(float(c + 0.5) * scale - 0.5) for c in point)

        for line in scene.targets:
            draw.line([fine(point)[::-1] for point in line], fill=255, width=1)
        return np.asarray(drawing), fine(scene.markers[0]), fine(scene.markers[1]), scene.label

    def __repr__(self) -> str:
        return (
            f"Pathfinder(split={self.split!r}, resolution={self.resolution}, difficulty={self.difficulty!r}, "
            f"num_samples={self.num_samples}, seed={self.seed}, as_tokens={self.as_tokens}, "
            f"cache={self.cache_path is not None})"
        )


def _draw_images(arguments: tuple) -> np.ndarray:
    """uint8 ``[stop - start, S, S]``: the images of samples start..stop-1 (a process pool's task)."""
    split, resolution, difficulty, seed, start, stop = arguments
    drawer = Pathfinder(split, resolution=resolution, difficulty=difficulty, num_samples=stop, seed=seed)
    side = resolution
    images = np.empty((stop - start, side, side), dtype=np.uint8)
    for row, index in enumerate(range(start, stop)):
        images[row] = drawer._scene(index).image
    return images


@dataclass(kw_only=True)
class PathfinderOptions:
    """``data.options`` of ``pathfinder`` and ``pathfinder_image``: LRA's Pathfinder-32, hard, by default."""

    resolution: Literal[32, 64, 128] = 32
    difficulty: Literal["easy", "intermediate", "hard"] = "hard"
    # images drawn once into the user cache (module docstring), then read from there; false: drawn when indexed
    cache: bool = True


@register_dataset("pathfinder", options=PathfinderOptions, kind="tokens", tasks=("classification",))
def build_pathfinder(options: PathfinderOptions, context: DataContext) -> Pathfinder:
    """LRA Pathfinder / Path-X as pixel tokens (1024 / 4096 / 16,384), connected or not (generated)."""
    return Pathfinder(
        context.split, resolution=options.resolution, difficulty=options.difficulty,
        num_samples=context.num_samples, seed=context.seed, as_tokens=True, cache=options.cache,
    )  # fmt: skip


@register_dataset("pathfinder_image", options=PathfinderOptions, kind="image", tasks=("classification",))
def build_pathfinder_image(options: PathfinderOptions, context: DataContext) -> Pathfinder:
    """LRA Pathfinder / Path-X as ``[1, H, W]`` images, connected or not (generated)."""
    if context.img_size is not None and options.resolution != context.img_size and not context.dynamic_img_size:
        raise ValueError(
            f"model.img_size ({context.img_size}) must equal data.options.resolution ({options.resolution}) "
            "unless model.dynamic_img_size is true"
        )
    return Pathfinder(
        context.split, resolution=options.resolution, difficulty=options.difficulty,
        num_samples=context.num_samples, seed=context.seed, as_tokens=False, cache=options.cache,
    )  # fmt: skip
