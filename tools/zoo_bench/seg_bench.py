"""The segmentation comparison (`make bench-seg`) behind benchmarks/cpu/seg_megamnist_quick.md: the quick
segmentation recipe (`recipes/seg_megamnist_quick.yaml`, an 8 x 8 patch grid on 64-px MegaMNIST canvases) trained
with each attention layout for the same steps and seeds, its test mIoU beside the all-background rule's and beside
a plain CNN without attention (`PlainCNN`) trained by the same Trainer at the same budget.

    PYTHONPATH=tools .venv/bin/python -m zoo_bench.seg_bench --seeds 2

Each run is the leaderboard's (`zoo_bench.leaderboard.train_and_test`: tools/train.py --test in a fresh process;
test mIoU and pixel accuracy of the best checkpoint on validation, samples/s, peak resident set); the CNN anchor
runs in a fresh process too (`--anchor-run`), with the recipe's data, optimizer, schedule, steps and validation,
only the model swapped. The baseline is the one the test writes to each run's eval.json (the same test split for
every run). Results are saved after every run in a JSON beside the report, and a stopped comparison resumes when
its protocol is the same.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from zoo._validate import check_int
from zoo.cli import add_overrides, run_cli
from zoo.config import load_recipe, recipe_to_dict

from ._study import image_layouts, read_saved, run_cells, write_json
from .leaderboard import overrides, read_run, run_child, train_and_test
from .machine import REPO_ROOT as ROOT
from .machine import default_device, device_name, shown_path, versions

__all__ = ["ANCHOR", "LAYOUTS", "PlainCNN", "main", "report", "run_comparison"]

RECIPE = ROOT / "recipes" / "seg_megamnist_quick.yaml"
# The windowed layouts on the 8 x 8 grid: local's +-12 band is a patch row and a half either side; ViTDet's global
# blocks are the last of each half (1 and 3 of 4).
LAYOUTS = image_layouts(
    ("softmax", "window2d", "window2d + global", "neighborhood", "local", "linear", "performer"),
    local_window=12,
    global_blocks=(1, 3),
)
# the row of the plain CNN trained beside the layouts (no attention: the anchor a ViT must beat or approach)
ANCHOR = "plain CNN (no attention)"
# every run of the sweep: the recipe's own schedule
SWEEP_SETS: tuple[str, ...] = ()
# what was tuned, on which split: stated in the report
TUNING = (
    "the recipe's decoder and steps were chosen on the validation split with softmax, seed 0 "
    "(benchmarks/cpu/seg_megamnist_quick_decoders.json: ViTDet's simple feature pyramid against the progressive "
    "decoder on the same 800-step schedule); the masks (each digit's ink box) were chosen for what they label, "
    "before any run; lr and sizes are the recipe's; the windows are fixed in advance at 16-25 keys per query; the "
    "CNN anchor was not tuned; nothing was tuned on the test split"
)


class PlainCNN(nn.Module):
    """The anchor without attention: images `[b, c, H, W]` -> logits `[b, k, H, W]`. Five 3x3 convolutions (each
    with BatchNorm and ReLU): one at full resolution, two of stride 2, two at a quarter of it (the last dilated by
    2), which see 33 x 33 px, more than a digit; their logits upsampled bilinearly and added to a 1x1 convolution of
    the full-resolution layer's features, so that edges stay sharp."""

    def __init__(self, in_chans: int, num_classes: int, width: int = 32) -> None:
        super().__init__()

        def conv(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride=stride, padding=dilation, dilation=dilation, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            )

        self.full = conv(in_chans, width)
        self.body = nn.Sequential(
            conv(width, 2 * width, stride=2),
            conv(2 * width, 2 * width, stride=2),
            conv(2 * width, 2 * width),
            conv(2 * width, 2 * width, dilation=2),
            nn.Conv2d(2 * width, num_classes, 1),
        )
        self.fine = nn.Conv2d(width, num_classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        full = self.full(x)  # [b, width, H, W]
        coarse = F.interpolate(self.body(full), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return coarse + self.fine(full)


def train_anchor(recipe_path: Path, items: Sequence[str], run_dir: Path) -> None:
    """Train `PlainCNN` by the Trainer on `recipe_path` with `items` (`--set`), in `run_dir` (metrics.jsonl,
    train_summary.json, checkpoints), and test its best checkpoint on validation: `run_dir/eval.json` (metrics, the
    test split's baselines, wall_s, cpu_s of the whole process), as `tools/train.py --test` writes it."""
    from safetensors.torch import load_file

    from zoo.evaluate import evaluate
    from zoo.splits import build_split
    from zoo.train.loop import Trainer

    recipe = load_recipe(recipe_path, list(items))
    test_set = build_split(recipe, "test")
    model = PlainCNN(test_set.in_chans, test_set.num_classes)
    Trainer(recipe, run_dir, model=model).fit()
    start = time.perf_counter()
    model.load_state_dict(load_file(run_dir / "checkpoints" / "best" / "model.safetensors"))
    metrics = evaluate(model, recipe=recipe, split="test", num_classes=test_set.num_classes)["metrics"]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "metrics": {key: value for key, value in metrics.items() if isinstance(value, (int, float))},
        "baselines": test_set.baselines(),
        "wall_s": round(time.perf_counter() - start, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
    }
    write_json(run_dir / "eval.json", result)


def anchor_run(recipe: dict[str, Any], seed: int, budget_steps: int, run_dir: Path, *, timeout: float, extra=()):
    """One seed of the CNN anchor in a fresh process -> its record, as `train_and_test` gives a layout's."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    items = overrides(recipe, recipe["model"]["attention"]["name"], seed, budget_steps, {}, tuple(extra))
    command = [sys.executable, "-m", "zoo_bench.seg_bench", "--anchor-run", str(run_dir), "--set", *items]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tools"), os.environ.get("PYTHONPATH")])),
    }
    child = run_child(command, run_dir / "train.log", timeout, env=env)
    record: dict[str, Any] = {"variant": ANCHOR, "seed": seed, "options": {}, "run_dir": str(run_dir)}
    record.update(train_wall_s=child["wall_s"], peak_rss_mib=child["peak_rss_mib"], peak_mib=child["peak_rss_mib"])
    if child["returncode"] is None:
        return {**record, "status": "timeout", "message": f"training and testing killed after {timeout:g} s"}
    if child["returncode"] != 0:
        tail = (run_dir / "train.log").read_text().strip().splitlines()[-1:] or ["no output"]
        return {**record, "status": "error", "message": tail[0][:300]}
    return {**record, **read_run(run_dir)}


def _save(results: dict[str, Any], out: Path) -> None:
    results["summary"] = summarize(results)
    write_json(out.with_suffix(".json"), results)
    out.write_text(report(results))


def recipe_steps(recipe: dict[str, Any]) -> int:
    """The steps the recipe itself trains: train.max_steps, else its epochs of whole batches."""
    data, train = recipe["data"], recipe["train"]
    return train.get("max_steps") or train["epochs"] * (data["train_samples"] // data["batch_size"])


def _protocol(
    recipe: dict[str, Any], budget_steps: int, seeds: int, layouts: list[str], sets: Sequence[str]
) -> dict[str, Any]:
    return {
        "recipe": shown_path(RECIPE),
        "budget_steps": budget_steps,
        "recipe_steps": recipe_steps(recipe),
        "batch_size": recipe["data"]["batch_size"],
        "lr": recipe["optim"]["lr"],
        "warmup_steps": recipe["schedule"]["warmup_steps"],
        "decoder": _decoder(recipe["model"]),
        "masks": recipe["data"]["options"].get("mask", "box"),
        "anchor": ANCHOR if ANCHOR in layouts else None,
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
    """The recipe's decoder as the report names it: `progressive decoder (16 channels)`, `linear decoder`."""
    width = f" ({model['decoder_channels']} channels)" if model["decoder"] != "linear" else ""
    return f"{model['decoder']} decoder{width}"


def run_comparison(
    out: Path,
    *,
    seeds: int,
    budget_steps: int | None,
    runs_dir: Path,
    layouts: Sequence[str] | None = None,
    anchor: bool = True,
    timeout: float = 3600.0,
    sets: Sequence[str] = (),
    log=print,
) -> dict[str, Any]:
    """Train and test every layout x seed (seed-major), then the CNN anchor per seed (`anchor`), save the JSON and
    the report after each run; resumes from `out`'s JSON when its steps and overrides are this comparison's.
    `budget_steps`: default the recipe's own. `sets`: recipe overrides every run gets after the layout's (fewer
    validation and test canvases, say), kept in the protocol."""
    check_int("seeds", seeds, 1)
    layouts = list(layouts or LAYOUTS)
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layout {unknown[0]!r}; the layouts: {', '.join(LAYOUTS)}")
    recipe = recipe_to_dict(load_recipe(RECIPE, list(sets)))
    budget_steps = check_int("budget_steps", recipe_steps(recipe) if budget_steps is None else budget_steps, 1)
    layouts += [ANCHOR] if anchor else []
    saved = read_saved(out.with_suffix(".json"))
    same = all(saved.get("protocol", {}).get(key) == value for key, value in (("budget_steps", budget_steps),
               ("sets", [*SWEEP_SETS, *sets])))  # fmt: skip
    if same:
        # a resumed comparison that runs some layouts keeps the ones it already holds in its table
        kept = set(layouts) | set(saved["protocol"]["layouts"]) | {run["layout"] for run in saved.get("runs", [])}
        layouts = [name for name in [*LAYOUTS, ANCHOR] if name in kept]
    proto = _protocol(recipe, budget_steps, seeds, layouts, sets)
    results = {"protocol": proto, "runs": saved.get("runs", []) if same else []}

    def train(cell: tuple[int, str]) -> dict[str, Any]:
        seed, layout = cell
        run_dir = runs_dir / f"{_slug(layout)}_seed{seed}"
        before = _children_cpu_s()
        if layout == ANCHOR:
            record = anchor_run(recipe, seed, budget_steps, run_dir, timeout=timeout, extra=(*SWEEP_SETS, *sets))
        else:
            spec = LAYOUTS[layout]
            record = train_and_test(
                RECIPE, recipe, spec["attention"], seed, budget_steps, run_dir,
                options=spec["options"], timeout=timeout, extra=(*SWEEP_SETS, *spec.get("extra", ()), *sets),
            )  # fmt: skip
        # user + system seconds of the run's process tree (training, validation and test), what a shared machine
        # does not inflate as it does wall time
        record["cpu_s"] = round(_children_cpu_s() - before, 1)
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


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _baselines(run_dir: Path) -> dict[str, dict[str, float]]:
    path = run_dir / "eval.json"
    return json.loads(path.read_text()).get("baselines", {}) if path.is_file() else {}


def _slug(layout: str) -> str:
    """A layout's name as a folder name: `window2d + global [1, 3]` -> `window2d+global[1_3]`."""
    return layout.replace(" ", "").replace(",", "_").replace("(", "").replace(")", "")


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
            "cpu_s": _mean_spread([r["cpu_s"] for r in done if r.get("cpu_s")])[0],
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


def _masks(proto: dict[str, Any]) -> str:
    # a comparison saved before masks were a choice labelled the digits' ink
    kind = proto.get("masks", "ink")
    return "each digit's ink box labelled" if kind == "box" else "each digit's ink labelled"


def _budget(proto: dict[str, Any]) -> str:
    if proto["budget_steps"] == proto["recipe_steps"]:
        return "the recipe's own steps"
    return f"the recipe itself runs {proto['recipe_steps']}: fewer here so that the sweep fits a shared 2-core machine"


def _sets(proto: dict[str, Any]) -> str:
    return f", every run with `{' '.join(proto['sets'])}`" if proto["sets"] else ""


def _anchor_line(proto: dict[str, Any]) -> list[str]:
    if not proto.get("anchor"):
        return []
    return [
        f"- {ANCHOR}: `PlainCNN` of tools/zoo_bench/seg_bench.py (five 3x3 convolutions, two of stride 2, 33 px "
        "seen, a full-resolution 1x1 path), trained by the same Trainer on the same recipe, steps, seeds and "
        "optimizer, only the model swapped; its best checkpoint on validation tested."
    ]


def _versus(row: dict[str, Any], reference: dict[str, Any] | None) -> str:
    """`row`'s mean mIoU minus softmax's in points, and whether the gap exceeds the two spreads added."""
    if reference is None or row["miou"] is None or reference["miou"] is None:
        return "-"
    gap = 100 * (row["miou"] - reference["miou"])
    spreads = [value for value in (row["miou_spread"], reference["miou_spread"]) if value is not None]
    if len(spreads) < 2:
        return f"{gap:+.1f}"
    return f"{gap:+.1f} ({'apart' if abs(gap) > 100 * sum(spreads) else 'within spread'})"


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
            f"11 classes: background and the ten digits, {_masks(proto)}, clutter ignored; an 8 x 8 grid, 65 tokens) "
            f"trained with each layout for {proto['budget_steps']} steps of {proto['batch_size']} canvases "
            f"({_budget(proto)}), lr {proto['lr']:g} after {proto.get('warmup_steps', 5)} warm-up steps, then cosine"
            f"{_sets(proto)}; seeds {', '.join(map(str, proto['seeds']))} (initialisation and batch order; the data "
            "and its splits are the recipe's)."
        ),
        (
            "- Each run: `tools/train.py RECIPE --overwrite --test --set model.attention.name=V ... "
            f"train.max_steps={proto['budget_steps']} seed=S` in a fresh process; the tested checkpoint is the run's "
            # a comparison saved before the protocol named its test split ran the recipe's 256 canvases
            f"best on validation; test split of {proto.get('test_samples', 256)} canvases."
        ),
        *_anchor_line(proto),
        "- Score: test mIoU (%, the mean IoU over the classes present) and pixel accuracy (%), mean +- sample "
        "standard deviation over the seeds; `vs softmax`: the difference of the means in points, `apart` where it "
        "exceeds the two rows' standard deviations added, `within spread` where it does not; CPU s: user + system "
        "seconds of the run's processes (training, validation, test) on one thread.",
        f"- Tuning: {proto['tuning']}.",
        "",
        "| layout | test mIoU % | vs softmax | pixel accuracy % | seeds done | samples/s | CPU s | peak MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    reference = summary["layouts"].get("softmax")
    for layout in proto["layouts"]:
        row = summary["layouts"][layout]
        rate = "-" if row["samples_per_s"] is None else f"{row['samples_per_s']:.1f}"
        cpu = "-" if row.get("cpu_s") is None else f"{row['cpu_s']:.0f}"
        peak = "-" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}"
        cells = [
            layout,
            _cell(row["miou"], row["miou_spread"]),
            _versus(row, reference) if layout != "softmax" else "-",
            _cell(row["pixel_accuracy"], row["pixel_accuracy_spread"]),
            f"{row['finished']}/{len(proto['seeds'])}",
            rate,
            cpu,
            peak,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if baseline:
        scores = f"{_cell(baseline['miou'], None)} | - | {_cell(baseline['pixel_accuracy'], None)}"
        lines.append(f"| all-background rule | {scores} | - | - | - | - |")
    failures = [f"- {layout} {f}" for layout, row in summary["layouts"].items() for f in row["failures"]]
    if failures:
        lines += ["", "## Failures", "", *failures]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "cpu" / "seg_megamnist_quick.md")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--budget-steps", type=int, default=None, help="default: the recipe's own steps")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), metavar="LAYOUT", help="default: all")
    parser.add_argument("--no-anchor", action="store_true", help="leave the plain CNN anchor out")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "seg_bench")
    parser.add_argument("--anchor-run", type=Path, help=argparse.SUPPRESS)
    add_overrides(
        parser,
        "recipe overrides every run gets, e.g. data.test_samples=64 (kept in the protocol)",
        dest="sets",
    )
    args = parser.parse_args(argv)
    if args.anchor_run:
        # one seed of the CNN anchor, in the process anchor_run started
        train_anchor(RECIPE, args.sets, args.anchor_run)
        return
    run_comparison(
        args.out,
        seeds=args.seeds,
        budget_steps=args.budget_steps,
        runs_dir=args.runs_dir,
        layouts=args.layouts,
        anchor=not args.no_anchor,
        sets=args.sets,
    )


if __name__ == "__main__":
    run_cli(main)
