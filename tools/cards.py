#!/usr/bin/env python
"""Write docs/cards.md, one card per registered attention variant, from the committed results
(tools/zoo_bench/cards.py): recall, ListOps, high-resolution images, conversion, CPU and GPU cost, ViT training at
1024 px on a GPU, GPU correctness;
and docs/choose.md, which attention to pick by setting, from the same results (tools/zoo_bench/choose.py).

    tools/cards.py                  # after any benchmark, leaderboard or sweep wrote new results
"""

from __future__ import annotations

import argparse

from zoo.cli import run_cli
from zoo_bench.cards import write_pages
from zoo_bench.machine import REPO_ROOT, shown_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO_ROOT / "docs"), help="the folder (default: docs)")
    args = parser.parse_args()
    for path in write_pages(args.out):
        print(f"wrote {shown_path(path)}")


if __name__ == "__main__":
    run_cli(main)
