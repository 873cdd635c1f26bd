"""tools/zoo_bench/seg_bench.py: every layout is a valid recipe, the table's numbers are the runs' own (read back
from each run's eval.json), mean and spread over seeds, the gap to softmax against the spreads, the baseline and
CNN anchor rows, and failures."""

import json

import pytest
from helpers import sweep_runs_here

from zoo.config import load_recipe
from zoo_bench import seg_bench
from zoo_bench._study import layout_sets


def test_every_layout_is_a_valid_recipe_with_its_attention_and_global_blocks():
    warmup = load_recipe(seg_bench.RECIPE).schedule.warmup_steps
    for name, layout in seg_bench.LAYOUTS.items():
        recipe = load_recipe(seg_bench.RECIPE, [*seg_bench.SWEEP_SETS, *layout_sets(layout)])
        assert recipe.model.attention.name == layout["attention"], name
        assert recipe.model.attention.options == layout["options"], name
        assert recipe.schedule.warmup_steps == warmup, name
    vitdet = load_recipe(seg_bench.RECIPE, layout_sets(seg_bench.LAYOUTS["window2d + global [1, 3]"]))
    assert vitdet.model.global_blocks == [1, 3] and vitdet.model.global_attention.name == "softmax"
    assert {spec["attention"] for spec in seg_bench.LAYOUTS.values()} == {
        "softmax", "window2d", "neighborhood", "local", "linear", "performer",
    }  # fmt: skip


def _results():
    background = {"all_background": {"miou": 0.0871, "pixel_accuracy": 0.9581}}
    run = {"status": "ok", "samples_per_s": 20.0, "peak_mib": 900.0, "baselines": background}
    runs = [
        {"layout": "softmax", "seed": 0, **run, "test": {"miou": 0.25, "pixel_accuracy": 0.96}},
        {"layout": "softmax", "seed": 1, **run, "test": {"miou": 0.35, "pixel_accuracy": 0.98}},
        {"layout": "linear", "seed": 0, **run, "test": {"miou": 0.2, "pixel_accuracy": 0.97}},
        {"layout": "window2d", "seed": 0, **run, "test": {"miou": 0.1, "pixel_accuracy": 0.97}},
        {"layout": "window2d", "seed": 1, **run, "test": {"miou": 0.12, "pixel_accuracy": 0.97}},
        {"layout": "neighborhood", "seed": 0, **run, "test": {"miou": 0.29, "pixel_accuracy": 0.97}},
        {"layout": "neighborhood", "seed": 1, **run, "test": {"miou": 0.31, "pixel_accuracy": 0.97}},
        {"layout": seg_bench.ANCHOR, "seed": 0, **run, "cpu_s": 30.0, "test": {"miou": 0.5, "pixel_accuracy": 0.99}},
        {"layout": "performer", "seed": 0, "status": "nan", "message": "train_loss is nan at step 3", "baselines": {}},
    ]
    proto = {"recipe": "recipes/seg_megamnist_quick.yaml", "budget_steps": 5, "recipe_steps": 128, "batch_size": 32}
    proto |= {
        "lr": 2e-3,
        "decoder": "pyramid decoder (32 channels)",
        "sets": ["schedule.warmup_steps=5"],
        "seeds": [0, 1],
        "tuning": "none",
    }
    proto |= {"layouts": ["softmax", "linear", "window2d", "neighborhood", "performer", "local", seg_bench.ANCHOR]}
    proto |= {"device_name": "a CPU", "warmup_steps": 5, "masks": "box", "anchor": seg_bench.ANCHOR}
    proto |= {"versions": {"torch": "2"}, "date": "2026-11-28T00:00"}
    return {"protocol": proto, "runs": runs}


def test_the_table_gives_mean_and_spread_over_seeds_the_baseline_and_failures():
    text = seg_bench.report(_results())
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    # softmax: mIoU 25 and 35 -> mean 30.0, sample std 7.07; pixel accuracy 96 and 98 -> 97.0 +- 1.4
    assert rows["softmax"] == "| softmax | 30.0 +- 7.1 | - | 97.0 +- 1.4 | 2/2 | 20.0 | - | 900 |"
    assert rows["linear"] == "| linear | 20.0 | -10.0 | 97.0 | 1/2 | 20.0 | - | 900 |"
    # window2d 10 and 12 (std 1.41): 19 points below softmax, more than 7.07 + 1.41; neighborhood 30 +- 1.4 is not
    assert rows["window2d"].startswith("| window2d | 11.0 +- 1.4 | -19.0 (apart) |")
    assert rows["neighborhood"].startswith("| neighborhood | 30.0 +- 1.4 | +0.0 (within spread) |")
    assert rows["local"] == "| local | - | - | - | 0/2 | - | - | - |"
    assert rows[seg_bench.ANCHOR] == f"| {seg_bench.ANCHOR} | 50.0 | +20.0 | 99.0 | 1/2 | 20.0 | 30 | 900 |"
    assert rows["all-background rule"] == "| all-background rule | 8.7 | - | 95.8 | - | - | - | - |"
    assert "- performer seed 0: nan: train_loss is nan at step 3" in text
    assert "`schedule.warmup_steps=5`" in text and "5 steps of 32 canvases" in text
    assert "patch 8, pyramid decoder (32 channels);" in text


@pytest.mark.slow
def test_a_real_run_s_metrics_files_are_what_the_table_says(tmp_path, monkeypatch):
    sweep_runs_here(monkeypatch)  # tools/train.py --test in this process (tests/tools/test_leaderboard.py: fresh ones)
    out = tmp_path / "seg.md"
    # 16 validation and test canvases instead of the recipe's 256 each: a sixteenth of the evaluation
    fewer = ("data.val_samples=16", "data.test_samples=16")
    seg_bench.run_comparison(
        out, seeds=1, budget_steps=2, runs_dir=tmp_path / "runs", layouts=["window2d"], anchor=False, timeout=600,
        sets=fewer, log=lambda _: None,
    )  # fmt: skip
    saved = json.loads(out.with_suffix(".json").read_text())
    (run,) = saved["runs"]
    assert run["status"] == "ok", run
    assert saved["protocol"]["sets"] == [*seg_bench.SWEEP_SETS, *fewer] and run["test"]["samples"] == 16
    assert "test split of 16 canvases" in out.read_text()
    tested = json.loads((tmp_path / "runs" / "window2d_seed0" / "eval.json").read_text())
    row = saved["summary"]["layouts"]["window2d"]
    assert row["miou"] == tested["metrics"]["miou"] and row["miou_spread"] is None
    assert row["pixel_accuracy"] == tested["metrics"]["pixel_accuracy"]
    assert saved["summary"]["all_background"] == tested["baselines"]["all_background"]
    line = next(line for line in out.read_text().splitlines() if line.startswith("| window2d |"))
    assert (
        f"| {100 * tested['metrics']['miou']:.1f} | - | {100 * tested['metrics']['pixel_accuracy']:.1f} | 1/1 |" in line
    )
    # the run trained the layout asked for: 4 x 4 windows, 2 steps
    resolved = load_recipe(tmp_path / "runs" / "window2d_seed0" / "recipe.yaml")
    assert resolved.model.attention.options == {"window": 4} and run["steps"] == 2
