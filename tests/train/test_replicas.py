"""Every shipped recipe's model keeps identical replicas under 2-process `ddp` and `fsdp`, buffers included (the conv
stem's BatchNorm statistics, Performer's features, VQ's codebooks, the seeds): tests/replica_worker.py trains each
recipe at CPU size for a few steps under both strategies, all in one torchrun launch, and compares the processes'
states entry by entry."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from replica_worker import STEPS

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = ("ddp", "fsdp")


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    """The worker's records: one per model (recipes that shrink to the same model share one) and strategy."""
    out = tmp_path_factory.mktemp("replicas") / "records.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(ROOT / "tests" / "replica_worker.py"), ",".join(STRATEGIES), str(out),
    ]  # fmt: skip
    # two CPU processes (gloo) on a machine with a GPU too: each would otherwise take cuda:<rank>
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env, check=False)
    # the worker prints a JSON record per model as it finishes: the last one says where a crash came
    finished = [line for line in result.stderr.splitlines() if line.startswith('{"recipes"')]
    assert result.returncode == 0, f"after {finished[-1] if finished else 'no model'}:\n{result.stderr[-3000:]}"
    return json.loads(out.read_text())


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
