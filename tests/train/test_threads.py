"""The thread policy (zoo.train.threads): train.threads, else OMP_NUM_THREADS, else this process's share of the cores
less the loader's workers; the line a run prints; a bad value is a one-line error naming it."""

import os

import pytest
import torch

from zoo.train import threads
from zoo.train.threads import choose_threads, set_run_threads, set_threads


@pytest.fixture
def machine(monkeypatch):
    """A machine of 8 cores this process may use, with no thread setting in the environment."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    for name in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("processes", "workers", "expected"),
    [(None, 0, 8), (None, 2, 6), ("2", 1, 3), ("4", 2, 1), ("8", 4, 1)],
)
def test_the_share_of_the_cores_less_the_workers_never_under_one(machine, processes, workers, expected):
    if processes:
        machine.setenv("LOCAL_WORLD_SIZE", processes)
    policy = choose_threads(None, workers)
    assert (policy.threads, policy.source) == (expected, "cores")
    share = "8 cores" + (f" / {processes} processes" if processes else "")
    assert policy.line.startswith(f"threads: {expected} intra-op ({share}")


def test_the_recipe_key_wins_over_the_environment_which_wins_over_the_cores(machine):
    machine.setenv("OMP_NUM_THREADS", "3")
    assert choose_threads(None, 2).line == "threads: 3 intra-op (OMP_NUM_THREADS=3)"
    assert choose_threads(5, 2).line == "threads: 5 intra-op (train.threads=5)"


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_environment_value_is_named(machine, value):
    machine.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(ValueError, match=f"OMP_NUM_THREADS='{value}': expected a whole number of threads, 1 or more"):
        choose_threads()


def test_set_threads_gives_torch_that_many_and_a_run_reads_its_recipe(machine, tmp_path):
    before = torch.get_num_threads()
    try:
        assert set_threads(2).threads == 2 and torch.get_num_threads() == 2
        (tmp_path / "recipe.yaml").write_text("train:\n  threads: 3\ndata:\n  num_workers: 1\n")
        assert set_run_threads(tmp_path).line == "threads: 3 intra-op (train.threads=3)"
        assert torch.get_num_threads() == 3
        (tmp_path / "recipe.yaml").write_text("data:\n  num_workers: 3\n")
        assert set_run_threads(tmp_path).threads == 5  # 8 cores less 3 workers
    finally:
        torch.set_num_threads(before)


def test_without_an_affinity_mask_the_cpu_count_is_used(machine):
    machine.delattr(os, "sched_getaffinity")
    machine.setattr(os, "cpu_count", lambda: 6)
    assert threads.available_cores() == 6
