"""Checkpoints that prove they are whole: manifests, damaged and foreign checkpoints, non-finite losses and weights,
and a training process killed ten times over (during saves too) that still ends with the uninterrupted weights."""

import json
import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import reset_accelerate, tiny_vit_recipe, with_sections
from safetensors.torch import load_file, save_file

import zoo.train._objective
import zoo.train.loop
from zoo.config import load_recipe
from zoo.evaluate import evaluate
from zoo.hub.checkpoints import MANIFEST_NAME, CheckpointError, find_checkpoint, read_manifest, verify_checkpoint
from zoo.train.loop import NonFiniteError, Trainer

TINY = tiny_vit_recipe(
    model={"attention": {"name": "performer", "options": {"nb_features": 16, "redraw_interval": 2}}},
    optim={"lr": 1e-3},
    schedule={"warmup_steps": 2},
    train={"epochs": 2, "log_every_steps": 1, "checkpoint_every_steps": 2},
)


def write_recipe(folder: Path, **train) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(with_sections(TINY, train=train)))
    return path


def fit(recipe: Path, run_dir: Path, resume: bool | str = False) -> Trainer:
    reset_accelerate()
    trainer = Trainer(load_recipe(recipe), run_dir, resume=resume)
    trainer.fit()
    return trainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(recipe, run dir) of a finished tiny run: 12 steps, best and last checkpoints."""
    folder = tmp_path_factory.mktemp("trained")
    recipe = write_recipe(folder)
    fit(recipe, folder / "run")
    return recipe, folder / "run"


@pytest.fixture
def run(trained, tmp_path) -> tuple[Path, Path]:
    """A copy of the trained run that a test may damage."""
    recipe, run_dir = trained
    shutil.copytree(run_dir, tmp_path / "run")
    return recipe, tmp_path / "run"


def test_every_checkpoint_carries_a_manifest_of_its_files(trained):
    _, run_dir = trained
    for which in ("last", "best"):
        folder = run_dir / "checkpoints" / which
        manifest = verify_checkpoint(folder)
        files = {p.name for p in folder.iterdir()} - {MANIFEST_NAME}
        assert set(manifest["files"]) == files and {"model.safetensors", "optimizer.bin", "meta.json"} <= files
        for name, entry in manifest["files"].items():
            assert entry["size"] == (folder / name).stat().st_size and len(entry["sha256"]) == 64
        assert manifest["model"]["model.attention.name"] == "performer"
    assert read_manifest(run_dir / "checkpoints" / "last")["state"]["step"] == 12


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda f: _truncate(f / "model.safetensors"),
            r"model\.safetensors has \d+ bytes, \d+ when saved \(truncated\)",
        ),
        (lambda f: (f / "optimizer.bin").unlink(), r"incomplete: optimizer\.bin is missing"),
        (lambda f: _flip_a_byte(f / "optimizer.bin"), r"the content of optimizer\.bin changed"),
        (lambda f: (f / MANIFEST_NAME).write_text("{not json"), r"manifest\.json is corrupt"),
    ],
    ids=["truncated", "missing", "altered", "bad-manifest"],
)
def test_resume_names_a_damaged_last_and_uses_best_only_when_asked(run, damage, message):
    recipe, run_dir = run
    damage(run_dir / "checkpoints" / "last")
    with pytest.raises(CheckpointError, match=message) as info:
        fit(recipe, run_dir, resume=True)
    assert "checkpoints/last" in str(info.value) and "use it with --resume-from best" in str(info.value)
    assert "\n" not in str(info.value)
    resumed = fit(recipe, run_dir, resume="best")
    assert resumed.state.step == 12
    verify_checkpoint(run_dir / "checkpoints" / "last")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: _truncate(f / "optimizer.bin"), r"checkpoints/last: cannot load the training state: "),
        (lambda f: _truncate(f / "model.safetensors"), r"model\.safetensors: truncated safetensors file"),
    ],
    ids=["optimizer", "weights"],
)
def test_a_damaged_checkpoint_without_manifest_is_one_line_too(run, damage, message):
    # written by zoo before manifests (a crash mid-save of an older version): caught when loading
    recipe, run_dir = run
    last = run_dir / "checkpoints" / "last"
    (last / MANIFEST_NAME).unlink()
    damage(last)
    with pytest.raises(ValueError, match=message) as info:
        fit(recipe, run_dir, resume=True)
    assert "\n" not in str(info.value)


def test_a_git_lfs_pointer_in_place_of_a_checkpoint_file_is_named(run):
    _, run_dir = run
    weights = run_dir / "checkpoints" / "best" / "model.safetensors"
    weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    with pytest.raises(CheckpointError, match=r"model\.safetensors has \d+ bytes, \d+ when saved: a git-lfs pointer"):
        evaluate(run_dir, checkpoint="best")


def test_resume_and_eval_check_the_recipe_that_trained_the_checkpoint(run, tmp_path):
    recipe, run_dir = run
    edited = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    edited["model"]["attention"] = {"name": "softmax", "options": {}}
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(edited))
    with pytest.raises(CheckpointError, match=r"model\.attention\.name: 'performer' in the checkpoint, 'softmax' in"):
        evaluate(run_dir, checkpoint="best")
    other = yaml.safe_load(recipe.read_text())
    other["model"]["depth"] = 2
    (tmp_path / "deeper.yaml").write_text(yaml.safe_dump(other))
    with pytest.raises(CheckpointError, match=r"model\.depth: 1 in the checkpoint, 2 in this recipe"):
        fit(tmp_path / "deeper.yaml", run_dir, resume=True)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "it is empty"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n", "git-lfs pointer"),
        (b"just some notes\n", "text file"),
    ],
    ids=["empty", "lfs-pointer", "text"],
)
def test_eval_of_a_file_that_holds_no_weights_is_one_line(run, content, message):
    _, run_dir = run
    weights = run_dir / "weights.safetensors"
    weights.write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        evaluate(run_dir, checkpoint=str(weights))
    assert str(weights) in str(info.value) and "\n" not in str(info.value)


def test_eval_of_another_architecture_names_what_differs(run):
    _, run_dir = run
    state = load_file(str(run_dir / "checkpoints" / "best" / "model.safetensors"))
    # a deeper model's weights: one more block
    state.update(
        {k.replace("blocks.0.", "blocks.1."): v.clone() for k, v in state.items() if k.startswith("blocks.0.")}
    )
    save_file(state, str(run_dir / "deeper.safetensors"))
    with pytest.raises(ValueError, match=r"deeper\.safetensors: weights do not fit .*(depth|blocks)"):
        evaluate(run_dir, checkpoint=str(run_dir / "deeper.safetensors"))


def test_a_checkpoint_without_manifest_still_loads(run, caplog):
    # written by zoo before manifests: loaded unverified, with a warning
    _, run_dir = run
    (run_dir / "checkpoints" / "best" / MANIFEST_NAME).unlink()
    assert evaluate(run_dir, checkpoint="best")["metrics"]["samples"] == 16
    assert "loaded without verification" in caplog.text


def test_a_checkpoint_from_before_a_model_option_existed_reads_it_as_its_default(run):
    # written by a zoo without model.stem: trained as the default stem ("patch"), so it loads
    _, run_dir = run
    path = run_dir / "checkpoints" / "best" / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    assert manifest["model"].pop("model.stem") == "patch"
    path.write_text(json.dumps(manifest))
    assert evaluate(run_dir, checkpoint="best")["metrics"]["samples"] == 16
    # the same checkpoint against a recipe that sets the option otherwise is refused
    recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    recipe["model"]["stem"] = "conv"
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(CheckpointError, match=r"model\.stem: 'patch' in the checkpoint, 'conv' in"):
        evaluate(run_dir, checkpoint="best")


def _nan_on_calls(monkeypatch, calls: set[int]) -> None:
    """The attention's auxiliary loss turns NaN on the given 1-based batch numbers."""
    count = {"n": 0}

    def auxiliary_loss(model):
        count["n"] += 1
        return torch.tensor(float("nan")) if count["n"] in calls else torch.zeros(())

    # the task objective's (zoo.train._objective), which every training run's loss goes through
    monkeypatch.setattr(zoo.train._objective, "auxiliary_loss", auxiliary_loss)


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_last_good_checkpoint(tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path)
    _nan_on_calls(monkeypatch, {5})
    with pytest.raises(NonFiniteError) as info:
        fit(recipe, tmp_path / "run")
    message = str(info.value)
    assert "non-finite loss (nan) at step 5 (epoch 1, batch 5)" in message and "\n" not in message
    assert f"the last good checkpoint is {tmp_path / 'run' / 'checkpoints' / 'last'} (step 4)" in message
    assert "train.skip_nonfinite" in message
    assert read_manifest(tmp_path / "run" / "checkpoints" / "last")["state"]["step"] == 4


def test_skip_nonfinite_skips_up_to_k_batches(tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path, skip_nonfinite=2)
    _nan_on_calls(monkeypatch, {3, 8})
    trainer = fit(recipe, tmp_path / "run")
    assert trainer.state.skipped_batches == 2 and trainer.state.step == 12
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["train_loss"]) for r in records)
    _nan_on_calls(monkeypatch, {2, 3, 4})
    with pytest.raises(NonFiniteError, match="at step 4 .*now 2"):
        fit(recipe, tmp_path / "again")


def test_grad_accumulation_checks_the_loss_once_per_step_and_skips_a_bad_step(tmp_path, monkeypatch):
    # 6 batches an epoch, 2 per step: a NaN in batch 3 spoils step 2's gradients, read once that step is in
    batches, checks = [], []
    train_batch, read = Trainer.train_batch, zoo.train.loop.nonfinite_batches

    def counted_batch(self, batch):
        batches.append(batch)
        return train_batch(self, batch)

    def counted_read(accelerator, seen):
        checks.append(len(batches))
        return read(accelerator, seen)

    monkeypatch.setattr(Trainer, "train_batch", counted_batch)
    monkeypatch.setattr(zoo.train.loop, "nonfinite_batches", counted_read)
    _nan_on_calls(monkeypatch, {3})
    trainer = fit(write_recipe(tmp_path, grad_accum_steps=2, skip_nonfinite=1), tmp_path / "run")
    # read at the last batch of each step only: the run's 2nd, 4th, ... of its 12 batches (2 epochs of 6)
    assert checks == [2, 4, 6, 8, 10, 12]
    assert trainer.state.skipped_batches == 1 and trainer.state.step == 6
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    _nan_on_calls(monkeypatch, {3})
    with pytest.raises(NonFiniteError, match=r"non-finite loss \(nan\) at step 2 \(epoch 1, batches 3-4\)"):
        fit(write_recipe(tmp_path, grad_accum_steps=2), tmp_path / "again")


def test_weights_that_turned_non_finite_never_replace_a_checkpoint(tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path)
    original = zoo.train.loop.on_optimizer_step

    # an overflow in the optimizer step that ends step 4, just before its checkpoint
    def poison_at_step_4(model):
        original(model)
        poison_at_step_4.steps += 1
        if poison_at_step_4.steps == 4:
            next(model.parameters()).data.fill_(float("inf"))

    poison_at_step_4.steps = 0
    monkeypatch.setattr(zoo.train.loop, "on_optimizer_step", poison_at_step_4)
    with pytest.raises(NonFiniteError, match=r"weights hold NaN or inf at step 4.*\(step 2\)"):
        fit(recipe, tmp_path / "run")
    last = tmp_path / "run" / "checkpoints" / "last"
    assert read_manifest(last)["state"]["step"] == 2
    assert all(torch.isfinite(t).all() for t in load_file(str(last / "model.safetensors")).values())


def _train_in_child(recipe: Path, run_dir: Path, kill_at: tuple[str, int] | None = None) -> None:
    """A training process (spawned): resumes when the run has a checkpoint. `kill_at` makes it SIGKILL itself at a
    point of the run, so that the kill lands there however fast or busy the machine is: ("step", n) after its n-th
    optimizer step; ("manifest", n) in place of its n-th manifest (a save written but for the manifest);
    ("rename", n) after its n-th rename of a save that replaces a checkpoint (between the two renames, or before
    the old copy is removed)."""
    # one thread: every run computes alike
    torch.set_num_threads(1)
    if kill_at is not None:
        point, n = kill_at
        calls = [0]

        def count() -> None:
            calls[0] += 1
            if calls[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)

        if point == "step":
            step = zoo.train.loop.on_optimizer_step
            zoo.train.loop.on_optimizer_step = lambda model: (step(model), count())
        elif point == "manifest":
            manifest = zoo.train.loop.write_manifest
            zoo.train.loop.write_manifest = lambda *args, **kwargs: (count(), manifest(*args, **kwargs))
        else:
            rename = Path.rename

            def counted_rename(self, target):
                result = rename(self, target)
                if Path(target).name.endswith(".old") or Path(f"{target}.old").exists():
                    count()
                return result

            Path.rename = counted_rename
    fit(recipe, run_dir, resume=find_checkpoint(run_dir, "last") is not None)


def _last_step(run_dir: Path) -> int:
    found = find_checkpoint(run_dir, "last")
    try:
        return read_manifest(found)["state"]["step"] if found else 0
    except (CheckpointError, OSError, KeyError, TypeError):
        return 0


@pytest.mark.slow
def test_ten_kills_at_random_points_resume_to_the_uninterrupted_weights(tmp_path):
    recipe = write_recipe(tmp_path, epochs=8)
    # forkserver: a worker that ran autograd's threads before cannot fork a child that trains, while a fresh server
    # that only imported zoo can; its children start with the imports done (12 of them, each a fresh interpreter
    # when spawned)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["zoo.train.loop", "zoo.evaluate", "accelerate"])
    straight = context.Process(target=_train_in_child, args=(recipe, tmp_path / "straight"))
    straight.start()
    straight.join()
    assert straight.exitcode == 0
    rng = np.random.default_rng(12)
    run_dir, kills, in_save = tmp_path / "killed", 0, 0
    checkpoints = run_dir / "checkpoints"
    partial = [checkpoints / f"{which}{suffix}" for which in ("last", "best") for suffix in (".tmp", ".old")]
    # half the kills inside a save (in place of a manifest, or between renames), half after an optimizer step
    points = ["step", "rename", "step", "manifest"] * 2 + ["step", "rename"]
    for point in points:
        kill_at = (point, int(rng.integers(1, 5)))
        process = context.Process(target=_train_in_child, args=(recipe, run_dir, kill_at))
        process.start()
        process.join()
        assert process.exitcode == -signal.SIGKILL, (kill_at, process.exitcode)
        kills += 1
        in_save += point != "step" and any(p.exists() for p in partial)
        last = find_checkpoint(run_dir, "last")
        if last is not None:
            verify_checkpoint(last)
    assert kills == 10 and in_save == 5, (kills, in_save)
    final = context.Process(target=_train_in_child, args=(recipe, run_dir))
    final.start()
    final.join()
    assert final.exitcode == 0
    for which in ("last", "best"):
        expected = load_file(str(tmp_path / "straight" / "checkpoints" / which / "model.safetensors"))
        got = load_file(str(run_dir / "checkpoints" / which / "model.safetensors"))
        assert expected.keys() == got.keys()
        for key in expected:
            assert torch.equal(got[key], expected[key]), (which, key)
    assert json.loads((run_dir / "train_summary.json").read_text())["steps"] == 48
