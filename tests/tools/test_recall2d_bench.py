"""tools/zoo_bench/recall2d.py: every layout is a valid recipe, the summary's means, spreads and verdicts follow
from the runs, and the cards read the verdict from the JSON."""

from zoo.config import load_recipe
from zoo_bench import cards, recall2d


def test_every_layout_is_a_valid_recipe_with_its_attention_and_global_blocks():
    for name, layout in recall2d.LAYOUTS.items():
        sets = [f"model.attention.name={layout['attention']}", *layout.get("extra", ())]
        sets += [f"model.attention.options.{key}={value}" for key, value in layout["options"].items()]
        recipe = load_recipe(recall2d.RECIPE, sets)
        assert recipe.model.attention.name == layout["attention"], name
        assert recipe.model.attention.options == layout["options"], name
    recipe = load_recipe(recall2d.RECIPE)
    # no class token: window2d's windows would otherwise reach across the image through it
    assert recipe.model.timm_kwargs == {"class_token": False, "global_pool": "avg"}
    # a per-patch decoder: no path across the image but the attention
    assert recipe.model.decoder == "linear"
    assert recipe.model.img_size == recipe.data.options["grid"] * recipe.data.options["cell_size"]


def _results():
    def run(layout, seed, accuracy):
        test = {"pixel_accuracy": accuracy, "miou": accuracy / 2}
        return {"layout": layout, "seed": seed, "status": "ok", "test": test, "samples_per_s": 50.0}

    runs = [run("softmax", 0, 0.96), run("softmax", 1, 0.92), run("window2d", 0, 0.18), run("window2d", 1, 0.16)]
    runs += [run("local", 0, 0.7), {"layout": "linear", "seed": 0, "status": "nan", "message": "loss is nan"}]
    proto = {"recipe": "recipes/recall2d_quick.yaml", "budget_steps": 5, "seeds": [0, 1], "batch_size": 32}
    proto |= {"data": {"grid": 10, "cell_size": 16, "num_keys": 6, "num_queries": 4, "min_distance": 4}, "lr": 1e-3}
    proto |= {"model": {"depth": 4, "embed_dim": 64, "num_heads": 4}, "schedule": "cosine", "tuned": "on val"}
    proto |= {"layouts": recall2d.LAYOUTS, "device_name": "a CPU", "versions": {}, "date": "2026-12-07T00:00"}
    baselines = {"majority": {"pixel_accuracy": 0.11, "miou": 0.011}, "digit_on_canvas": {"pixel_accuracy": 1 / 6}}
    return {"protocol": proto, "runs": runs, "baselines": baselines}


def test_the_summary_and_report_give_mean_spread_and_verdict_per_layout():
    results = _results()
    summary = recall2d.summarize(results)["layouts"]
    assert summary["softmax"]["mean"] == 0.94 and abs(summary["softmax"]["spread"] - 0.0283) < 1e-4
    assert summary["softmax"]["verdict"] == "recalls across the image"
    assert summary["window2d"]["verdict"] == "does not recall across the image"
    assert summary["local"]["verdict"] == "recalls partly" and summary["local"]["spread"] is None
    assert summary["linear"]["verdict"] == "not measured" and "nan" in summary["linear"]["failures"][0]
    text = recall2d.report(results)
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    assert "| 94.0 ± 2.8 (96.0, 92.0) | recalls across the image |" in rows["softmax"]
    assert "digit_on_canvas 16.7" in text and "Not finished: window2d + global [1, 3]" in text


def test_the_cards_read_the_verdict_and_rule_on_it():
    results = _results()
    results["summary"] = recall2d.summarize(results)
    fact = cards._recall2d([results], "softmax")
    assert fact.text == "94.0 ± 2.8: recalls across the image" and fact.value == 0.94
    assert cards._recall2d([results], "performer") is None
    facts = {"2-D recall": fact}
    assert "recalling across an image (2-D recall 0.94)" in cards.pick_this_when("softmax", facts)
    facts = {"2-D recall": cards._recall2d([results], "window2d")}
    assert "does not recall across an image (2-D recall 0.17)" in cards.pick_this_when("window2d", facts)
