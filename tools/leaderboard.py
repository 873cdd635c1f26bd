#!/usr/bin/env python
"""Train every attention variant on one task recipe under the same step budget and seeds, test each run, and
write benchmarks/<device>/leaderboard_<task>.{md,json,png}: test accuracy (mean +- std over seeds), wall time,
samples/s, peak memory, and Long Range Arena's Table 1 row for the variant's family, with the protocol stated.
Each run is tools/train.py --test (train, then test) in a fresh process (tools/zoo_bench/leaderboard.py); a failed run
(error, out of memory, NaN, timeout) gets its row with the reason. Run it again to resume a stopped sweep.

    tools/leaderboard.py recipes/lra_listops_quick.yaml --budget-steps 600 --seeds 2
    tools/leaderboard.py recipes/lra_pathfinder32_quick.yaml --variants softmax linear --budget-steps 100 \
        --set train.pretrain.objective=mlm train.pretrain.epochs=1 --out benchmarks/cpu/pretrain_mlm
    tools/leaderboard.py recipes/ucr_acsf1_quick.yaml --variants softmax linear performer --budget-steps 200
    tools/leaderboard.py recipes/lra_listops.yaml --option linformer.max_seq_len=2048 synthesizer.max_seq_len=2048
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from zoo.attention import list_attentions
from zoo.cli import add_overrides, run_cli
from zoo.config import load_recipe
from zoo_bench.leaderboard import default_out, run_leaderboard
from zoo_bench.machine import default_device
from zoo_bench.sweep import parse_options


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="the task's recipe YAML")
    parser.add_argument(
        "--variants",
        nargs="+",
        metavar="NAME",
        help="attention variants (default: every registered one that serves the task)",
    )
    parser.add_argument(
        "--budget-steps", type=int, metavar="N", help="optimizer steps per run (default: the recipe's train.max_steps)"
    )
    parser.add_argument("--seeds", type=int, default=1, metavar="K", help="seeds 0..K-1 per variant (default: 1)")
    parser.add_argument(
        "--first-seed", type=int, default=0, metavar="S", help="start at seed S: seeds S..S+K-1 (default: 0)"
    )
    parser.add_argument(
        "--option",
        dest="options",
        nargs="+",
        action="extend",
        default=[],
        metavar="VARIANT.KEY=VALUE",
        help="an attention option of one variant, value read as YAML",
    )
    add_overrides(
        parser,
        "a recipe override for every run (train.pretrain.objective=mlm, say); pass another --out",
        dest="sets",
    )
    parser.add_argument(
        "--out",
        help="output directory (default: benchmarks/<device name>, or benchmarks/<device name>-<machine> where the "
        "former holds this task's sweep from another machine)",
    )
    parser.add_argument("--runs-dir", help="the runs' folders (default: runs/leaderboard/<task>)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="kill a training or test process after this many seconds (default: %(default)s)",
    )
    parser.add_argument("--retry-failed", action="store_true", help="run the saved sweep's failed runs again")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # the recipe takes a variant's own options only (timm's shared arguments are the model's)
    options = parse_options(args.options, args.variants or list_attentions(), shared=False)
    out = Path(args.out) if args.out else default_out(load_recipe(args.recipe).name, default_device())
    results = run_leaderboard(
        args.recipe,
        out,
        variants=args.variants,
        budget_steps=args.budget_steps,
        seeds=args.seeds,
        first_seed=args.first_seed,
        runs_dir=args.runs_dir,
        options=options,
        timeout=args.timeout,
        retry_failed=args.retry_failed,
        extra=tuple(args.sets),
        command=shlex.join(["tools/leaderboard.py", *sys.argv[1:]]),
        log=print,
    )
    print(f"wrote {out}/leaderboard_{results['protocol']['task']}.json, .md and .png")


if __name__ == "__main__":
    run_cli(main)
