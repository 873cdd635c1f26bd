"""`train.distributed: fsdp` (zoo.train.distributed) against `ddp`, each on two CPU processes (gloo): sharded weights
and checkpoints, the same weights after a resume, evaluation of the result; one process; the errors. The four
two-process runs of tools/train.py are one torchrun launch (tests/train/fsdp_worker.py), so that torch, timm and zoo
are imported once rather than once per run."""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import free_port, hide_cuda, reset_accelerate, tiny_vit_recipe, with_sections, write_recipe
from safetensors.torch import load_file
from torch import nn

import zoo
from zoo._schema import RecipeError
from zoo.config import load_recipe
from zoo.evaluate import evaluate
from zoo.train.distributed import build_accelerator, is_sharded, shard_units
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]

# ViTDet's layout in miniature: 2-D windows of 2 x 2 patches on the 4 x 4 grid, softmax in block 1; drop path, so
# that the activation checkpointing of the fsdp runs must replay the random masks to match ddp; a conv stem, whose
# BatchNorm statistics every process updates from its own batch (process 0's are kept under both strategies).
TINY = tiny_vit_recipe(
    name="tiny_fsdp",
    seed=5,
    model={
        "stem": "conv",
        "depth": 2,
        "drop_path_rate": 0.1,
        "attention": {"name": "window2d", "options": {"window": 2}},
        "global_blocks": [1],
        "global_attention": {"name": "softmax"},
    },
    data={"train_samples": 32, "batch_size": 4},
    optim={"lr": 1e-3},
    # constant: the learning rate of a step does not depend on train.max_steps, which the resume raises
    schedule={"name": "constant"},
    # mixed precision `auto`: bf16 on a GPU that has it
    train={"log_every_steps": 1, "checkpoint_every_steps": 2, "mixed_precision": "auto"},
)


def recipe_file(folder: Path, **train) -> Path:
    return write_recipe(folder / "tiny_fsdp.yaml", with_sections(TINY, train=train))


def launch(recipe: Path, root: Path) -> tuple[str, str]:
    """tests/train/fsdp_worker.py on two CPU processes: its four runs of tools/train.py under `root`; the launch's
    stdout and stderr. The GPU is hidden from them: on a machine with one, each process would take cuda:<rank>
    (cuda:1 does not exist on one GPU)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        str(ROOT / "tests" / "train" / "fsdp_worker.py"), str(recipe), str(root),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, result.stderr


def by_run(text: str) -> dict[tuple[str, str], str]:
    """`text` cut at the worker's markers: `(strategy, "first" | "second")` -> what followed its marker, in order."""
    parts = re.split(r"^=== (\w+) (\w+) ===$", text, flags=re.MULTILINE)  # fsdp_worker.MARKER
    return {(strategy, part): run for strategy, part, run in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Each strategy trains 2 of the 4 steps of an epoch, stops (with a checkpoint), then resumes to step 4; fsdp
    with model.grad_checkpointing (its activation checkpointing). All four runs are tools/train.py's main() in one
    torchrun launch (tests/train/fsdp_worker.py), in order, in the same two processes: each process imports torch,
    timm and zoo once (about 11 s of CPU each) instead of once per run; about 25 s in all. Each run's output is what
    followed its marker, on stdout then on stderr."""
    root = tmp_path_factory.mktemp("fsdp")
    recipe = recipe_file(root)
    stdout, stderr = map(by_run, launch(recipe, root))
    order = [(strategy, part) for strategy in ("ddp", "fsdp") for part in ("first", "second")]
    assert list(stdout) == list(stderr) == order, (list(stdout), list(stderr))
    return {
        strategy: {
            "dir": root / strategy,
            **{part: stdout[strategy, part] + stderr[strategy, part] for part in ("first", "second")},
        }
        for strategy in ("ddp", "fsdp")
    }


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "last" / "model.safetensors"))


@pytest.mark.slow
def test_fsdp_checkpoints_hold_the_shards_and_the_whole_weights(runs):
    checkpoint = runs["fsdp"]["dir"] / "checkpoints" / "last"
    for sharded in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (checkpoint / sharded).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    whole = weights(runs["fsdp"]["dir"])
    assert whole["blocks.0.attn.qkv.weight"].shape == (96, 32)
    assert not (runs["ddp"]["dir"] / "checkpoints" / "last" / "pytorch_model_fsdp_0").exists()


@pytest.mark.slow
def test_fsdp_resumes_and_ends_with_the_weights_of_ddp(runs):
    for strategy in ("ddp", "fsdp"):
        assert "resumed from" in runs[strategy]["second"] and "at step 2" in runs[strategy]["second"]
        summary = json.loads((runs[strategy]["dir"] / "train_summary.json").read_text())
        assert summary["steps"] == 4 and summary["num_processes"] == 2 and summary["replicas_identical"]
    ddp, fsdp = weights(runs["ddp"]["dir"]), weights(runs["fsdp"]["dir"])
    assert ddp.keys() == fsdp.keys()
    assert "patch_embed.proj.1.running_mean" in ddp  # buffers are compared too
    initial = zoo.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, in_chans=1
    ).state_dict()
    assert not torch.allclose(ddp["blocks.1.attn.qkv.weight"], initial["blocks.1.attn.qkv.weight"])
    # atol: 1% of one step at lr 1e-3; Adam's step for a near-zero gradient magnifies the rounding by which FSDP's
    # reduce-scatter and DDP's all-reduce differ (1.4e-6 seen in a qkv bias)
    for key in ddp:
        torch.testing.assert_close(fsdp[key], ddp[key], rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.slow
def test_an_fsdp_run_evaluates_as_the_ddp_run(runs, monkeypatch, request):
    # on the CPU, as the runs trained: in fp32 the two sets of weights (1e-5 apart) give losses within 1e-5; a GPU's
    # bf16 (mixed precision auto) would round them apart
    hide_cuda(monkeypatch, request)
    results = {s: evaluate(runs[s]["dir"], checkpoint="last", split="test")["metrics"] for s in ("ddp", "fsdp")}
    assert results["fsdp"]["samples"] == 16
    assert results["fsdp"]["top1"] == results["ddp"]["top1"]
    assert results["fsdp"]["loss"] == pytest.approx(results["ddp"]["loss"], rel=1e-5)


def test_one_process_fsdp_trains_the_whole_model(tmp_path, caplog):
    reset_accelerate()
    recipe = load_recipe(recipe_file(tmp_path, distributed="fsdp", max_steps=2))
    with caplog.at_level(logging.INFO, logger="zoo.train.distributed"):
        trainer = Trainer(recipe, tmp_path / "run")
    assert "nothing to shard over" in caplog.text
    assert not is_sharded(trainer.accelerator)
    assert trainer.fit()["step"] == 2
    assert (tmp_path / "run" / "checkpoints" / "last" / "model.safetensors").is_file()


def test_each_block_is_one_unit():
    model = zoo.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3, attention="window2d",
        attention_options={"window": 2}, global_blocks=[1], global_attention="softmax",
    )  # fmt: skip
    assert shard_units(model) == ["Block"]
    assert shard_units(
        zoo.create_model("vit_tiny_patch16_224", img_size=32, depth=2, block="gau", attention="gau")
    ) == ["GAUBlock"]


def test_models_fsdp_cannot_shard_are_refused():
    reversible = zoo.create_model("vit_tiny_patch16_224", img_size=32, depth=2, reversible=True)
    with pytest.raises(ValueError, match="cannot shard reversible blocks.*model.reversible"):
        shard_units(reversible)
    with pytest.raises(ValueError, match="Linear has no `blocks`"):
        shard_units(nn.Linear(2, 2))


def test_an_unknown_strategy_names_the_choices(tmp_path):
    with pytest.raises(RecipeError, match="train.distributed: expected one of 'ddp', 'fsdp', got 'fsdpp'"):
        load_recipe(recipe_file(tmp_path), ["train.distributed=fsdpp"])
    with pytest.raises(ValueError, match=r"unknown train.distributed 'fdsp' \(did you mean 'fsdp'\?\)"):
        build_accelerator("fdsp")
