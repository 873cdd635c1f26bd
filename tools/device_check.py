#!/usr/bin/env python
"""The device check: correctness of every variant on the device against the CPU, the training throughput of every
shipped 1024-px recipe (and two at 2048 px), the bf16 speed sweep (1K to 64K tokens, batch 1 and 8), the GPU work's
families under train.compile, the long 1-D recipes at full length and the FlexAttention backend compiled there, each
part under its own time budget; results rewritten after every item (tools/zoo_bench/device_check.py).

    tools/device_check.py --out /tmp/check                       # CUDA: about 7 minutes on an H100
    tools/device_check.py --device cpu --out /tmp/check          # toy sizes on the CPU (the suite runs this)
    tools/device_check.py --parts correctness flex --out /tmp/check
    tools/device_check.py --parts bench --variants linear performer --out /tmp/check

`make device-check DEVICE_OUT=DIR` runs it with the system Python where no .venv exists (a bare GPU machine);
tools/device_lease.sh runs it, then the suite's device tests, in one GPU lease.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from zoo.cli import run_cli
from zoo_bench.device_check import PARTS, run_device_check


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    parser.add_argument(
        "--out", required=True, help="folder for device_check.json, device_check.md and the sweep report"
    )
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="default: all, in order")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[],
        metavar="NAME",
        help="the sweep's variants (default: those the speed targets name); softmax and projections always run",
    )
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply every part's time budget (default: %(default)s)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch.cuda.is_available() is False: use --device cpu")
    if args.budget_scale <= 0:
        raise ValueError(f"--budget-scale must be > 0, got {args.budget_scale:g}")
    results = run_device_check(device, Path(args.out), tuple(args.parts), args.budget_scale, tuple(args.variants))
    for name, part in results["parts"].items():
        failed = part.get("failed")
        print(
            f"{name}: {part['status']} in {part.get('wall_s')} s" + (f"; failed: {', '.join(failed)}" if failed else "")
        )
    print(f"wrote {args.out}/device_check.md and device_check.json")


if __name__ == "__main__":
    run_cli(main)
