#!/usr/bin/env python
"""Train a recipe through accelerate.

tools/train.py recipes/quickstart.yaml
tools/train.py recipes/vit_performer_1024.yaml --set train.epochs=3 model.attention.options.nb_features=128
tools/train.py recipes/elecdemand_quick.yaml --set data.options.horizon=192
accelerate launch --num_processes 8 tools/train.py recipes/vit_performer_1024.yaml
tools/train.py recipes/quickstart.yaml --resume                  # continue from runs/quickstart/checkpoints/last
tools/train.py recipes/quickstart.yaml --resume-from best        # when last is damaged
tools/train.py recipes/ucr_acsf1_quick.yaml --test              # then its best checkpoint on the test split

Errors are one line; the full traceback of any error goes to <run dir>/train.log (--debug prints it). The first
Ctrl-C (or SIGTERM) finishes the current step, saves checkpoints/last and prints the command that resumes; a second one
stops at once.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from zoo.cli import add_overrides, log_to, run_cli
from zoo.config import load_recipe
from zoo.evaluate import evaluation_lines, save_evaluation
from zoo.hub.checkpoints import find_checkpoint
from zoo.train.distributed import end_processes
from zoo.train.loop import TrainingInterrupted
from zoo.train.stages import train


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="path of a recipe YAML file")
    add_overrides(
        parser,
        "override recipe values, e.g. --set train.epochs=3 model.attention.name=softmax",
    )
    parser.add_argument("--output", help="run directory (default: the recipe's output_dir, else runs/<name>)")
    parser.add_argument("--resume", action="store_true", help="continue from <run dir>/checkpoints/last")
    parser.add_argument(
        "--resume-from",
        choices=("last", "best"),
        help="continue from this checkpoint of the run dir (best: when last is damaged; the steps after it are redone)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a run directory that holds checkpoints (replaced once new ones exist)",
    )
    parser.add_argument(
        "--test",
        action="store_true",
        help="then test the best checkpoint in this process, as `tools/eval.py RUN` does (eval.json); one process "
        "only (test a distributed run with tools/eval.py)",
    )
    parser.add_argument("--debug", action="store_true", help="print the full traceback of any error")
    return parser.parse_args()


def resume_command(run_dir: Path) -> str:
    """This command line, continuing `run_dir` from checkpoints/last (a launcher's: the same launch with it)."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg in ("--overwrite", "--resume"):
            skip = False
            continue
        skip = arg == "--resume-from"
        if not skip and not arg.startswith("--resume-from="):
            args.append(arg)
    if "--output" not in args and not any(a.startswith("--output=") for a in args):
        args += ["--output", str(run_dir)]
    command = shlex.join([sys.executable, sys.argv[0], *args, "--resume"])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"the same launch of {shlex.join([sys.argv[0], *args, '--resume'])}"
    return command


def main() -> None:
    args = parse_args()
    recipe = load_recipe(args.recipe, args.overrides)
    run_dir = Path(args.output or recipe.output_dir or Path("runs") / recipe.name)
    resume = args.resume_from or ("last" if args.resume else None)
    if args.test and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(f"--test runs in one process: test this run afterwards with tools/eval.py {run_dir}")
    log_to(run_dir / "train.log")
    if not resume and find_checkpoint(run_dir) is not None:
        if not args.overwrite:
            raise FileExistsError(
                f"{run_dir} already holds checkpoints: pass --resume to continue, --overwrite to start again, "
                "or --output DIR"
            )
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    try:
        train(recipe, run_dir, resume=resume or False)
    except TrainingInterrupted as stop:
        raise TrainingInterrupted(f"{stop}; resume with: {resume_command(run_dir)}", stop.signum) from None
    if args.test:
        print("\n".join(evaluation_lines(*save_evaluation(run_dir, split="test"))))
    # a launcher's process exits here, with status 0
    end_processes()


if __name__ == "__main__":
    run_cli(main)
