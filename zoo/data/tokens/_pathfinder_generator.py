"""The Pathfinder image generator behind ``zoo.data.tokens.pathfinder`` (Linsley et al.'s ``snakes2``, at LRA's
settings).

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

Differences from snakes2, for exact labels and speed (fast enough to draw the images on every core as a run needs
them, rather than ship them):
(1) geometry is continuous (paddles start on a half-pixel grid, whole-degree orientations) and a paddle's centre
line must stay ``max(thickness, 1) + 2 * margin`` px from every other paddle but its own predecessor; snakes2 compares
anti-aliased masks on the pixel grid and skips the other target snake's newest paddle, so its two target snakes
can touch. Here distinct snakes never touch, even through the gaps, which the tests check by flood fill.
(2) A far end is drawn among all candidates that fit (snakes2 gives up after 3 draws).
(3) The first target snake is redrawn until one grows in full, then the second; snakes2 grows both in turns and
redraws the pair at any dead end. (4) Labels alternate with the index (exactly balanced) instead of being drawn.
"""

from __future__ import annotations

import bisect
import math
import random
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["CONTOUR_LENGTHS", "GENERATOR_VERSION", "RESOLUTIONS", "Generator", "Scene"]


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
GENERATOR_VERSION = 1


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
            j = _draw_index(weights, self.random() * total)
        self._mark(snake[-1])
        snake.append((pivot + geometry.to_start[heading][j], geometry.candidates[heading][j]))
        return True


def _draw_index(weights: list[float], target: float) -> int:
    """The index whose span of the running sum of ``weights`` holds ``target``."""
    for j, weight in enumerate(weights):
        if target < weight:
            return j
        target -= weight
    # rounding left the target past the end: the last candidate still in the draw
    return max(k for k, weight in enumerate(weights) if weight > 0)


class Scene(NamedTuple):
    image: np.ndarray  # uint8 [S, S]
    label: int
    targets: tuple[np.ndarray, np.ndarray]  # polyline of each target snake, [2 * paddles, 2]
    markers: tuple[np.ndarray, np.ndarray]  # (y, x) of the origin and the terminal marker


class Generator:
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

    def scene(self, rnd: random.Random, label: int) -> Scene:
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
        return Scene(self._render(painted, markers), label, lines, markers)

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
