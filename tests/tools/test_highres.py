"""tools/zoo_bench/highres.py: the layouts are valid recipes, a step is timed on the model they build, the report
reads every record."""

from pathlib import Path

from zoo.config import load_recipe
from zoo_bench import highres
from zoo_bench._study import layout_sets

ROOT = Path(__file__).resolve().parents[2]


def test_every_layout_is_a_valid_recipe_with_its_attention_and_global_blocks():
    for name, layout in highres.LAYOUTS.items():
        recipe = load_recipe(highres.RECIPE, layout_sets(layout))
        assert recipe.model.attention.name == layout["attention"], name
        assert recipe.model.attention.options == layout["options"], name
    vitdet = load_recipe(highres.RECIPE, layout_sets(highres.LAYOUTS["window2d + global [2, 5]"]))
    assert vitdet.model.global_blocks == [2, 5] and vitdet.model.global_attention.name == "softmax"


def test_a_step_is_timed_on_the_layouts_model_at_the_asked_size():
    timed = highres.step_time(highres.RECIPE, "window2d + global [2, 5]", img_size=64, steps=1, threads=1)
    assert timed["tokens"] == 16 and timed["step_s"] > 0 and timed["peak_rss_mib"] > 50


def _results():
    run = {"status": "ok", "test": {"top1": 0.5}, "samples_per_s": 20.0, "peak_mib": 900.0}
    runs = [{"layout": "softmax", "seed": s, **run, "test": {"top1": 0.5 + s / 10}} for s in (0, 1)]
    runs.append({"layout": "performer", "seed": 0, "status": "nan", "message": "train_loss is nan at step 3"})
    steps = {"softmax": {"status": "ok", "step_s": 10.0, "peak_rss_mib": 2000.0, "tokens": 16384}}
    steps["window2d"] = {"status": "ok", "step_s": 2.5, "peak_rss_mib": 1000.0, "tokens": 16384}
    proto = {"recipe": "recipes/highres_quick.yaml", "budget_steps": 5, "seeds": [0, 1], "step_img_size": 512}
    proto |= {"step_threads": 2, "device_name": "a CPU", "versions": {"torch": "2"}, "date": "2026-11-25T00:00"}
    return {"protocol": proto, "runs": runs, "steps": steps}


def test_the_report_gives_mean_and_spread_the_ratio_to_softmax_and_failures():
    text = highres.report(_results())
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    assert "| 55.0 +- 7.1 | 20.0 | 900 | 10.00 | 1.00x | 2000 |" in rows["softmax"]
    assert "| 2.50 | 0.25x | 1000 |" in rows["window2d"] and "not run" in rows["window2d"]
    assert "nan: train_loss is nan at step 3" in rows["performer"]
