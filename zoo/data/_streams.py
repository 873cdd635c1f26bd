"""A seeded stream of random numbers for training-time augmentation, reproducible given the seed and DataLoader's
worker seeds."""

import numpy as np
import torch

__all__ = ["WorkerStream"]


class WorkerStream:
    """A numpy generator seeded by ``seed`` in the main process and by ``(seed, worker seed)`` in each DataLoader
    worker, so workers draw differently, each epoch anew (DataLoader reseeds its workers from torch's seed), and a
    run is reproducible given torch's seed."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self._rng, self._worker_seed = None, None

    def __call__(self) -> np.random.Generator:
        info = torch.utils.data.get_worker_info()
        worker_seed = None if info is None else info.seed
        if self._rng is None or worker_seed != self._worker_seed:
            entropy = [self.seed] if worker_seed is None else [self.seed, worker_seed]
            self._rng, self._worker_seed = np.random.default_rng(entropy), worker_seed
        return self._rng
