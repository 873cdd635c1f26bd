"""The high-resolution comparison (`make bench-highres`) behind benchmarks/cpu/highres.md: one ViT recipe
(`recipes/highres_quick.yaml`, a 16 x 16 patch grid) trained with each attention layout for the same steps and
seeds, and one training step of the same models timed at 2048 px, a 128 x 128 grid (16,384 tokens).

    PYTHONPATH=tools .venv/bin/python -m zoo_bench.highres --out benchmarks/cpu/highres.md

Each training run is the leaderboard's (`zoo_bench.leaderboard.train_and_test`: tools/train.py --test in a fresh
process, test accuracy, samples/s, peak resident set); each step time is a fresh process too (this
module with `--step`): batch 1, AdamW, forward + backward + update, the median of the timed steps after a warm-up
step. Results are saved after every run in a JSON beside the report, and a stopped comparison resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from zoo._validate import check_int
from zoo.cli import run_cli
from zoo.config import load_recipe, recipe_to_dict
from zoo.data._sizes import ModelSizes

from ._study import image_layouts, layout_sets, read_saved, run_cells, write_json
from .leaderboard import run_child, train_and_test
from .machine import REPO_ROOT as ROOT
from .machine import default_device, device_name, shown_path, versions

__all__ = ["LAYOUTS", "main", "run_comparison", "step_time"]

RECIPE = ROOT / "recipes" / "highres_quick.yaml"
# The windowed layouts on the 16 x 16 grid: local's +-16 band is a patch row either side; ViTDet's global blocks are
# the last of each half (2 and 5 of 6).
LAYOUTS = image_layouts(
    ("softmax", "local", "window2d", "window2d + global", "neighborhood", "performer"),
    local_window=16,
    global_blocks=(2, 5),
)


def step_time(recipe_path: Path, layout: str, img_size: int, steps: int, threads: int) -> dict[str, Any]:
    """One training step of `layout`'s model at `img_size` px, batch 1 -> median seconds and the peak RSS."""
    import torch

    from zoo.kinds import get_model_kind

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    sizes = [f"model.img_size={img_size}", f"data.options.canvas_size={img_size}"]
    recipe = load_recipe(recipe_path, [*layout_sets(LAYOUTS[layout]), *sizes])
    kind = get_model_kind(recipe.model.kind)
    model = kind.build(recipe, ModelSizes(in_chans=1, num_classes=10), kind.task(recipe))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images, labels = torch.rand(1, 1, img_size, img_size), torch.tensor([3])
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    tokens = (img_size // recipe.model.patch_size) ** 2
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tokens": tokens, "step_s": statistics.median(times[1:]), "peak_rss_mib": round(peak_mib, 1)}


def _save(results: dict[str, Any], out: Path) -> None:
    write_json(out.with_suffix(".json"), results)
    out.write_text(report(results))


def run_comparison(
    out: Path, *, seeds: int, budget_steps: int, img_size: int, threads: int, runs_dir: Path, log=print
) -> dict[str, Any]:
    """Train and test every layout x seed (none with `seeds=0`: the step times only), time every layout's step at
    `img_size`; resumes from `out`'s JSON."""
    check_int("seeds", seeds, 0)
    check_int("budget_steps", budget_steps, 1)
    check_int("threads", threads, 1)
    check_int("img_size", img_size, 16)
    recipe = recipe_to_dict(load_recipe(RECIPE))
    saved = read_saved(out.with_suffix(".json"))
    results = {
        "protocol": {
            "recipe": shown_path(RECIPE),
            "budget_steps": budget_steps,
            "seeds": list(range(seeds)),
            "step_img_size": img_size,
            "step_threads": threads,
            "device_name": device_name(default_device()),
            "versions": versions(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "runs": saved.get("runs", []),
        "steps": saved.get("steps", {}),
    }

    def save() -> None:
        _save(results, out)

    def add_step(layout: str, step: dict[str, Any]) -> None:
        results["steps"][layout] = step
        log(f"{layout}: {img_size} px step {step}")

    pending = [layout for layout in LAYOUTS if layout not in results["steps"]]
    run_cells(pending, lambda layout: _step_child(layout, img_size, threads, runs_dir), add_step, save)

    def train(cell: tuple[int, str]) -> dict[str, Any]:
        seed, layout = cell
        spec = LAYOUTS[layout]
        return train_and_test(
            RECIPE, recipe, spec["attention"], seed, budget_steps, runs_dir / f"{_slug(layout)}_seed{seed}",
            options=spec["options"], timeout=7200.0, extra=tuple(spec.get("extra", ())),
        )  # fmt: skip

    def add_run(cell: tuple[int, str], record: dict[str, Any]) -> None:
        seed, layout = cell
        results["runs"].append({"layout": layout, **record})
        log(f"{layout} seed {seed}: {record['status']} {record.get('test', record.get('message'))}")

    done = {(r["layout"], r["seed"]) for r in results["runs"]}
    cells = [(seed, layout) for seed in range(seeds) for layout in LAYOUTS if (layout, seed) not in done]
    run_cells(cells, train, add_run, save)
    return results


def _slug(layout: str) -> str:
    """A layout's name as a folder or file name: `window2d + global [2, 5]` -> `window2d+global[2_5]`."""
    return layout.replace(" ", "").replace(",", "_")


def _step_child(layout: str, img_size: int, threads: int, runs_dir: Path) -> dict[str, Any]:
    runs_dir.mkdir(parents=True, exist_ok=True)
    # the child imports zoo_bench as the parent did, from wherever it was started
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tools"), os.environ.get("PYTHONPATH")])),
    }
    log = runs_dir / f"step_{_slug(layout)}.log"
    command = [sys.executable, "-m", "zoo_bench.highres", "--step", layout, "--img-size", str(img_size)]
    command += ["--threads", str(threads)]
    finished = run_child(command, log, timeout=1800.0, env=env)
    if finished["returncode"] != 0:
        return {"status": "error", "message": log.read_text()[-500:]}
    return {"status": "ok", **json.loads(log.read_text().strip().splitlines()[-1])}


def _accuracy(runs: list[dict[str, Any]]) -> tuple[float, float] | None:
    scores = [100 * r["test"]["top1"] for r in runs if r["status"] == "ok" and "test" in r]
    if not scores:
        return None
    return statistics.mean(scores), statistics.stdev(scores) if len(scores) > 1 else math.nan


def report(results: dict[str, Any]) -> str:
    proto = results["protocol"]
    steps = results["steps"]
    base_step = steps.get("softmax", {}).get("step_s")
    lines = [
        "# High resolution on a CPU: 2-D windows, per-block layouts and global attention",
        "",
        (
            f"{proto['device_name']}, fp32, torch {proto['versions'].get('torch')}, "
            f"timm {proto['versions'].get('timm')}; {proto['date'][:10]}. "
            "Made by `make bench-highres` (tools/zoo_bench/highres.py)."
        ),
        "",
        (
            f"**Accuracy**: `{proto['recipe']}` (6 blocks of width 64, patch 16, conv stem; 256-px MegaMNIST canvases, "
            "one 56-px digit among clutter, 10 classes; a 16 x 16 grid, 257 tokens) trained with each layout for "
            f"{proto['budget_steps']} steps of 32 canvases (seeds {', '.join(map(str, proto['seeds']))}), "
            "then tested on 500 canvases; training samples/s (median over the run's evaluations) and the peak "
            "resident set of the training process."
        ),
        (
            f"**Step at {proto['step_img_size']} px**: the same model on a "
            f"{proto['step_img_size'] // 16} x {proto['step_img_size'] // 16} grid, one training step (batch 1, AdamW, "
            "forward + backward + update, one step timed after a warm-up step, "
            f"{proto['step_threads']} threads, fresh process)."
        ),
        "",
        (
            "| layout | test top-1 % (mean +- std) | samples/s | train peak MiB | "
            f"step at {proto['step_img_size']} px (s) | vs softmax | step peak MiB |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for layout in LAYOUTS:
        runs = [r for r in results["runs"] if r["layout"] == layout]
        acc = _accuracy(runs)
        failed = [f"{r['status']}: {r.get('message', '')[:80]}" for r in runs if r["status"] != "ok"]
        acc_text = "not run" if not runs else "; ".join(failed)
        if acc is not None:
            acc_text = f"{acc[0]:.1f} (one seed)" if math.isnan(acc[1]) else f"{acc[0]:.1f} +- {acc[1]:.1f}"
        rates = [r["samples_per_s"] for r in runs if r.get("samples_per_s")]
        peaks = [r["peak_mib"] for r in runs if r.get("peak_mib")]
        step = steps.get(layout, {})
        step_s = step.get("step_s")
        ratio = f"{step_s / base_step:.2f}x" if step_s and base_step else ""
        lines.append(
            f"| {layout} | {acc_text} | {statistics.mean(rates):.1f} | {max(peaks):.0f} | "
            if rates and peaks
            else f"| {layout} | {acc_text} | | | "
        )
        lines[-1] += (
            f"{step_s:.2f} | {ratio} | {step['peak_rss_mib']:.0f} |" if step_s else f"{step.get('status', '')} | | |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "cpu" / "highres.md")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--budget-steps", type=int, default=400)
    parser.add_argument("--img-size", type=int, default=2048, help="canvas side of the timed step (default 2048)")
    parser.add_argument("--threads", type=int, default=2, help="threads of the timed step")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "highres")
    parser.add_argument("--step", choices=list(LAYOUTS), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        print(json.dumps(step_time(RECIPE, args.step, args.img_size, args.steps, args.threads)))
        return
    run_comparison(
        args.out,
        seeds=args.seeds,
        budget_steps=args.budget_steps,
        img_size=args.img_size,
        threads=args.threads,
        runs_dir=args.runs_dir,
    )


if __name__ == "__main__":
    run_cli(main)
