"""train.ema: the moving average after N steps equals one computed here from the raw weights recorded at every
optimizer step (timm's decay formula with warm-up written out independently), validation scores it, checkpoints
hold it beside the raw weights, and zoo.load_model and a resume read it back."""

import json

import pytest
import torch
from helpers import hide_cuda, reset_accelerate, tiny_vit_recipe

import zoo
from zoo.config import recipe_from_dict
from zoo.train import _ema
from zoo.train.eval_loop import evaluate_loader
from zoo.train.loop import Trainer

DECAY, POWER, STEPS = 0.8, 0.75, 5


def ema_recipe(**ema):
    return recipe_from_dict(
        tiny_vit_recipe(
            optim={"lr": 1e-2},
            train={"epochs": 1, "max_steps": STEPS, "ema": {"decay": DECAY, "warmup_power": POWER, **ema}},
        )
    )


def expected_average(raw: list[dict[str, torch.Tensor]], warmup: bool) -> dict[str, torch.Tensor]:
    """ema_1 = w_1; ema_t = d_t * ema_{t-1} + (1 - d_t) * w_t, d_t = min(decay, 1 - t^-power) under warm-up."""
    average = {k: v.clone().double() for k, v in raw[0].items()}
    for t, weights in enumerate(raw[1:], start=2):
        d = min(DECAY, 1 - t**-POWER) if warmup else DECAY
        for key, value in weights.items():
            average[key] = d * average[key] + (1 - d) * value.double()
    return average


def train_recording(tmp_path, monkeypatch, recipe):
    """A fitted Trainer and the raw parameters at every optimizer step, read before the average takes them."""
    raw = []
    update = _ema.ModelEma.update

    def record(self, model, step):
        raw.append({k: v.detach().clone() for k, v in model.named_parameters()})
        update(self, model, step)

    monkeypatch.setattr(_ema.ModelEma, "update", record)
    reset_accelerate()
    trainer = Trainer(recipe, tmp_path / "run")
    trainer.fit()
    return trainer, raw


def validation_metrics(model, trainer) -> dict:
    """`model`'s loss and top-1 on the trainer's validation loader, evaluated here (not read from the run)."""
    return evaluate_loader(
        model,
        trainer.val_loader,
        trainer.accelerator,
        task=trainer.task,
        model_inputs=trainer.kind.inputs,
        metric_names=["top1"],
        num_classes=trainer.num_classes,
    )


@pytest.mark.parametrize("warmup", [True, False])
def test_average_equals_the_decay_formula_over_the_recorded_weights(tmp_path, monkeypatch, request, warmup):
    hide_cuda(monkeypatch, request)
    trainer, raw = train_recording(tmp_path, monkeypatch, ema_recipe(warmup=warmup))
    assert len(raw) == STEPS
    expected = expected_average(raw, warmup)
    averaged = dict(trainer.ema.module.named_parameters())
    for key, value in expected.items():
        torch.testing.assert_close(averaged[key].double(), value, rtol=1e-6, atol=1e-7)
    # the average is not the last raw weights (the test would pass vacuously at decay 0)
    assert not torch.allclose(averaged["head.weight"], raw[-1]["head.weight"])


def test_validation_and_load_model_use_the_average(tmp_path, monkeypatch, request):
    hide_cuda(monkeypatch, request)
    trainer, raw = train_recording(tmp_path, monkeypatch, ema_recipe())
    expected = expected_average(raw, warmup=True)
    checkpoint = tmp_path / "run" / "checkpoints" / "best"
    assert (checkpoint / "model_ema.safetensors").is_file() and (checkpoint / "model.safetensors").is_file()
    loaded = zoo.load_model(tmp_path / "run")
    for key, value in loaded.named_parameters():
        torch.testing.assert_close(value.double(), expected[key], rtol=1e-6, atol=1e-7)
    # the validation record is the score of those weights, evaluated here from the loaded model
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    metrics = validation_metrics(loaded, trainer)
    assert record["val_loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    raw_model = zoo.load_model(tmp_path / "run" / "checkpoints" / "best" / "model.safetensors")
    raw_metrics = validation_metrics(raw_model, trainer)
    assert record["val_loss"] != pytest.approx(raw_metrics["loss"], rel=1e-5)
    # the record names the weights val_* scored, and scores the raw ones too, as evaluated here
    assert record["weights"] == "ema"
    assert record["raw_val_loss"] == pytest.approx(raw_metrics["loss"], rel=1e-5)
    assert record["raw_val_top1"] == pytest.approx(raw_metrics["top1"])


def test_raw_evaluation_and_resume_continue_the_average(tmp_path, monkeypatch, request):
    hide_cuda(monkeypatch, request)
    recipe = ema_recipe(evaluate="raw")
    trainer, _ = train_recording(tmp_path, monkeypatch, recipe)
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["weights"] == "raw"
    ema_metrics = validation_metrics(trainer.ema.module, trainer)
    assert record["ema_val_loss"] == pytest.approx(ema_metrics["loss"], rel=1e-5) != record["val_loss"]
    # evaluate raw: load_model reads the optimizer's own weights
    loaded = zoo.load_model(tmp_path / "run", checkpoint="last")
    for key, value in loaded.named_parameters():
        torch.testing.assert_close(value, dict(trainer.plain_model.named_parameters())[key])
    average = {k: v.detach().clone() for k, v in trainer.ema.module.named_parameters()}
    reset_accelerate()
    resumed = Trainer(recipe, tmp_path / "run", resume=True)
    resumed.restore()
    for key, value in resumed.ema.module.named_parameters():
        torch.testing.assert_close(value, average[key])
