"""train.early_stopping stops once the selection metric has not improved for `patience` evaluations, given a
scripted sequence of validation scores; train.deterministic: two runs of one recipe and seed give identical weights."""

import json

import pytest
import torch
from helpers import hide_cuda, reset_accelerate, tiny_vit_recipe

from zoo.config import recipe_from_dict
from zoo.train.loop import Trainer

# validation top-1 per evaluation: best 0.3 at the 2nd; the 3rd (0.2) and 4th (0.3, a tie) do not beat it
SCORES = [0.1, 0.3, 0.2, 0.3, 0.25, 0.9, 0.95]


def short_epochs(**train):
    # two steps per epoch (16 samples, batches of 8)
    return tiny_vit_recipe(data={"train_samples": 16}, train={"epochs": len(SCORES), **train})


def fit_scripted(tmp_path, monkeypatch, recipe):
    scores = iter(SCORES)
    monkeypatch.setattr(Trainer, "_validate", lambda self: {"loss": 1.0, "top1": next(scores)})
    reset_accelerate()
    trainer = Trainer(recipe_from_dict(recipe), tmp_path / "run")
    trainer.fit()
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("patience", "evaluations"), [(2, 4), (3, 5), (5, 7)])
def test_stops_after_patience_evaluations_without_improvement(
    tmp_path, monkeypatch, request, capsys, patience, evaluations
):
    hide_cuda(monkeypatch, request)
    records = fit_scripted(tmp_path, monkeypatch, short_epochs(early_stopping={"patience": patience}))
    assert [r["val_top1"] for r in records] == SCORES[:evaluations]
    assert records[-1]["step"] == 2 * evaluations
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["best_val_top1"] == max(SCORES[:evaluations])
    stopped = evaluations < len(SCORES)
    assert ("early stopping: val_top1 has not improved for" in capsys.readouterr().out) == stopped


def test_without_early_stopping_every_epoch_runs(tmp_path, monkeypatch, request):
    hide_cuda(monkeypatch, request)
    assert len(fit_scripted(tmp_path, monkeypatch, short_epochs())) == len(SCORES)


def test_deterministic_runs_give_identical_weights(tmp_path, monkeypatch, request):
    hide_cuda(monkeypatch, request)
    request.addfinalizer(lambda: torch.use_deterministic_algorithms(False))
    weights = []
    for run, seed in (("a", 3), ("b", 3), ("c", 4)):
        reset_accelerate()
        recipe = recipe_from_dict(tiny_vit_recipe(seed=seed, train={"max_steps": 3, "deterministic": True}))
        trainer = Trainer(recipe, tmp_path / run)
        assert torch.are_deterministic_algorithms_enabled()
        trainer.fit()
        weights.append({k: v.clone() for k, v in trainer.plain_model.state_dict().items()})
    first, again, other = weights
    for key, value in first.items():
        assert torch.equal(value, again[key]), key
    # another seed trains other weights: the equality above is the seed's doing
    assert not torch.equal(first["head.weight"], other["head.weight"])
