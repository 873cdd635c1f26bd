"""The segmentation comparison (`make bench-seg`) behind benchmarks/cpu/seg_megamnist_quick.md: the quick
segmentation recipe (`recipes/seg_megamnist_quick.yaml`, an 8 x 8 patch grid on 64-px MegaMNIST canvases) trained
with each attention layout for the same steps and seeds, its test mIoU beside the all-background rule's.

    PYTHONPATH=tools .venv/bin/python -m zoo_bench.seg_bench --budget-steps 80 --seeds 2

Each run is the leaderboard's (`zoo_bench.leaderboard.train_and_test`: tools/train.py --test in a fresh process;
test mIoU and pixel accuracy of the best checkpoint on validation, samples/s, peak resident set); the baseline is
the one the test writes to each run's eval.json (the same test split for every run). Results are saved after every
run in a JSON beside the report, and a stopped comparison resumes when its protocol is the same.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from zoo._validate import check_int
from zoo.cli import add_overrides, run_cli
from zoo.config import load_recipe, recipe_to_dict

from ._study import read_saved, run_cells, write_json
from .leaderboard import train_and_test
from .machine import REPO_ROOT as ROOT
from .machine import default_device, device_name, shown_path, versions

__all__ = ["LAYOUTS", "main", "report", "run_comparison"]

RECIPE = ROOT / "recipes" / "seg_megamnist_quick.yaml"
# Each layout: the attention of every block, its options, and the `--set` items of another layout. On the 8 x 8
# grid the windowed ones see 16-25 keys per query: 4 x 4 windows, a 5 x 5 neighbourhood, local's +-12 band (a
# patch row and a half either side in raster order); ViTDet's layout puts global attention in the last block of
# each half (1 and 3 of 4). Performer with 64 features, as in the high-resolution comparison.
LAYOUTS: dict[str, dict[str, Any]] = {
    "softmax": {"attention": "softmax", "options": {}},
    "window2d": {"attention": "window2d", "options": {"window": 4}},
    "window2d + global [1, 3]": {
        "attention": "window2d",
        "options": {"window": 4},
        "extra": ("model.global_blocks=[1, 3]", "model.global_attention.name=softmax"),
    },
    "neighborhood": {"attention": "neighborhood", "options": {"kernel": 5}},
    "local": {"attention": "local", "options": {"window": 12}},
    "linear": {"attention": "linear", "options": {}},
    "performer": {"attention": "performer", "options": {"nb_features": 64}},
}
# every run of the sweep: a shorter warm-up than the recipe's 20 steps, for the shorter budget
SWEEP_SETS = ("schedule.warmup_steps=5",)
# what was tuned, on which split: stated in the report
TUNING = (
    "the recipe's decoder was chosen on the validation split (ViTDet's simple feature pyramid with 32 channels: "
    "Segmenter's linear decoder, and the linear decoder with 4-px patches, stayed at the all-background rule's "
    "validation mIoU after 100 steps of softmax); lr and sizes are the recipe's; the windows are fixed in advance at "
    "16-25 keys per query; nothing was tuned on the test split"
)


def sets(layout: dict[str, Any]) -> list[str]:
    """A layout's recipe overrides (`--set` items)."""
    items = [f"model.attention.name={layout['attention']}"]
    items += [f"model.attention.options.{key}={json.dumps(value)}" for key, value in layout["options"].items()]
    return items + list(layout.get("extra", ()))


def _save(results: dict[str, Any], out: Path) -> None:
    results["summary"] = summarize(results)
    write_json(out.with_suffix(".json"), results)
    out.write_text(report(results))


def _protocol(
    recipe: dict[str, Any], budget_steps: int, seeds: int, layouts: list[str], sets: Sequence[str]
) -> dict[str, Any]:
    return {
        "recipe": shown_path(RECIPE),
        "budget_steps": budget_steps,
        "recipe_steps": recipe["data"]["train_samples"] // recipe["data"]["batch_size"],
        "batch_size": recipe["data"]["batch_size"],
        "lr": recipe["optim"]["lr"],
        "decoder": _decoder(recipe["model"]),
        "sets": [*SWEEP_SETS, *sets],
        "test_samples": recipe["data"]["test_samples"],
        "seeds": list(range(seeds)),
        "layouts": layouts,
        "tuning": TUNING,
        "device_name": device_name(default_device()),
        "versions": versions(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _decoder(model: dict[str, Any]) -> str:
    """The recipe's decoder as the report names it: `pyramid decoder (32 channels)`, `linear decoder`."""
    width = f" ({model['decoder_channels']} channels)" if model["decoder"] == "pyramid" else ""
    return f"{model['decoder']} decoder{width}"


def run_comparison(
    out: Path,
    *,
    seeds: int,
    budget_steps: int,
    runs_dir: Path,
    layouts: Sequence[str] | None = None,
    timeout: float = 3600.0,
    sets: Sequence[str] = (),
    log=print,
) -> dict[str, Any]:
    """Train and test every layout x seed (seed-major), save the JSON and the report after each run; resumes from
    `out`'s JSON when its steps and overrides are this comparison's. `sets`: recipe overrides every run gets after
    the layout's (fewer validation and test canvases, say), kept in the protocol."""
    check_int("seeds", seeds, 1)
    check_int("budget_steps", budget_steps, 1)
    layouts = list(layouts or LAYOUTS)
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layout {unknown[0]!r}; the layouts: {', '.join(LAYOUTS)}")
    recipe = recipe_to_dict(load_recipe(RECIPE, list(sets)))
    saved = read_saved(out.with_suffix(".json"))
    proto = _protocol(recipe, budget_steps, seeds, layouts, sets)
    same = all(saved.get("protocol", {}).get(key) == proto[key] for key in ("budget_steps", "sets"))
    results = {"protocol": proto, "runs": saved.get("runs", []) if same else []}

    def train(cell: tuple[int, str]) -> dict[str, Any]:
        seed, layout = cell
        spec = LAYOUTS[layout]
        run_dir = runs_dir / f"{_slug(layout)}_seed{seed}"
        record = train_and_test(
            RECIPE, recipe, spec["attention"], seed, budget_steps, run_dir,
            options=spec["options"], timeout=timeout, extra=(*SWEEP_SETS, *spec.get("extra", ()), *sets),
        )  # fmt: skip
        record["baselines"] = _baselines(run_dir)
        return record

    def add(cell: tuple[int, str], record: dict[str, Any]) -> None:
        seed, layout = cell
        results["runs"].append({"layout": layout, **record})
        log(f"{layout} seed {seed}: {record['status']} {record.get('test', record.get('message'))}")

    done = {(r["layout"], r["seed"]) for r in results["runs"]}
    cells = [(seed, layout) for seed in range(seeds) for layout in layouts if (layout, seed) not in done]
    run_cells(cells, train, add, lambda: _save(results, out))
    _save(results, out)
    return results


def _baselines(run_dir: Path) -> dict[str, dict[str, float]]:
    path = run_dir / "eval.json"
    return json.loads(path.read_text()).get("baselines", {}) if path.is_file() else {}


def _slug(layout: str) -> str:
    """A layout's name as a folder name: `window2d + global [1, 3]` -> `window2d+global[1_3]`."""
    return layout.replace(" ", "").replace(",", "_")


def _mean_spread(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per layout: test mIoU and pixel accuracy, mean and sample standard deviation over the finished seeds; the
    all-background baseline (the same for every run: one test split)."""
    rows = {}
    for layout in results["protocol"]["layouts"]:
        runs = [r for r in results["runs"] if r["layout"] == layout]
        done = [r for r in runs if r["status"] == "ok" and "miou" in r.get("test", {})]
        miou, miou_spread = _mean_spread([r["test"]["miou"] for r in done])
        accuracy, accuracy_spread = _mean_spread([r["test"]["pixel_accuracy"] for r in done])
        rows[layout] = {
            "finished": len(done),
            "miou": miou,
            "miou_spread": miou_spread,
            "pixel_accuracy": accuracy,
            "pixel_accuracy_spread": accuracy_spread,
            "samples_per_s": _mean_spread([r["samples_per_s"] for r in done if r.get("samples_per_s")])[0],
            "peak_mib": max((r["peak_mib"] for r in done if r.get("peak_mib")), default=None),
            "failures": [
                f"seed {r['seed']}: {r['status']}: {r.get('message', '')[:120]}" for r in runs if r["status"] != "ok"
            ],
        }
    baselines = [
        r["baselines"]["all_background"] for r in results["runs"] if "all_background" in r.get("baselines", {})
    ]
    return {"layouts": rows, "all_background": baselines[0] if baselines else None}


def _cell(mean: float | None, spread: float | None, scale: float = 100.0) -> str:
    if mean is None:
        return "-"
    return f"{scale * mean:.1f}" + ("" if spread is None or math.isnan(spread) else f" +- {scale * spread:.1f}")


def report(results: dict[str, Any]) -> str:
    proto, summary = results["protocol"], results.get("summary") or summarize(results)
    baseline = summary["all_background"]
    lines = [
        "# Segmentation on a CPU: mIoU of the quick recipe per attention layout",
        "",
        (
            f"{proto['device_name']}, fp32, torch {proto['versions'].get('torch')}, "
            f"timm {proto['versions'].get('timm')}; "
            f"{proto['date'][:10]}. Made by `make bench-seg` (tools/zoo_bench/seg_bench.py)."
        ),
        "",
        "## Protocol",
        "",
        (
            f"- `{proto['recipe']}` (ViT of 4 blocks, width 64, patch 8, {proto['decoder']}; 64-px MegaMNIST canvases, "
            "11 classes: background and the ten digits, clutter ignored; an 8 x 8 grid, 65 tokens) trained with each "
            f"layout for {proto['budget_steps']} steps of {proto['batch_size']} canvases (the recipe itself runs "
            f"{proto['recipe_steps']}: fewer here so that the sweep fits a shared 2-core machine), lr {proto['lr']:g} "
            f"then cosine, every run with `{' '.join(proto['sets'])}`; seeds {', '.join(map(str, proto['seeds']))} "
            "(initialisation and batch order; the data and its splits are the recipe's)."
        ),
        (
            "- Each run: `tools/train.py RECIPE --overwrite --test --set model.attention.name=V ... "
            f"train.max_steps={proto['budget_steps']} seed=S` in a fresh process; the tested checkpoint is the run's "
            # a comparison saved before the protocol named its test split ran the recipe's 256 canvases
            f"best on validation; test split of {proto.get('test_samples', 256)} canvases."
        ),
        "- Score: test mIoU (%, the mean IoU over the classes present) and pixel accuracy (%), mean +- sample "
        "standard deviation over the seeds.",
        f"- Tuning: {proto['tuning']}.",
        "",
        "| layout | test mIoU % | pixel accuracy % | seeds done | samples/s | peak MiB |",
        "|---|---|---|---|---|---|",
    ]
    for layout in proto["layouts"]:
        row = summary["layouts"][layout]
        rate = "-" if row["samples_per_s"] is None else f"{row['samples_per_s']:.1f}"
        peak = "-" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}"
        cells = [
            layout,
            _cell(row["miou"], row["miou_spread"]),
            _cell(row["pixel_accuracy"], row["pixel_accuracy_spread"]),
            f"{row['finished']}/{len(proto['seeds'])}",
            rate,
            peak,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if baseline:
        scores = f"{_cell(baseline['miou'], None)} | {_cell(baseline['pixel_accuracy'], None)}"
        lines.append(f"| all-background rule | {scores} | - | - | - |")
    failures = [f"- {layout} {f}" for layout, row in summary["layouts"].items() for f in row["failures"]]
    if failures:
        lines += ["", "## Failures", "", *failures]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "cpu" / "seg_megamnist_quick.md")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--budget-steps", type=int, default=80)
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), metavar="LAYOUT", help="default: all")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "seg_bench")
    add_overrides(
        parser,
        "recipe overrides every run gets, e.g. data.test_samples=64 (kept in the protocol)",
        dest="sets",
    )
    args = parser.parse_args(argv)
    run_comparison(
        args.out,
        seeds=args.seeds,
        budget_steps=args.budget_steps,
        runs_dir=args.runs_dir,
        layouts=args.layouts,
        sets=args.sets,
    )


if __name__ == "__main__":
    run_cli(main)
