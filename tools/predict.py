#!/usr/bin/env python
"""Predict new inputs with a trained run: the best classes and their probabilities (forecast values for a
forecasting run), as CSV (stdout by default) or JSON. Inputs are read as the run's data was (see zoo.predict).

    tools/predict.py runs/quickstart some_images/                        # image files and folders
    tools/predict.py runs/quickstart a.png scan16.tif --output preds.json --top-k 3
    tools/predict.py runs/splice_quick genes.fa --output splice.csv       # one row per window (or record)
    tools/predict.py runs/yeast_coding_quick chrI.fa --output labels.csv  # one row per nucleotide: its label
    tools/predict.py runs/ucr_plaid_quick series.csv                      # one row per series (row of the file)
    tools/predict.py runs/elecdemand_quick demand.csv                     # the next horizon steps of the targets
    tools/predict.py runs/elecdemand_quick gaps.csv --set data.options.nan=interpolate   # missing values filled
    tools/predict.py runs/recall_mqar_quick ids.txt                       # token ids, a sequence per line: per token
    tools/predict.py runs/seg_megamnist_quick images/ --masks masks/      # a mask PNG per image, masks/legend.json

An input that cannot be read is named on stderr and skipped whole; the others are predicted. Files in a folder that
are not inputs, and empty FASTA records, are counted on stderr. --set changes how series files are read (the data
options nan and label_column); everything else is the run's own.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

from zoo.cli import add_overrides, run_cli
from zoo.hub.load import CHECKPOINTS, load_model
from zoo.predict import format_of, predict, write_predictions
from zoo.train.threads import set_run_threads


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "run", help="a run directory of tools/train.py (or a checkpoint folder, a save_pretrained folder)"
    )
    parser.add_argument(
        "inputs", nargs="+", help="files or folders to predict: images, FASTA, CSV or .ts series, token ids"
    )
    parser.add_argument("--output", help="a .csv or .json file (default: CSV on stdout)")
    parser.add_argument("--top-k", type=int, default=5, help="classes kept per prediction (default: 5)")
    parser.add_argument(
        "--masks",
        help="segmentation: the folder for the mask PNGs and legend.json (default: beside --output, its name with "
        "_masks, else masks/)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per forward pass (default: 32)")
    parser.add_argument(
        "--checkpoint", default="best", choices=CHECKPOINTS, help="the run's checkpoint (default: best)"
    )
    add_overrides(
        parser,
        "read the inputs with other data options, after the inputs: --set data.options.nan=mask "
        "(series: nan, label_column)",
    )
    parser.add_argument("--debug", action="store_true", help="print the full traceback of any error")
    return parser.parse_args()


def read_options(overrides: list[str]) -> dict:
    """`data.options.KEY=VALUE` items -> `{KEY: VALUE}` (VALUE read as YAML); a ValueError naming any other item."""
    options = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        name = key.strip().removeprefix("data.options.")
        if not sep or name == key.strip() or not name or "." in name:
            raise ValueError(f"--set {item!r}: predict takes data.options.KEY=VALUE, e.g. data.options.nan=mask")
        options[name] = yaml.safe_load(text) if text.strip() else text
    return options


def main() -> None:
    args = parse_args()
    logging.getLogger("zoo.predict").info(set_run_threads(args.run).line)
    options = read_options(args.overrides)
    if args.output:
        # a wrong suffix fails before the model runs
        format_of(args.output)
    model = load_model(args.run, checkpoint=args.checkpoint)
    masks = args.masks or (str(Path(args.output).with_suffix("")) + "_masks" if args.output else "masks")
    predictions = predict(
        model, args.inputs, top_k=args.top_k, batch_size=args.batch_size, progress=True, options=options,
        mask_dir=masks,
    )  # fmt: skip
    write_predictions(predictions, args.output or sys.stdout, None if args.output else "csv")
    skipped = f", {len(predictions.skipped)} input(s) skipped" if predictions.skipped else ""
    where = f" to {args.output}" if args.output else ""
    if predictions.rows and "mask" in predictions.rows[0]:
        where += f", masks to {masks}"
    print(f"wrote {len(predictions.rows)} predictions{where}{skipped}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
