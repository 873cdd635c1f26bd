"""Ctrl-C and SIGTERM during training (zoo.train._interrupt): the first signal finishes the step, saves
checkpoints/last and exits non-zero with the command that resumes; the resumed run ends with the bytes of a run trained
straight through; a second signal stops at once."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import hide_cuda, reset_accelerate, tiny_vit_recipe, write_recipe
from safetensors.torch import load_file

from zoo.config import load_recipe
from zoo.train._interrupt import StopSignals
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]

# tools/train.py in a fresh process whose every batch after the 5th waits 0.2 s, the 6th first writing READY (argv[1]):
# the test's signal then lands mid-run, in the 6th step or soon after, whatever the machine's speed
SLOW_TRAIN = """
import runpy, sys, time
from pathlib import Path
from zoo.train.loop import Trainer
ready, original, seen = Path(sys.argv.pop(1)), Trainer.train_batch, [0]
def train_batch(self, batch):
    seen[0] += 1
    if seen[0] > 5:
        ready.touch()
        time.sleep(0.2)
    return original(self, batch)
Trainer.train_batch = train_batch
sys.argv[0] = "tools/train.py"
runpy.run_path("tools/train.py", run_name="__main__")
"""


def recipe_path(folder: Path) -> Path:
    # one thread in the test and in its subprocess: the same sums in the same order, so the same bytes; drop path,
    # which draws from torch's global generator every step
    return write_recipe(
        folder / "tiny.yaml",
        tiny_vit_recipe(
            model={"drop_path_rate": 0.1, "depth": 2},
            data={"train_samples": 64},
            train={"epochs": 2, "threads": 1, "mixed_precision": "no"},
        ),
    )


@pytest.mark.slow
def test_the_first_ctrl_c_saves_and_resume_ends_where_a_straight_run_ends(tmp_path, monkeypatch, request):
    hide_cuda(monkeypatch, request)
    recipe = recipe_path(tmp_path)
    ready, run_dir = tmp_path / "ready", tmp_path / "interrupted"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", SLOW_TRAIN, str(ready), str(recipe), "--output", str(run_dir)]
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        for _ in range(1200):
            if ready.exists() or p.poll() is not None:
                break
            try:
                p.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        assert ready.exists(), p.communicate()[1][-3000:]
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=300)
    assert p.returncode == 130, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    # 8 steps an epoch: stopped in the first epoch, after the step the signal landed in
    step = int(last.split("stopped after step ")[1].split()[0])
    assert 6 <= step < 16, last
    assert last.startswith("SIGINT: stopped after step") and f"saved in {run_dir}/checkpoints/last" in last
    assert last.endswith(f"--output {run_dir} --resume"), last
    assert "finishing this step, then saving checkpoints/last" in stderr

    reset_accelerate()
    Trainer(load_recipe(recipe), run_dir, resume=True).fit()
    reset_accelerate()
    Trainer(load_recipe(recipe), tmp_path / "straight").fit()
    resumed, straight = (
        load_file(str(folder / "checkpoints" / "last" / "model.safetensors"))
        for folder in (run_dir, tmp_path / "straight")
    )
    assert resumed.keys() == straight.keys()
    assert [key for key in straight if not torch.equal(resumed[key], straight[key])] == []
    # the two epochs' evaluations, none at the interruption
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_second_signal_stops_at_once_and_the_handlers_are_put_back():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM  # recorded: the step goes on
        with pytest.raises(KeyboardInterrupt, match="SIGTERM again: stopped at once, nothing saved"):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
