#!/usr/bin/env python
"""Regenerate every generated page from the committed results under benchmarks/ (tools/zoo_bench/pages.py):
docs/cards.md (one card per attention variant), docs/choose.md (which attention to pick, by setting),
docs/results/<machine>.md with their index docs/results/README.md (every result file of one machine), and the
"choosing an attention" table in README.md.

    tools/pages.py              # after any benchmark, leaderboard or sweep wrote new results (`make pages`)
    tools/pages.py --check      # exit 1 naming each page that is not what the results give
"""

from __future__ import annotations

import argparse

from zoo.cli import run_cli
from zoo_bench.machine import shown_path
from zoo_bench.pages import stale_pages, write_pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is out of date")
    args = parser.parse_args()
    if args.check:
        stale = stale_pages()
        if stale:
            raise SystemExit(f"out of date (run tools/pages.py): {', '.join(stale)}")
        print("every generated page is current")
        return
    for path in write_pages():
        print(f"wrote {shown_path(path)}")


if __name__ == "__main__":
    run_cli(main)
