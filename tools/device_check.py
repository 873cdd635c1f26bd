#!/usr/bin/env python
"""The device check: correctness of every variant on the device against the CPU, the training throughput of every
shipped 1024-px recipe (and two at 2048 px), the bf16 speed sweep (1K to 64K tokens, batch 1 and 8), the GPU work's
families under train.compile, the long 1-D recipes at full length and the FlexAttention backend compiled there, each
part under its own time budget; everything goes into one folder, rewritten after every item, so a run stopped early
keeps what finished (tools/zoo_bench/device_check.py).

    tools/device_check.py --out /tmp/check                       # CUDA
    tools/device_check.py --device cpu --out /tmp/check          # toy sizes on the CPU (the suite runs this)
    tools/device_check.py --parts correctness flex --out /tmp/check
    tools/device_check.py --parts bench --variants linear performer --out /tmp/check
    tools/device_check.py --budget train=300 --budget-scale 2 --out /tmp/check
    tools/device_check.py --fused-config-from /tmp/profile/kernel_profile.json --out /tmp/check

It assumes nothing about how the machine is reached. `make device-check DEVICE_OUT=DIR` runs it with the system
Python where no .venv exists (a bare GPU machine); the Makefile's device targets say how to carry wheels and data.
"""

from __future__ import annotations

import argparse
import json
import os
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
    parser.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="PART=SECONDS",
        help="one part's time budget in seconds, before --budget-scale (repeatable; default: the device's own)",
    )
    parser.add_argument(
        "--fused-config-from",
        metavar="JSON",
        help="a kernel_profile.json (tools/dev/kernel_profile.py): run with its `fastest_config` as ZOO_FUSED_CONFIG, "
        "unless ZOO_FUSED_CONFIG is set already",
    )
    return parser.parse_args()


def parse_budgets(items: list[str]) -> dict[str, float]:
    """`PART=SECONDS` items -> {part: seconds}."""
    budgets = {}
    for item in items:
        part, _, seconds = item.partition("=")
        if part not in PARTS:
            raise ValueError(f"--budget {item!r}: unknown part {part!r}; the parts are {', '.join(PARTS)}")
        try:
            budgets[part] = float(seconds)
        except ValueError:
            raise ValueError(f"--budget {item!r}: SECONDS must be a number, e.g. {part}=60") from None
        if budgets[part] <= 0:
            raise ValueError(f"--budget {item!r}: SECONDS must be > 0")
    return budgets


def use_profiled_config(path: str) -> None:
    """Export the profile's fastest layouts as ZOO_FUSED_CONFIG (recorded with the results), unless it is set."""
    if os.environ.get("ZOO_FUSED_CONFIG"):
        print(f"ZOO_FUSED_CONFIG={os.environ['ZOO_FUSED_CONFIG']} (already set; {path} not read)")
        return
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--fused-config-from {path}: no such file (write it with tools/dev/kernel_profile.py)")
    chosen = json.loads(file.read_text()).get("fastest_config", "")
    if chosen:
        os.environ["ZOO_FUSED_CONFIG"] = chosen
    print(f"ZOO_FUSED_CONFIG={chosen} (from {path}; empty: the kernels' own block sizes)")


def main() -> None:
    args = parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch.cuda.is_available() is False: use --device cpu")
    if args.budget_scale <= 0:
        raise ValueError(f"--budget-scale must be > 0, got {args.budget_scale:g}")
    budgets = parse_budgets(args.budget)
    if args.fused_config_from:
        use_profiled_config(args.fused_config_from)
    results = run_device_check(
        device, Path(args.out), tuple(args.parts), args.budget_scale, tuple(args.variants), budgets=budgets
    )
    for name, part in results["parts"].items():
        failed = part.get("failed")
        print(
            f"{name}: {part['status']} in {part.get('wall_s')} s" + (f"; failed: {', '.join(failed)}" if failed else "")
        )
    print(f"wrote {args.out}/device_check.md and device_check.json")


if __name__ == "__main__":
    run_cli(main)
