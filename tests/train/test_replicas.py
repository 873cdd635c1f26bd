"""Every shipped recipe's model keeps identical replicas under 2-process `ddp` and `fsdp`, buffers included (the conv
stem's BatchNorm statistics, Performer's features, VQ's codebooks, the seeds): tests/replica_worker.py trains each
recipe at CPU size for a few steps under both strategies, in the suite's one torchrun launch (the `replicas` run of
tests/distributed_worker.py), and compares the processes' states entry by entry."""

import json
import warnings
from pathlib import Path

import pytest
from replica_worker import STEPS, STRATEGIES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def records(distributed_runs) -> list[dict]:
    """The worker's records: one per model (recipes that shrink to the same model share one) and strategy."""
    # the worker prints a JSON record per model as it finishes: the last one says where a crash came
    printed = distributed_runs.output("replicas").splitlines()
    finished = [line for line in printed if line.startswith('{"recipes"')]
    distributed_runs.check("replicas", f", after {finished[-1] if finished else 'no model'}")
    return json.loads((distributed_runs.folder / "replicas.json").read_text())


@pytest.mark.slow
def test_every_shipped_recipe_runs_under_both_strategies(records):
    shipped = sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml"))
    for strategy in STRATEGIES:
        covered = sorted(name for record in records if record["strategy"] == strategy for name in record["recipes"])
        assert covered == shipped, strategy
    skipped = [record for record in records if record["status"] == "skipped"]
    for record in skipped:
        warnings.warn(f"{record['recipes']} under {record['strategy']} not run: {record['reason']}", stacklevel=1)


@pytest.mark.slow
def test_the_replicas_are_identical_after_training(records):
    failed = [f"{r['recipes']} {r['strategy']}: {r['error']}" for r in records if r["status"] == "failed"]
    assert not failed, "\n".join(failed)
    for record in records:
        if record["status"] == "ok":
            assert record["steps"] == STEPS, record
            assert record["differ"] == [], record


@pytest.mark.slow
def test_buffers_are_compared(records):
    """The buffers a process updates or draws on its own are among the compared entries."""
    buffers = {
        (name, record["strategy"]): set(record["buffers"])
        for record in records
        if record["status"] == "ok"
        for name in record["recipes"]
    }
    for strategy in STRATEGIES:
        assert "patch_embed.proj.1.running_mean" in buffers["quickstart", strategy]
        assert {"blocks.0.attn.random_features", "blocks.0.attn.seed"} <= buffers["quickstart", strategy]
        assert {"blocks.0.attn.codebook", "blocks.0.attn.ema_count"} <= buffers["vit_vq_1024", strategy]
