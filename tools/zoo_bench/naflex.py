"""Native resolution against resize-to-square at the same token budget (benchmarks/cpu/naflex.json): one NaFlex
recipe (`recipes/naflex_quick.yaml` with the study's `--set` items: single MegaMNIST digits on canvases of mixed
sizes and aspect ratios up to 3:1) trained with each attention, each resize rule (`data.options.resize`: native or
square, both within `max_tokens` patches a sample) and each seed, then tested.

    PYTHONPATH=tools .venv/bin/python -m zoo_bench.naflex --out benchmarks/cpu/naflex.json

Each run is `tools/train.py --test` in a fresh process; its record holds test top-1, samples/s, the tokens a second
(valid patches, and padded positions the attention computes on), the run's CPU seconds (user + sys of the child)
and its wall time. The trivial baseline is the test split's most frequent class. Results are saved after every run
and a stopped study resumes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from zoo.config import load_recipe
from zoo.splits import build_split

from ._study import read_saved, run_cells, write_json
from .leaderboard import read_run, run_child
from .machine import REPO_ROOT as ROOT
from .machine import versions

RECIPE = ROOT / "recipes" / "naflex_quick.yaml"
ATTENTIONS = {"softmax": {}, "linear": {}, "window2d": {"window": 4}}
MODES = ("native", "square")
SEEDS = (0, 1)
# The task of the study: one 24-px digit a canvas (the class is that digit's), canvases 32-40 px on a side stretched
# up to 3:1, so that squashing into a square distorts the digit. The model is the recipe's at depth 4, batches of 1,024
# tokens and learning rate 3e-3 (chosen on the validation split with softmax native, seed 0, against the recipe's
# depth 2 and 512 tokens), trained on 8,192 canvases for 6 epochs.
STUDY_SETS = (
    "data.train_samples=8192", "data.val_samples=128", "data.test_samples=512", "train.epochs=6",
    "data.options.num_target=1", "data.options.num_other=0", "data.options.num_clutter=0",
    "data.options.digit_size=24", "data.options.sides=[32, 40]", "data.options.max_stretch=3.0",
    "data.options.batch_tokens=1024", "optim.lr=3e-3", "model.depth=4",
)  # fmt: skip


TUNED = "depth, batch tokens and learning rate on the validation split (softmax native, seed 0, 3 trials)"


def sets(attention: str, mode: str, seed: int) -> list[str]:
    items = [*STUDY_SETS, f"model.attention.name={attention}", f"data.options.resize={mode}", f"seed={seed}"]
    return items + [f"model.attention.options.{k}={v}" for k, v in ATTENTIONS[attention].items()]


def token_counts(mode: str) -> dict[str, float]:
    """Mean valid patches a training sample and mean padded positions a sample (the batches of one epoch)."""
    recipe = load_recipe(RECIPE, sets("softmax", mode, 0))
    train = build_split(recipe, "train")
    sampler = train.batch_sampler(train.batch_tokens, recipe.data.batch_size, True, recipe.seed)
    batches = list(sampler)
    padded = sum(len(b) * max(train.lengths[i] for i in b) for b in batches)
    samples = sum(len(b) for b in batches)
    return {
        "valid_tokens_per_sample": statistics.mean(train.lengths),
        "padded_tokens_per_sample": padded / samples,
        "samples_per_batch": samples / len(batches),
    }


def run_one(cell: tuple[str, str, int], out: Path) -> dict[str, Any]:
    attention, mode, seed = cell
    run_dir = ROOT / "runs" / "naflex_study" / f"{attention}_{mode}_{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(ROOT / "tools" / "train.py"), str(RECIPE), "--output", str(run_dir)]
    child = run_child([*command, "--overwrite", "--test", "--set", *sets(attention, mode, seed)], run_dir / "log", 3600)
    record = {"attention": attention, "resize": mode, "seed": seed, "cpu_s": child["cpu_s"], "wall_s": child["wall_s"]}
    if child["returncode"] != 0:
        return {**record, "status": "error", "message": (run_dir / "log").read_text()[-300:]}
    return {**record, **read_run(run_dir)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "cpu" / "naflex.json")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    args = parser.parse_args(argv)
    results = read_saved(args.out) or {"runs": []}
    if results.get("protocol", {}).get("sets") != list(STUDY_SETS):
        results = {"runs": []}  # runs of another protocol are not this study's
    results["protocol"] = {
        "recipe": "recipes/naflex_quick.yaml", "sets": list(STUDY_SETS), "attentions": ATTENTIONS,
        "resize": list(MODES), "seeds": list(SEEDS), "tuned": TUNED,
        "tokens": {mode: token_counts(mode) for mode in MODES}, "versions": versions(),
        "device": "cpu, 1 thread (OMP_NUM_THREADS=1), shared with other jobs: compare CPU seconds, not wall time",
    }  # fmt: skip
    test = build_split(load_recipe(RECIPE, sets("softmax", "native", 0)), "test")
    counts = Counter(test[i]["label"] for i in range(len(test)))
    results["trivial_top1"] = counts.most_common(1)[0][1] / len(test)
    done = {(r["attention"], r["resize"], r["seed"]) for r in results["runs"]}
    cells = [(a, m, s) for a in ATTENTIONS for m in MODES for s in SEEDS if (a, m, s) not in done]

    def add(cell, record):
        tokens = results["protocol"]["tokens"][cell[1]]
        rate = record.get("samples_per_s")
        if rate:
            record["valid_tokens_per_s"] = round(rate * tokens["valid_tokens_per_sample"], 1)
            record["padded_tokens_per_s"] = round(rate * tokens["padded_tokens_per_sample"], 1)
        results["runs"].append(record)

    def save() -> None:
        write_json(args.out, _summarised(results))

    run_cells(cells, lambda cell: run_one(cell, args.out), add, save, jobs=args.jobs)
    save()


def _samples_per_step(results: dict[str, Any], mode: str) -> float:
    """Mean samples a training batch under the token budget (from the protocol's token counts)."""
    return results["protocol"]["tokens"][mode]["samples_per_batch"]


def _summarised(results: dict[str, Any]) -> dict[str, Any]:
    """The runs, and per (attention, resize) the mean and spread over seeds of test top-1 and tokens a second."""
    summary = {}
    for attention in ATTENTIONS:
        for mode in MODES:
            runs = [r for r in results["runs"] if (r["attention"], r["resize"]) == (attention, mode) and "test" in r]
            if not runs:
                continue
            top1 = [r["test"]["top1"] for r in runs]
            summary[f"{attention} {mode}"] = {
                "top1_mean": round(statistics.mean(top1), 4),
                "top1_spread": round(max(top1) - min(top1), 4),
                "valid_tokens_per_s": round(statistics.mean(r.get("valid_tokens_per_s", 0) for r in runs), 1),
                # patches trained per CPU second of the whole run (start-up, data and tests included): steadier than
                # a wall-clock rate on a machine shared with other jobs
                "trained_tokens_per_cpu_s": round(
                    statistics.mean(r["steps"] for r in runs)
                    / statistics.mean(r["cpu_s"] for r in runs)
                    * results["protocol"]["tokens"][mode]["valid_tokens_per_sample"]
                    * _samples_per_step(results, mode),
                    1,
                ),
                "cpu_s_mean": round(statistics.mean(r["cpu_s"] for r in runs), 1),
                "seeds": len(runs),
            }
    return {**results, "summary": summary}


if __name__ == "__main__":
    main()
