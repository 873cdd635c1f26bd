#!/usr/bin/env python
"""Evaluate a run's checkpoint: metrics and the trivial baselines beside them (classification: the training split's
majority class and chance; per-position labels: the majority label; segmentation: the all-background rule;
forecasting: the naive and linear forecasts) to <run>/eval.json, one printed line each; for classification tasks
the confusion matrix to <run>/confusion_<split>.png.

    tools/eval.py runs/quickstart
    tools/eval.py runs/quickstart --checkpoint last --split val
    tools/eval.py runs/elecdemand_quick        # with the seasonal-naive and linear forecasts' MSE / MAE
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from zoo.cli import log_to, run_cli
from zoo.evaluate import evaluation_lines, save_evaluation
from zoo.train.threads import set_run_threads


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run directory written by tools/train.py")
    parser.add_argument(
        "--checkpoint",
        default="best",
        help="best | last | a checkpoint directory | a .safetensors file (default: best)",
    )
    parser.add_argument("--split", default="test", choices=("val", "test"))
    parser.add_argument("--output", help="where to write the JSON (default: <run_dir>/eval.json)")
    parser.add_argument("--debug", action="store_true", help="print the full traceback of any error")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    run_dir = Path(args.run_dir)
    threads = set_run_threads(run_dir)
    # a folder that is not a run gets nothing written into it: the error is one line on stderr
    if (run_dir / "recipe.yaml").is_file():
        log_to(run_dir / "eval.log")
    logging.getLogger("zoo.evaluate").info(threads.line)
    result, path = save_evaluation(run_dir, checkpoint=args.checkpoint, split=args.split, output=args.output)
    print("\n".join(evaluation_lines(result, path)))


if __name__ == "__main__":
    run_cli(main)
