"""How many intra-op threads a training, evaluation or prediction process gives torch: `set_threads`, called first.

torch starts one intra-op thread per core it sees, whatever else runs: under torchrun every process does, the data
loader's worker processes come on top, and on a machine that another job keeps busy the threads spin waiting for each
other (a tiny recipe stepped 20 times slower on 2 shared cores than with one thread). The policy, in order:

1. `train.threads` (a recipe key, per process) when the recipe sets it;
2. `OMP_NUM_THREADS` when the environment sets it (the suite's `OMP_NUM_THREADS=1`, a cluster's job script);
3. otherwise the cores this process may run on (`os.sched_getaffinity`: a container's or `taskset`'s limit), divided
   among the processes of this machine (torchrun's `LOCAL_WORLD_SIZE`), less one core per data-loader worker
   (`data.num_workers`; torch gives each worker one thread), and never under one.

The choice and why is one line (`ThreadPolicy.line`), which a run prints among its first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

__all__ = ["ThreadPolicy", "available_cores", "choose_threads", "set_run_threads", "set_threads"]


@dataclass(frozen=True)
class ThreadPolicy:
    """`threads` intra-op threads, chosen because of `source` (`train.threads`, `OMP_NUM_THREADS` or `cores`),
    with the numbers behind a choice from the cores."""

    threads: int
    source: str
    cores: int
    processes: int
    workers: int

    @property
    def line(self) -> str:
        """One line for the console and train.log."""
        if self.source != "cores":
            return f"threads: {self.threads} intra-op ({self.source}={self.threads})"
        share = f"{self.cores} cores" + (f" / {self.processes} processes" if self.processes > 1 else "")
        workers = f" - {self.workers} loader worker{'s' * (self.workers != 1)}" if self.workers else ""
        return (
            f"threads: {self.threads} intra-op ({share}{workers}; train.threads or OMP_NUM_THREADS sets another number)"
        )


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _positive(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={text!r}: expected a whole number of threads, 1 or more")
    return value


def choose_threads(requested: int | None = None, workers: int = 0) -> ThreadPolicy:
    """The policy of the module docstring for a process whose recipe asks for `requested` threads (None: not set) and
    whose loaders run `workers` worker processes; reads the environment, sets nothing."""
    cores = available_cores()
    processes = _positive("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1") or "1")
    if requested is not None:
        return ThreadPolicy(_positive("train.threads", str(requested)), "train.threads", cores, processes, workers)
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env:
        return ThreadPolicy(_positive("OMP_NUM_THREADS", env), "OMP_NUM_THREADS", cores, processes, workers)
    return ThreadPolicy(max(1, cores // processes - workers), "cores", cores, processes, workers)


def set_threads(requested: int | None = None, workers: int = 0) -> ThreadPolicy:
    """Choose (`choose_threads`) and give torch that many intra-op threads; returns the policy (its `line` says it)."""
    policy = choose_threads(requested, workers)
    torch.set_num_threads(policy.threads)
    return policy


def set_run_threads(run: str | Path) -> ThreadPolicy:
    """`set_threads` for a process that evaluates or predicts with a trained run: its recipe's `train.threads` and
    `data.num_workers` where `run` holds a `recipe.yaml` that says them, else the defaults."""
    path = Path(run) / "recipe.yaml"
    try:
        tree = yaml.safe_load(path.read_text()) if path.is_file() else {}
    except (OSError, yaml.YAMLError):
        tree = {}  # the run's own loading names what is wrong with it
    tree = tree if isinstance(tree, dict) else {}
    train, data = (tree.get(key) if isinstance(tree.get(key), dict) else {} for key in ("train", "data"))
    workers = data.get("num_workers", 0)
    return set_threads(train.get("threads"), workers if isinstance(workers, int) and workers >= 0 else 0)
