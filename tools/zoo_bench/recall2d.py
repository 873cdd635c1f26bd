"""The 2-D recall probe (`make bench-recall2d`) behind benchmarks/cpu/recall2d.md: the images' MQAR
(`recipes/recall2d_quick.yaml`, zoo.data.images.recall2d: at every query frame, name the digit framed in its colour,
every query at least 4 cells from every digit) trained with each attention layout for the same steps and seeds, its
test accuracy on the query pixels beside the rules that recall nothing, and a verdict per layout: does it recall
across the image.

    OMP_NUM_THREADS=1 PYTHONPATH=tools .venv/bin/python -m zoo_bench.recall2d --seeds 2

Each run is the leaderboard's (`zoo_bench.leaderboard.train_and_test`: tools/train.py --test in a fresh process; test
pixel accuracy of the checkpoint best on validation, samples/s, peak resident set). The baselines are the ones the
test writes to each run's eval.json (the same test split for every run). Results are saved after every run in a JSON
beside the report; a stopped comparison resumes with the runs it holds, unless the task or the steps changed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from zoo._validate import check_int
from zoo.cli import run_cli
from zoo.config import load_recipe, recipe_to_dict

from ._study import image_layouts, read_saved, run_cells, write_json
from .leaderboard import train_and_test
from .machine import REPO_ROOT as ROOT
from .machine import default_device, device_name, shown_path, versions

__all__ = ["LAYOUTS", "RECALLS", "main", "report", "run_comparison", "summarize", "verdict"]

RECIPE = ROOT / "recipes" / "recall2d_quick.yaml"
# The layouts on the 8 x 8 grid with every digit at least 4 cells from the query: 4 x 4 windows never hold both
# (window2d); ViTDet's global blocks (the last of each half, 1 and 3 of 4) do; a 5 x 5 neighbourhood reaches 2 cells
# a block, 8 after 4 blocks; local's +-16 band reaches two rows a block in raster order; the linear family is global
# but keeps a fixed-size state.
LAYOUTS = image_layouts(
    ("softmax", "window2d", "window2d + global", "neighborhood", "local", "linear", "performer", "hedgehog"),
    local_window=16,
    global_blocks=(1, 3),
)
# the verdict's thresholds on the mean test accuracy, as 1-D MQAR's cards read recall: recalls at >= 0.9, does not
# below 0.5 (the rules that recall nothing score 0.25 or less here), partly between
RECALLS, FAILS = 0.9, 0.5


def verdict(accuracy: float | None) -> str:
    """The layout's 2-D recall verdict from its mean test accuracy on the query pixels (None: not measured)."""
    if accuracy is None:
        return "not measured"
    if accuracy >= RECALLS:
        return "recalls across the image"
    return "does not recall across the image" if accuracy < FAILS else "recalls partly"


def _save(results: dict[str, Any], out: Path) -> None:
    results["summary"] = summarize(results)
    write_json(out.with_suffix(".json"), results)
    out.write_text(report(results))


def run_comparison(
    out: Path, *, seeds: int, budget_steps: int, runs_dir: Path, layouts: Sequence[str], jobs: int = 1, log=print
):
    """Train and test every layout x seed, `jobs` runs at once; resumes from `out`'s JSON (a run it holds is not run
    again)."""
    check_int("seeds", seeds, 1)
    check_int("budget_steps", budget_steps, 1)
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layout {unknown[0]!r}; allowed: {', '.join(LAYOUTS)}")
    recipe = recipe_to_dict(load_recipe(RECIPE))
    saved = read_saved(out.with_suffix(".json"))
    if (saved.get("protocol", {}).get("data"), saved.get("protocol", {}).get("budget_steps")) != (
        recipe["data"]["options"],
        budget_steps,
    ):
        saved = {}  # runs of another task or budget are not this comparison's
    results = {
        "protocol": {
            "recipe": shown_path(RECIPE),
            "data": recipe["data"]["options"],
            "model": {k: recipe["model"][k] for k in ("embed_dim", "depth", "num_heads", "patch_size", "timm_kwargs")},
            "budget_steps": budget_steps,
            "batch_size": recipe["data"]["batch_size"],
            "lr": recipe["optim"]["lr"],
            "schedule": f"{recipe['schedule']['name']}, {recipe['schedule']['warmup_steps']} warm-up steps",
            "tuned": "nothing on the test split: every layout runs the recipe's lr and steps unchanged (set by softmax "
            "on the validation split); the test split scores each run's checkpoint best on validation",
            "seeds": sorted({*saved.get("protocol", {}).get("seeds", []), *range(seeds)}),
            "layouts": {name: LAYOUTS[name] for name in LAYOUTS},
            "device_name": device_name(default_device()),
            "versions": versions(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "runs": saved.get("runs", []),
        "baselines": saved.get("baselines", {}),
    }

    def train(cell: tuple[int, str]) -> dict[str, Any]:
        seed, layout = cell
        spec = LAYOUTS[layout]
        run_dir = runs_dir / f"{_slug(layout)}_seed{seed}"
        record = train_and_test(
            RECIPE, recipe, spec["attention"], seed, budget_steps, run_dir,
            options=spec["options"], timeout=3600.0, extra=tuple(spec.get("extra", ())),
        )  # fmt: skip
        eval_path = run_dir / "eval.json"
        if eval_path.is_file():
            results["baselines"] = json.loads(eval_path.read_text()).get("baselines", {}) or results["baselines"]
        return {"layout": layout, **record}

    def add(cell: tuple[int, str], record: dict[str, Any]) -> None:
        results["runs"].append(record)
        log(f"{cell[1]} seed {cell[0]}: {record['status']} {record.get('test', record.get('message'))}")

    done = {(r["layout"], r["seed"]) for r in results["runs"]}
    cells = [(seed, layout) for seed in range(seeds) for layout in layouts if (layout, seed) not in done]
    run_cells(cells, train, add, lambda: _save(results, out), jobs=jobs)
    _save(results, out)
    return results


def _slug(layout: str) -> str:
    """A layout's name as a folder name: `window2d + global [1, 3]` -> `window2d+global[1_3]`."""
    return layout.replace(" ", "").replace(",", "_")


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per layout: test accuracy on the query pixels per seed, their mean and sample standard deviation (None for one
    seed), the verdict, the median samples/s and the CPU seconds of its runs; failures by message."""
    rows = {}
    for layout in LAYOUTS:
        runs = [r for r in results["runs"] if r["layout"] == layout]
        done = [r for r in runs if r["status"] == "ok" and "pixel_accuracy" in r.get("test", {})]
        scores = [r["test"]["pixel_accuracy"] for r in done]
        mean = statistics.fmean(scores) if scores else None
        rates = [r["samples_per_s"] for r in done if r.get("samples_per_s")]
        rows[layout] = {
            "seeds": [r["seed"] for r in done],
            "accuracy": scores,
            "mean": mean,
            "spread": statistics.stdev(scores) if len(scores) > 1 else None,
            "verdict": verdict(mean),
            "samples_per_s": statistics.median(rates) if rates else None,
            "cpu_s": round(sum(r.get("cpu_s", 0.0) for r in runs), 1),
            "failures": [
                f"seed {r['seed']}: {r['status']} {r.get('message', '')[:120]}" for r in runs if r not in done
            ],
        }
    return {"layouts": rows, "baselines": results.get("baselines", {})}


def _percent(row: dict[str, Any]) -> str:
    if row["mean"] is None:
        return "not run"
    spread = "one seed" if row["spread"] is None else f"± {100 * row['spread']:.1f}"
    return f"{100 * row['mean']:.1f} {spread} ({', '.join(f'{100 * s:.1f}' for s in row['accuracy'])})"


def report(results: dict[str, Any]) -> str:
    proto, summary = results["protocol"], results.get("summary") or summarize(results)
    data, model = proto["data"], proto["model"]
    grid = data["grid"]
    baselines = summary["baselines"]
    scored = {name: scores["pixel_accuracy"] for name, scores in baselines.items() if "pixel_accuracy" in scores}
    rules = ", ".join(f"{name} {100 * score:.1f}" for name, score in scored.items())
    lines = [
        "# 2-D recall: the images' MQAR",
        "",
        (
            f"{proto['device_name']}, fp32, one thread per run, torch {proto['versions'].get('torch')}, "
            f"timm {proto['versions'].get('timm')}; {proto['date'][:10]}. Made by `make bench-recall2d` "
            "(tools/zoo_bench/recall2d.py); the task is zoo.data.images.recall2d."
        ),
        "",
        (
            f"**Task**: `{proto['recipe']}`, {grid} x {grid} cells of {data['cell_size']} px "
            f"(RGB, {grid * data['cell_size']} px, one cell per patch token) holding {data['num_keys']} white MNIST "
            "digits of distinct classes, each in a frame of its own colour, and "
            f"{data.get('num_queries', 1)} queries, empty frames of those colours; every query lies at least "
            f"{data['min_distance']} cells from every digit. Each query cell is labelled with the digit framed in its "
            "colour (10 classes), every other pixel is unlabelled; the score is the share of query pixels recalled "
            f"right. Rules that recall nothing, on the test split: {rules or 'not measured'} "
            "(`digit_on_canvas`: a digit guessed among those on the canvas, what a model that cannot pair a query "
            "with its digit can reach)."
        ),
        (
            f"**Protocol**: a ViT of {model['depth']} blocks, width {model['embed_dim']}, {model['num_heads']} heads, "
            "conv stem, no class token, a per-patch linear decoder (the only path across the image is the attention), "
            f"{proto['budget_steps']} steps of {proto['batch_size']}, AdamW lr {proto['lr']:g}, {proto['schedule']}; "
            f"seeds {', '.join(map(str, proto['seeds']))}; {proto['tuned']}."
        ),
        (
            f"**Verdict**: recalls across the image at a mean test accuracy >= {RECALLS:.0%}, does not below "
            f"{FAILS:.0%}, partly between."
        ),
        "",
        "| layout | options | test accuracy % (mean ± std; per seed) | verdict | samples/s | CPU s (all seeds) |",
        "|---|---|---|---|---|---|",
    ]
    for layout, spec in proto["layouts"].items():
        row = summary["layouts"][layout]
        options = ", ".join([*(f"{k}={v}" for k, v in spec["options"].items()), *spec.get("extra", ())]) or "-"
        rate = f"{row['samples_per_s']:.0f}" if row["samples_per_s"] else "-"
        lines.append(f"| {layout} | {options} | {_percent(row)} | {row['verdict']} | {rate} | {row['cpu_s'] or '-'} |")
    failures = [f"- {layout} {f}" for layout, row in summary["layouts"].items() for f in row["failures"]]
    if failures:
        lines += ["", "Failed runs:", "", *failures]
    missing = [name for name, row in summary["layouts"].items() if len(row["seeds"]) < len(proto["seeds"])]
    if missing:
        lines += [
            "",
            f"Not finished: {', '.join(missing)}; `make bench-recall2d` completes the table (it resumes from the "
            "JSON).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "cpu" / "recall2d.md")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--budget-steps", type=int, default=None, help="default: the recipe's train.max_steps")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), metavar="LAYOUT", help="default: all")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "recall2d")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    args = parser.parse_args(argv)
    steps = args.budget_steps or load_recipe(RECIPE).train.max_steps
    run_comparison(
        args.out, seeds=args.seeds, budget_steps=steps, runs_dir=args.runs_dir, layouts=args.layouts, jobs=args.jobs
    )


if __name__ == "__main__":
    run_cli(main)
