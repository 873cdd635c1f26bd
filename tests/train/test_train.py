"""End to end: train, crash and resume, evaluate, and the command-line errors (two CPU processes: test_fsdp and
test_replicas)."""

import json
import logging
import runpy
import sys
from pathlib import Path

import pytest
import torch
from helpers import hide_cuda, reset_accelerate, run_tool_here, tiny_vit_recipe, with_sections, write_recipe
from safetensors.torch import load_file

import zoo
from zoo.config import load_recipe
from zoo.evaluate import evaluate
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]

# Performer's features redrawn every 2 steps; mixed precision `auto` (bf16 on a GPU that has it)
TINY_RECIPE = tiny_vit_recipe(
    model={"attention": {"name": "performer", "options": {"nb_features": 16, "redraw_interval": 2}}},
    optim={"lr": 1e-3},
    schedule={"warmup_steps": 2},
    train={"epochs": 2, "log_every_steps": 1, "mixed_precision": "auto"},
)


def recipe_file(tmp_path: Path, **overrides) -> Path:
    return write_recipe(tmp_path / "tiny.yaml", with_sections(TINY_RECIPE, **overrides))


def fit(recipe_path: Path, run_dir: Path, *, resume: bool = False) -> Trainer:
    reset_accelerate()
    trainer = Trainer(load_recipe(recipe_path), run_dir, resume=resume)
    trainer.fit()
    return trainer


def test_train_writes_metrics_checkpoints_and_evaluates(tmp_path):
    run_dir = tmp_path / "run"
    fit(recipe_file(tmp_path), run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    assert records[-1]["step"] == 12
    assert {"train_loss", "val_top1", "val_top5", "val_f1", "val_loss", "samples_per_s", "lr"} <= set(records[0])
    for which in ("last", "best"):
        assert (run_dir / "checkpoints" / which / "model.safetensors").is_file()
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    assert load_recipe(run_dir / "recipe.yaml") == load_recipe(recipe_file(tmp_path))
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == 12 and summary["replicas_identical"]

    result = evaluate(run_dir, checkpoint="last", split="test")
    assert result["metrics"]["samples"] == 16
    assert 0.0 <= result["metrics"]["top1"] <= 1.0
    assert torch.tensor(result["metrics"]["confusion"]).sum() == 16
    assert Path(result["confusion_png"]).is_file()


def test_train_then_test_in_one_process_writes_what_tools_eval_writes(tmp_path, monkeypatch, capsys, caplog, request):
    # on the CPU: the metrics of two evaluations are compared exactly, which a GPU's kernels need not repeat bit for bit
    hide_cuda(monkeypatch, request)
    train_main = runpy.run_path(str(ROOT / "tools" / "train.py"))["main"]
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["train.py", str(recipe_file(tmp_path)), "--output", str(run_dir), "--test"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    caplog.set_level(logging.INFO)  # as run_cli sets it: the log's INFO records reach train.log
    reset_accelerate()
    train_main()
    written = json.loads((run_dir / "eval.json").read_text())
    assert f"test: loss={written['metrics']['loss']:.4f}" in capsys.readouterr().out
    # the run's first lines say where and how it runs, and which habits are on
    log = [line.split(": ", 1)[1] for line in (run_dir / "train.log").read_text().splitlines()]
    first = log.index(next(line for line in log if line.startswith("run tiny:")))
    assert log[first].startswith("run tiny: cpu, 1 process, precision fp32, compile off, 12 steps (6 per epoch)")
    assert log[first + 1] == "threads: 1 intra-op (OMP_NUM_THREADS=1)" and torch.get_num_threads() == 1
    assert log[first + 2] == (
        "habits: EMA off, mixup / CutMix off, augmentation off, early stopping off, validation scores the raw weights"
    )
    assert written["split"] == "test" and written["checkpoint"].endswith("best/model.safetensors")
    assert written["wall_s"] > 0 and Path(written["confusion_png"]).is_file()
    reset_accelerate()
    assert written["metrics"] == json.loads(json.dumps(evaluate(run_dir, split="test")["metrics"]))
    # a launcher's processes would each test: refused before training, with the command that tests afterwards
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"--test runs in one process: test this run afterwards with tools/eval.py"):
        train_main()


def test_resume_after_a_crash_ends_with_the_same_weights(tmp_path, monkeypatch, request):
    # on the CPU: an exact replay, which a GPU's bf16 steps (mixed precision auto) and kernels that reduce in any order
    # do not promise
    hide_cuda(monkeypatch, request)
    recipe = recipe_file(tmp_path, train={"checkpoint_every_steps": 4})
    fit(recipe, tmp_path / "straight")

    original = Trainer.train_batch
    calls = {"n": 0}

    def crash_after_five_batches(self, batch):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return original(self, batch)

    monkeypatch.setattr(Trainer, "train_batch", crash_after_five_batches)
    with pytest.raises(KeyboardInterrupt):
        fit(recipe, tmp_path / "crashed")
    meta = json.loads((tmp_path / "crashed" / "checkpoints" / "last" / "meta.json").read_text())
    assert meta["step"] == 4 and meta["batch_in_epoch"] == 4
    monkeypatch.setattr(Trainer, "train_batch", original)
    resumed = fit(recipe, tmp_path / "crashed", resume=True)
    assert resumed.state.step == 12

    straight = load_file(str(tmp_path / "straight" / "checkpoints" / "last" / "model.safetensors"))
    after_crash = load_file(str(tmp_path / "crashed" / "checkpoints" / "last" / "model.safetensors"))
    assert straight.keys() == after_crash.keys()
    # the same bytes: nothing the crash and resume did (a new loader iterator mid-epoch) drew from the model's generator
    assert [key for key in straight if not torch.equal(after_crash[key], straight[key])] == []


def test_a_failed_save_leaves_the_previous_checkpoint_in_place(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    trainer = fit(recipe_file(tmp_path), run_dir)
    before = load_file(str(run_dir / "checkpoints" / "last" / "model.safetensors"))

    def broken_save_state(output_dir, **kwargs):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(trainer.accelerator, "save_state", broken_save_state)
    with pytest.raises(OSError):
        trainer.save("last")
    after = load_file(str(run_dir / "checkpoints" / "last" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epocs=3", "train.epocs: unknown key (did you mean 'epochs'?)"),
        ("model.img_size=-3", "model.img_size: expected an integer >= 8, got -3"),
        ("train.mixed_precision=bf32", "train.mixed_precision: expected one of"),
        ("model.attention.name=performr", "unknown attention 'performr' (did you mean 'performer'"),
    ],
)
def test_malformed_recipes_give_one_line_and_exit_nonzero(tmp_path, override, message):
    result = run_tool_here(
        "tools/train.py", str(recipe_file(tmp_path)), "--set", override, "--output", str(tmp_path / "run")
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and message in error_lines[0], result.stderr


def test_missing_recipe_and_run_dir_name_the_path(tmp_path):
    result = run_tool_here("tools/train.py", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "nope.yaml" in result.stderr and "Traceback" not in result.stderr
    # README's blocks launch tools/eval.py as a user does (tests/test_docs.py)
    result = run_tool_here("tools/eval.py", str(tmp_path / "no_run"))
    assert result.returncode == 2 and "no_run" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda path: path.stem)
def test_shipped_recipes_are_valid(path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    attention = recipe.model.attention
    # The options must be ones the variant takes: build one block's attention at the recipe's width (the ViT's
    # own, 384 wide with 6 heads, where the recipe keeps it).
    dim, heads = recipe.model.embed_dim or 384, recipe.model.num_heads or 6
    zoo.create_attention(attention.name, dim, heads, **attention.options)


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("vit_*_1024.yaml")), ids=lambda path: path.stem)
def test_each_1024_px_recipe_names_a_registered_variant(path):
    # Driven by the recipes that exist, not by the registry: a new variant needs no recipe to pass the suite.
    model = load_recipe(path).model
    name = model.attention.name
    assert name in zoo.list_attentions()
    # a per-block layout (ViTDet's global blocks) is named after its other attention: vit_window2d_global_1024
    layout = f"_{model.global_attention.name.replace('softmax', 'global')}" if model.global_blocks else ""
    assert path.stem == f"vit_{name}{layout}_1024"


@pytest.mark.parametrize("vocab_size, confusion", [(256, True), (257, False)])
def test_the_confusion_matrix_is_kept_up_to_its_class_limit(tmp_path, monkeypatch, vocab_size, confusion):
    # MQAR's whole vocabulary is its classes: one past the limit (1,000 shipped, 256 here to keep the test small)
    # drops the k x k matrix and its plot
    monkeypatch.setattr(zoo.evaluate, "CONFUSION_MAX_CLASSES", 256)
    recipe = load_recipe(
        ROOT / "recipes" / "recall_mqar_quick.yaml",
        overrides=[
            f"data.options.vocab_size={vocab_size}",
            "data.options.seq_len=64",
            "data.options.num_kv_pairs=4",
            "data.train_samples=4",
            "data.val_samples=4",
            "data.test_samples=4",
            "data.batch_size=4",
            "train.max_steps=1",
            "schedule.warmup_steps=0",
        ],
    )
    reset_accelerate()
    Trainer(recipe, tmp_path / "run").fit()
    reset_accelerate()
    result = evaluate(tmp_path / "run", checkpoint="last", split="test")
    assert ("confusion" in result["metrics"]) is confusion
    assert (result["confusion_png"] is not None) is confusion
    if confusion:
        # 4 samples x 4 queries, every query counted once
        assert torch.tensor(result["metrics"]["confusion"]).shape == (256, 256)
        assert torch.tensor(result["metrics"]["confusion"]).sum() == 16
