"""Runs visible where users look: `train.log_with` sends the loss, learning rate, samples/s and every evaluation to
accelerate's tracker (TensorBoard here, offline), and the evaluations' epoch numbers agree with the progress bar."""

import json
from pathlib import Path

import pytest
from helpers import reset_accelerate, tiny_vit_recipe, write_recipe

from zoo.config import RecipeError, load_recipe
from zoo.train.loop import Trainer


def tracked_recipe(**train) -> dict:
    return tiny_vit_recipe(
        name="tracked",
        seed=0,
        model={"attention": {"name": "linear"}},
        data={"train_samples": 24, "val_samples": 8, "test_samples": 8},
        # 3 steps an epoch: the run stops a step into its second epoch
        train={"epochs": 2, "max_steps": 4, "log_every_steps": 1, **train},
    )


def train(tmp_path: Path, **train) -> tuple[Trainer, Path]:
    path = write_recipe(tmp_path / "recipe.yaml", tracked_recipe(**train))
    reset_accelerate()
    trainer = Trainer(load_recipe(path), tmp_path / "run")
    trainer.fit()
    return trainer, tmp_path / "run"


def test_evaluation_epochs_are_the_progress_bars(tmp_path, capsys):
    _, run = train(tmp_path)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # the bar said "epoch 1/2", then "epoch 2/2" for the one step of the second epoch (this read 1 and 1)
    assert [(r["epoch"], r["step"]) for r in records] == [(1, 3), (2, 4)]
    assert not (run / "logs").exists()


def test_tensorboard_receives_loss_lr_throughput_and_metrics(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run = train(tmp_path, log_with="tensorboard")
    folders = {path.parent for path in (run / "logs").rglob("events.out.tfevents.*")}
    assert folders and all(folder.is_relative_to(run / "logs" / "tracked") for folder in folders)
    scalars: dict[str, list[tuple[int, float]]] = {}
    for folder in folders:
        events = EventAccumulator(str(folder))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
    for tag in ("train/loss", "train/lr", "train/samples_per_s"):
        assert [step for step, _ in scalars[tag]] == [1, 2, 3, 4], tag
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for tag in ("val/loss", "val/top1", "val/f1", "train/epoch_loss", "epoch"):
        assert [step for step, _ in scalars[tag]] == [3, 4], tag
    assert [value for _, value in scalars["epoch"]] == [r["epoch"] for r in records]
    assert [value for _, value in scalars["val/top1"]] == pytest.approx([r["val_top1"] for r in records])


def test_unknown_or_missing_tracker_is_one_line(tmp_path):
    with pytest.raises(RecipeError, match=r"train\.log_with: expected one of .*'tensorboard'.*got 'tensorbord'"):
        train(tmp_path, log_with="tensorbord")
    from accelerate.tracking import get_available_trackers

    missing = [name for name in ("aim", "swanlab", "dvclive", "clearml") if name not in get_available_trackers()]
    if not missing:
        pytest.skip("every tracker tried here is installed")
    with pytest.raises(ValueError, match=f"train.log_with '{missing[0]}': the {missing[0]} package is not installed"):
        train(tmp_path, log_with=missing[0])
