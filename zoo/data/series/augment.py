"""Training-time augmentation of series for classification: window slicing, amplitude scaling and jitter.

Window slicing (Le Guennec, Malinowski and Tavenard 2016, "Data augmentation for time series classification using
convolutional neural networks") trains on a random contiguous part of each series and evaluates on whole ones;
scaling multiplies each channel by a random factor and jitter adds Gaussian noise (Um et al. 2017, "Data
augmentation of wearable sensor data", both measured on classification there). Each applies to the training split
only, after any ``znorm``, so that their sizes are in units of the series' own spread.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from .._streams import WorkerStream

__all__ = ["AugmentOptions", "SeriesAugment", "series_augment"]


@dataclass(kw_only=True)
class AugmentOptions:
    """The augmentation options every series classification set takes (``data.options``); training split only."""

    # window slicing: train on a random contiguous fraction of each series' steps (1: the whole series)
    crop: float = field(default=1.0, metadata={"min": 0, "max": 1, "min_exclusive": True})
    # amplitude scaling: each channel times a factor drawn from N(1, scale^2) (0: off)
    scale: float = field(default=0.0, metadata={"min": 0})
    # jitter: Gaussian noise of this standard deviation, in units of the channel's own std (0: off)
    jitter: float = field(default=0.0, metadata={"min": 0})


class SeriesAugment:
    """``(values [N, C], observed [N, C]) -> (values [N', C], observed [N', C])`` with N' = ceil(crop N), from a
    seeded stream (``WorkerStream``)."""

    def __init__(self, options: AugmentOptions, *, seed: int = 0):
        self.crop, self.scale, self.jitter = options.crop, options.scale, options.jitter
        self._generator = WorkerStream(seed)

    def __call__(self, values: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rng = self._generator()
        steps, channels = values.shape
        if self.crop < 1.0 and steps > 1:
            kept = max(1, math.ceil(self.crop * steps))
            start = int(rng.integers(0, steps - kept + 1))
            values, observed = values[start : start + kept], observed[start : start + kept]
        if self.scale > 0:
            values = values * rng.normal(1.0, self.scale, size=(1, channels)).astype(values.dtype)
        if self.jitter > 0:
            spread = np.nanstd(np.where(observed, values, np.nan), axis=0, keepdims=True)
            spread = np.where(np.isfinite(spread) & (spread > 0), spread, 1.0)
            values = values + rng.normal(0.0, self.jitter, size=values.shape).astype(values.dtype) * spread
        return values, observed


def series_augment(options: AugmentOptions, is_training: bool, seed: int) -> SeriesAugment | None:
    """The augmentation of a training split whose options ask for any, else None."""
    wanted = options.crop < 1.0 or options.scale > 0 or options.jitter > 0
    return SeriesAugment(options, seed=seed) if is_training and wanted else None
