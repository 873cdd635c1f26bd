"""Pathfinder and Path-X (Long Range Arena): are the two markers joined by one dashed contour? Generated on the fly.

Linsley et al., "Learning long-range spatial dependencies with horizontal gated recurrent units", NeurIPS 2018,
https://arxiv.org/abs/1805.08315 (the ``snakes2`` generator of github.com/drewlinsley/pathfinder), at the sizes of
Tay et al., "Long Range Arena", ICLR 2021, https://arxiv.org/abs/2011.04006 (Pathfinder 32 and 64, Path-X 128).

An image holds two target snakes, each a chain of ``contour_length`` short line segments ("paddles") separated by
gaps, whose tails start ``seed_distance`` px apart, plus short distractor snakes. One marker sits on the tail of a
target snake; the other on the far end of the same snake (label 1, "connected") or of the other one (label 0).
How the snakes are drawn, LRA's settings per resolution and the differences from snakes2 (exact labels, fast
enough to draw on the fly): ``zoo/data/tokens/_pathfinder_generator.py``.

Sample ``i`` depends only on (seed, split, i) and the options. The datasets built from recipes cache the images
of a split on disk (``data.options.cache``, on by default): drawn once, on every core, into
``cache_dir() / "pathfinder"`` (``$ZOO_CACHE``, else ``~/.cache/zoo``; 1 KiB per image at 32 px, 16 KiB at
Path-X), then read from that file by every later epoch, run and process.

``pathfinder`` gives dicts (``tokens`` int64 ``[H*W]``, the grey levels 0-255 row by row; ``mask`` bool, all True;
``label`` int64 ``[]``) for 1-D models; ``pathfinder_image`` gives ``(image float32 [1, H, W] in [0, 1], label)``
pairs for ViTs.
"""

from __future__ import annotations

import logging
import multiprocessing
import operator
import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..._validate import check_bool, check_int
from .._cache import cache_dir, cache_lock, write_atomic
from .._registry import DataContext, register_dataset
from ._pathfinder_generator import CONTOUR_LENGTHS, GENERATOR_VERSION, RESOLUTIONS, Generator, Scene

__all__ = ["CONTOUR_LENGTHS", "RESOLUTIONS", "Pathfinder", "PathfinderOptions"]

_SPLITS = ("train", "val", "test")
# 200k images per difficulty, split 80/10/10 as LRA's loaders do
_DEFAULT_NUM_SAMPLES = {"train": 160_000, "val": 20_000, "test": 20_000}
_CHUNK = 512  # images per task when the cache is filled in parallel
_PARALLEL_FROM = 2 * _CHUNK  # fewer missing images are drawn in this process

_logger = logging.getLogger(__name__)


class Pathfinder(Dataset):
    """Pathfinder images generated on the fly; label 1 when the two markers lie on one snake.

    Args:
        split: ``train``, ``val`` or ``test`` (different draws of the same distribution).
        resolution: 32, 64 or 128 (Path-X) px, each with LRA's settings (``_pathfinder_generator``).
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
        self._generator = Generator(resolution, CONTOUR_LENGTHS[difficulty])
        # uint8 [>= num_samples, S, S]: a read-only memory map of the cache file (opened again in each process)
        self._images: np.ndarray | None = None
        self.cache_path = None
        if check_bool("cache", cache):
            name = f"v{GENERATOR_VERSION}_{resolution}px_{difficulty}_seed{self.seed}_{split}.npy"
            self.cache_path = cache_dir() / "pathfinder" / name
            self._images = self._fill_cache()

    def __len__(self) -> int:
        return self.num_samples

    def sample_label(self, index: int) -> int:
        """Image ``index``'s label without drawing it (the tasks' majority-class baseline reads every one)."""
        return self._check_index(index) % 2

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

    def _scene(self, index: int) -> Scene:
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
