#!/usr/bin/env python
"""Sweep attention variants over MQAR (Zoology's multi-query associative recall) at several lengths, widths, seeds
and learning rates, and write benchmarks/<device>/recall.{md,json,png}: test accuracy per cell (the learning rate
with the best validation accuracy), a heatmap per variant, accuracy against each variant's state per layer, and
the recall goals beside the measured numbers (tools/zoo_bench/recall.py). Each run is tools/train.py --test
(train, then test) in a fresh process; a failed run gets its record with the reason. Run it again to resume.

    tools/recall.py                                          # the whole default grid (many CPU hours)
    tools/recall.py --variants softmax linear performer local:window=16 --lengths 128 --widths 64 --lrs 3e-3
    tools/recall.py --variants linformer:k=16 --lengths 64 128 --seeds 0 1 2
    tools/recall.py --speed --out benchmarks/cpu        # time the saved sweep's variants: the recall-speed frontier
    tools/recall.py --lrs 3e-3 --jobs 14 --stop-after 330    # a machine held for a while: the runs that fit, saved
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from zoo.cli import add_overrides, run_cli
from zoo_bench.machine import default_device, device_slug
from zoo_bench.recall import DEFAULT_LENGTHS, DEFAULT_LRS, DEFAULT_VARIANTS, DEFAULT_WIDTHS, run_recall
from zoo_bench.recall_report import write_report
from zoo_bench.recall_speed import SPEED_LENGTH, measure_speed


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--recipe", default="recipes/recall_mqar_quick.yaml", help="the MQAR recipe (default: %(default)s)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(DEFAULT_VARIANTS),
        metavar="NAME[:KEY=VALUE,...]",
        help="attention variants with options, e.g. local:window=16 (default: every 1-D variant, see recall.py)",
    )
    parser.add_argument("--lengths", nargs="+", type=int, default=list(DEFAULT_LENGTHS), metavar="L")
    parser.add_argument("--widths", nargs="+", type=int, default=list(DEFAULT_WIDTHS), metavar="D")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1], metavar="S")
    parser.add_argument("--lrs", nargs="+", type=float, default=list(DEFAULT_LRS), metavar="LR")
    parser.add_argument("--budget-steps", type=int, metavar="N", help="steps per run (default: the recipe's)")
    parser.add_argument(
        "--pairs", type=int, metavar="P", help="key-value pairs at every length (default: L / 8, Zoology's grid)"
    )
    add_overrides(
        parser,
        "recipe overrides every run gets, e.g. data.batch_size=8 data.val_samples=64 (kept in the protocol)",
        dest="sets",
    )
    parser.add_argument("--out", help="output directory (default: benchmarks/<device name>)")
    parser.add_argument("--runs-dir", help="the runs' folders (default: runs/recall)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per process (default: %(default)s)")
    parser.add_argument("--retry-failed", action="store_true", help="run the saved sweep's failed runs again")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite recall.md and recall.png from the saved recall.json"
    )
    parser.add_argument(
        "--speed",
        action="store_true",
        help="time every variant of the saved sweep with its recall options (recall_speed.json, the frontier); "
        "variants the file already holds at the same length and settings are kept",
    )
    parser.add_argument(
        "--speed-length", type=int, default=SPEED_LENGTH, metavar="N", help="the length --speed times at (%(default)s)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at once (default: %(default)s; more only where cores are idle)"
    )
    parser.add_argument(
        "--stop-after",
        type=float,
        metavar="SECONDS",
        help="start no run after this many seconds; the running ones finish and are saved (the time a machine is held)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    out = Path(args.out) if args.out else Path("benchmarks") / device_slug(default_device())
    if args.report_only or args.speed:
        if not (out / "recall.json").is_file():
            flag = "--speed" if args.speed else "--report-only"
            raise FileNotFoundError(f"{flag} needs a saved sweep: {out / 'recall.json'} does not exist")
        results = json.loads((out / "recall.json").read_text())
        if args.speed:
            labels = [record["label"] for record in results["records"]]
            command = shlex.join(["tools/recall.py", *sys.argv[1:]])
            measure_speed(labels, out, length=args.speed_length, command=command, log=print)
        write_report(results, out)
        print(f"wrote {out}/recall.md and .png")
        return
    run_recall(
        args.recipe,
        out,
        variants=args.variants,
        lengths=args.lengths,
        widths=args.widths,
        seeds=args.seeds,
        lrs=args.lrs,
        budget_steps=args.budget_steps,
        runs_dir=args.runs_dir,
        timeout=args.timeout,
        retry_failed=args.retry_failed,
        jobs=args.jobs,
        stop_after=args.stop_after,
        pairs=args.pairs,
        sets=args.sets,
        command=shlex.join(["tools/recall.py", *sys.argv[1:]]),
        log=print,
    )
    print(f"wrote {out}/recall.json, .md and .png")


if __name__ == "__main__":
    run_cli(main)
