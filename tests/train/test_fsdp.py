"""`train.distributed: fsdp` (zoo.train.distributed) against `ddp`, each on two CPU processes (gloo): sharded weights
and checkpoints, the same weights after a resume, evaluation of the result; one process; the errors. The four
two-process runs of tools/train.py are the `train` runs of the suite's one torchrun launch
(tests/distributed_worker.py), so that torch, timm and zoo are imported once rather than once per run."""

import json
import logging
from pathlib import Path

import pytest
import torch
from distributed_worker import TRAIN_STRATEGIES
from helpers import fsdp_recipe_file, hide_cuda, reset_accelerate
from safetensors.torch import load_file
from torch import nn

import zoo
from zoo._schema import RecipeError
from zoo.config import load_recipe
from zoo.evaluate import evaluate
from zoo.train.distributed import build_accelerator, is_sharded, shard_units
from zoo.train.loop import Trainer

STRATEGIES = tuple(strategy for strategy, _ in TRAIN_STRATEGIES)


@pytest.fixture(scope="module")
def runs(distributed_runs) -> dict:
    """Each strategy trains 2 of the 4 steps of an epoch, stops (with a checkpoint), then resumes to step 4; fsdp
    with model.grad_checkpointing (its activation checkpointing). All four runs are tools/train.py's main() on
    helpers.fsdp_recipe_file's recipe, in order, in the two processes of the suite's one torchrun launch (the `train`
    runs of tests/distributed_worker.py), the last of its runs: torch, timm and zoo are imported once rather than once
    per run, and the launch ends with the last run's `end_processes()`. Each run's output is what followed its
    marker, on stdout then on stderr."""
    distributed_runs.check("train")
    stdout, stderr = (
        {name: text for name, text in distributed_runs.runs(stream).items() if name.startswith("train ")}
        for stream in ("stdout", "stderr")
    )
    parts = ("first", "second", "straight")
    order = [f"train {strategy} {part}" for strategy in STRATEGIES for part in parts]
    assert list(stdout) == list(stderr) == order, (list(stdout), list(stderr))
    return {
        strategy: {
            "dir": distributed_runs.folder / "train" / strategy,
            "straight_dir": distributed_runs.folder / "train" / f"{strategy}_straight",
            **{part: distributed_runs.output(f"train {strategy} {part}") for part in parts},
        }
        for strategy in STRATEGIES
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
    # atol: a hundredth of one step at lr 1e-3; Adam's step for a near-zero gradient magnifies the rounding by which
    # FSDP's reduce-scatter and DDP's all-reduce differ
    for key in ddp:
        torch.testing.assert_close(fsdp[key], ddp[key], rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_resumed_run_ends_exactly_where_one_trained_straight_ends(runs, strategy):
    # 2 steps, stop, evaluate, resume to 4 against 4 steps in one go: the same bytes. Drop path draws from torch's
    # global generator on every step, so a loader or an evaluation that drew from it too shifts every later mask.
    resumed, straight = (runs[strategy][key] / "checkpoints" / "last" for key in ("dir", "straight_dir"))
    a, b = weights(runs[strategy]["dir"]), weights(runs[strategy]["straight_dir"])
    assert a.keys() == b.keys()
    assert [key for key in a if not torch.equal(a[key], b[key])] == []
    # the optimizer's state (Adam's moments and step; fsdp: each process's shard) and every process's random states
    files = ["optimizer.bin"] if strategy == "ddp" else [f"optimizer_0/__{rank}_0.distcp" for rank in (0, 1)]
    for name in [*files, "random_states_0.pkl", "random_states_1.pkl"]:
        assert (resumed / name).read_bytes() == (straight / name).read_bytes(), name
    # the loader's place: the same step, epoch and batch (the resumed run evaluated once more: evals_since_best)
    progress = [{k: json.loads((c / "meta.json").read_text())[k] for k in ("step", "epoch", "batch_in_epoch")}
                for c in (resumed, straight)]  # fmt: skip
    assert progress[0] == progress[1] == {"step": 4, "epoch": 1, "batch_in_epoch": 0}


@pytest.mark.slow
def test_an_fsdp_run_evaluates_as_the_ddp_run(runs, monkeypatch, request):
    # on the CPU, as the runs trained: in fp32 the two sets of weights, equal up to the order of their sums, give
    # losses within 1e-5; a GPU's bf16 (mixed precision auto) would round them apart
    hide_cuda(monkeypatch, request)
    results = {s: evaluate(runs[s]["dir"], checkpoint="last", split="test")["metrics"] for s in ("ddp", "fsdp")}
    assert results["fsdp"]["samples"] == 16
    assert results["fsdp"]["top1"] == results["ddp"]["top1"]
    assert results["fsdp"]["loss"] == pytest.approx(results["ddp"]["loss"], rel=1e-5)


def test_one_process_fsdp_trains_the_whole_model(tmp_path, caplog):
    reset_accelerate()
    recipe = load_recipe(fsdp_recipe_file(tmp_path, distributed="fsdp", max_steps=2))
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
        load_recipe(fsdp_recipe_file(tmp_path), ["train.distributed=fsdpp"])
    with pytest.raises(ValueError, match=r"unknown train.distributed 'fdsp' \(did you mean 'fsdp'\?\)"):
        build_accelerator("fdsp")
