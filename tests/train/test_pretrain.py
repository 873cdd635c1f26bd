"""Self-pretraining (zoo/train/self_pretrain.py, train.pretrain, run by zoo/train/stages.py): what each objective
scores and sees, that the fine-tuning starts from the pretrained weights, resume around pretraining, that pretraining
is a Trainer run (the recipe's schedule, non-finite handling), and the recipe's one-line errors."""

import json

import pytest
import torch
from helpers import reset_accelerate, tiny_sequence_model

from zoo.config import RecipeError, recipe_from_dict
from zoo.models import create_sequence_model
from zoo.train import stages
from zoo.train.loop import Trainer
from zoo.train.self_pretrain import PretrainObjective, TokenPredictor, causal_lm_loss, draw_mask, masked_lm_loss

VOCAB = 11


def tiny_model(pool: str = "cls", attention: str = "softmax"):
    torch.manual_seed(0)
    model = create_sequence_model(
        "classification", input="tokens", vocab_size=VOCAB, num_classes=3, seq_len=37, dim=32, depth=2,
        num_heads=2, pool=pool, attention=attention,
    )  # fmt: skip
    return model.eval()


def tokens_and_keep(b: int = 2, n: int = 37):
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, VOCAB, (b, n), generator=generator)
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[1, 30:] = False
    return tokens, keep


def test_draw_mask_picks_kept_positions_at_the_rate_and_one_per_sequence():
    tokens, keep = tokens_and_keep(4, 2000)
    keep[2, 5:] = False
    masked = draw_mask(tokens, keep, 0.15, torch.Generator().manual_seed(0))
    assert not (masked & ~keep).any()
    assert abs(masked[0].float().mean().item() - 0.15) < 0.03
    # a prob so low that no position would be drawn still masks one kept position per sequence
    rare = draw_mask(tokens, keep, 1e-9, torch.Generator().manual_seed(0))
    assert rare.sum(dim=1).tolist() == [1, 1, 1, 1] and not (rare & ~keep).any()


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_masked_objective_scores_and_hides_masked_positions_only(pool):
    model = tiny_model(pool)
    predictor = TokenPredictor(model, causal=False).eval()
    tokens, keep = tokens_and_keep()
    masked = draw_mask(tokens, keep, 0.3, torch.Generator().manual_seed(2))
    logits = predictor(tokens, keep, masked).detach().requires_grad_(True)
    loss, correct, count = masked_lm_loss(logits, tokens, masked)
    expected = torch.nn.functional.cross_entropy(logits[masked], tokens[masked])
    torch.testing.assert_close(loss, expected)
    assert count == masked.sum() and 0 <= correct <= count
    loss.backward()
    scored = logits.grad.abs().sum(dim=-1) > 0
    assert torch.equal(scored, masked)
    # the model never sees a masked token: other ids there change no output
    changed = torch.where(masked, (tokens + 3) % VOCAB, tokens)
    torch.testing.assert_close(predictor(changed, keep, masked), predictor(tokens, keep, masked))
    # ... while an unmasked token does reach the outputs (bidirectional attention)
    assert not torch.allclose(predictor(changed, keep, None), predictor(tokens, keep, None))


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_causal_objective_never_sees_the_future(pool):
    model = tiny_model(pool)
    predictor = TokenPredictor(model, causal=True).eval()
    tokens, keep = tokens_and_keep()
    logits = predictor(tokens, keep)
    for i in (0, 12, 35):
        future = tokens.clone()
        future[:, i + 1 :] = (future[:, i + 1 :] + 5) % VOCAB
        torch.testing.assert_close(predictor(future, keep)[:, : i + 1], logits[:, : i + 1])
    # the fine-tuning model stays bidirectional
    assert model.backbone.causal is False
    logits = logits.detach().requires_grad_(True)
    loss, _, count = causal_lm_loss(logits, tokens, keep)
    expected = torch.nn.functional.cross_entropy(logits[:, :-1][keep[:, 1:]], tokens[:, 1:][keep[:, 1:]])
    torch.testing.assert_close(loss, expected)
    assert count == keep[:, 1:].sum()
    loss.backward()
    # the last position predicts nothing; a position whose next token is padded neither
    assert logits.grad[:, -1].abs().sum() == 0 and logits.grad[1, 29:].abs().sum() == 0


def test_causal_pretraining_refuses_an_attention_without_causal_mode():
    with pytest.raises(ValueError, match="'linformer' has no causal mode"):
        TokenPredictor(tiny_model(attention="linformer"), causal=True)


def tiny_recipe(**pretrain) -> dict:
    return {
        "name": "pretrain_tiny",
        "task": "classification",
        "metrics": ["top1"],
        "model": tiny_sequence_model("tokens"),
        "data": {
            "name": "listops",
            "options": {"min_length": 8, "max_length": 30, "max_depth": 3, "max_args": 3},
            "train_samples": 48,
            "val_samples": 16,
            "test_samples": 16,
            "batch_size": 8,
            "num_workers": 0,
        },
        "schedule": {"warmup_steps": 1},
        "train": {"epochs": 1, "max_steps": 3, "mixed_precision": "no", **({"pretrain": pretrain} if pretrain else {})},
    }


def trainer(recipe: dict, run_dir, resume: bool = False) -> Trainer:
    """The recipe's Trainer as tools/train.py builds it (`zoo.train.stages`): pretrained first where it asks."""
    reset_accelerate()
    return stages.build_trainer(recipe_from_dict(recipe), run_dir, resume=resume)


def weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def spy_pretrain(monkeypatch) -> list[dict]:
    """Record the model's weights each time the stages' pretraining returns."""
    snapshots = []

    def spy(recipe, model, *args, **kwargs):
        records = real(recipe, model, *args, **kwargs)
        snapshots.append(weights(model))
        return records

    real = stages.pretrain
    monkeypatch.setattr(stages, "pretrain", spy)
    return snapshots


def spy_first_batch(monkeypatch) -> list[dict]:
    """Record the weights that the first fine-tuning batch sees (pretraining is a Trainer run too: its batches are
    not the fine-tuning's)."""
    seen = []
    real = Trainer.train_batch

    def spy(self, batch):
        if not seen and not isinstance(self.objective, PretrainObjective):
            seen.append(weights(self.accelerator.unwrap_model(self.model)))
        return real(self, batch)

    monkeypatch.setattr(Trainer, "train_batch", spy)
    return seen


@pytest.mark.parametrize("objective", ["mlm", "causal"])
def test_fine_tuning_starts_from_the_pretrained_backbone(tmp_path, monkeypatch, objective):
    scratch = weights(trainer(tiny_recipe(), tmp_path / "scratch").model)
    snapshots, first = spy_pretrain(monkeypatch), spy_first_batch(monkeypatch)
    run = trainer(tiny_recipe(objective=objective, epochs=2), tmp_path / "run")
    run.fit()
    assert len(snapshots) == 1 and run.state.pretrained
    (pretrained,) = snapshots
    # the pretraining head and [MASK] entry are gone: the same keys and shapes as without pretraining
    assert {k: v.shape for k, v in pretrained.items()} == {k: v.shape for k, v in scratch.items()}
    for key, value in pretrained.items():
        torch.testing.assert_close(first[0][key], value, rtol=0, atol=0)
        # pretraining moved the embedding and backbone, never the classification head
        moved = not torch.equal(value, scratch[key])
        assert moved == key.startswith(("embed.", "backbone.")), key
    lines = (tmp_path / "run" / "pretrain.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"pretrain_step": 12' in lines[-1]


class Stop(Exception):
    pass


def stop(*args, **kwargs):
    raise Stop()


def test_resume_after_pretraining_does_not_pretrain_again(tmp_path, monkeypatch):
    pretrained = spy_pretrain(monkeypatch)
    # a crash at the first fine-tuning batch, after the checkpoint of the pretrained weights
    real = Trainer.train_batch

    def stop_fine_tuning(self, batch):
        return real(self, batch) if isinstance(self.objective, PretrainObjective) else stop()

    monkeypatch.setattr(Trainer, "train_batch", stop_fine_tuning)
    with pytest.raises(Stop):
        trainer(tiny_recipe(steps=2), tmp_path / "run").fit()
    assert len(pretrained) == 1
    monkeypatch.undo()
    again, first = spy_pretrain(monkeypatch), spy_first_batch(monkeypatch)
    resumed = trainer(tiny_recipe(steps=2), tmp_path / "run", resume=True)
    resumed.fit()
    assert again == [] and resumed.state.pretrained and resumed.state.step == 3
    for key, value in pretrained[0].items():
        torch.testing.assert_close(first[0][key], value, rtol=0, atol=0)


def test_resume_during_pretraining_finds_no_checkpoint_and_a_fresh_start_pretrains(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "pretrain", stop)
    with pytest.raises(Stop):
        trainer(tiny_recipe(steps=2), tmp_path / "run")
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match="no 'last' checkpoint"):
        trainer(tiny_recipe(steps=2), tmp_path / "run", resume=True).fit()
    snapshots = spy_pretrain(monkeypatch)
    trainer(tiny_recipe(steps=2), tmp_path / "run").fit()
    assert len(snapshots) == 1


def test_resume_refuses_a_checkpoint_trained_without_pretraining(tmp_path):
    trainer(tiny_recipe(), tmp_path / "run").fit()
    with pytest.raises(ValueError, match="trained without train.pretrain"):
        trainer(tiny_recipe(steps=2), tmp_path / "run", resume=True).fit()


def error_of(recipe: dict) -> str:
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(recipe)
    return str(info.value)


def test_recipe_pretrain_section():
    recipe = recipe_from_dict(tiny_recipe(objective="causal", steps=5, epochs=None, lr=3e-4))
    pretrain = recipe.train.pretrain
    assert (pretrain.objective, pretrain.steps, pretrain.epochs, pretrain.lr) == ("causal", 5, None, 3e-4)
    assert recipe_from_dict(tiny_recipe()).train.pretrain is None
    assert error_of(tiny_recipe(objective="bert")) == (
        "<dict>: train.pretrain.objective: expected one of 'mlm', 'causal', got 'bert'"
    )
    assert error_of(tiny_recipe(epochs=None)) == (
        "<dict>: train.pretrain.epochs: set epochs or steps (or both: whichever ends first), got both null"
    )
    assert error_of(tiny_recipe(objective="causal", mask_prob=0.3)) == (
        "<dict>: train.pretrain.mask_prob: only objective 'mlm' masks tokens (objective is 'causal'); leave it out, "
        "got 0.3"
    )
    assert "train.pretrain.mask_prob: expected a number in (0, 1)" in error_of(tiny_recipe(mask_prob=1.0))


def test_recipe_refuses_pretraining_it_cannot_do():
    causal = tiny_recipe(objective="causal")
    causal["model"]["attention"] = {"name": "nystrom"}
    message = error_of(causal)
    assert message.startswith("<dict>: train.pretrain.objective: attention 'nystrom' has no causal mode; use 'mlm'")
    assert message.endswith(", got 'causal'") and "\n" not in message
    series = tiny_recipe(objective="mlm")
    series["data"] = {"name": "elecdemand", "options": {"lookback": 96, "horizon": 24}}
    series["model"]["sequence"] = {"input": "series"}
    series.update(task="forecast", metrics=["mse"])
    assert error_of(series) == (
        "<dict>: train.pretrain: predicts tokens: needs model.sequence.input 'tokens' or 'dna', got 'series'"
    )


def test_pretraining_is_a_trainer_run_with_the_recipe_s_schedule_and_non_finite_handling(tmp_path, monkeypatch):
    # a constant schedule: every pretraining step at pretrain.lr (the old loop of its own always decayed by cosine)
    recipe = tiny_recipe(steps=4, epochs=None, lr=3e-4)
    recipe["schedule"] = {"name": "constant"}
    recipe["train"]["skip_nonfinite"] = 1
    # the second pretraining batch's loss is NaN: its step is skipped, as the Trainer skips any run's
    real, calls = PretrainObjective.loss, []

    def nan_once(self, module, batch):
        calls.append(batch)
        loss = real(self, module, batch)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(PretrainObjective, "loss", nan_once)
    run = trainer(recipe, tmp_path / "run")
    run.fit()
    folder = tmp_path / "run" / "pretrain"
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records] == [3e-4] and records[0]["step"] == 4 and len(calls) == 4
    state = json.loads((folder / "checkpoints" / "last" / "meta.json").read_text())
    assert state["skipped_batches"] == 1 and state["step"] == 4
    assert all(torch.isfinite(v).all() for v in run.plain_model.state_dict().values())


def test_the_trainer_never_pretrains_by_itself(tmp_path, monkeypatch):
    # pretraining is a stage before the Trainer (zoo.train.stages): constructing one trains nothing
    monkeypatch.setattr(stages, "pretrain", stop)
    reset_accelerate()
    with pytest.raises(ValueError, match="asks for train.pretrain, which runs before the Trainer"):
        Trainer(recipe_from_dict(tiny_recipe(steps=2)), tmp_path / "run")
    assert not (tmp_path / "run").exists()
