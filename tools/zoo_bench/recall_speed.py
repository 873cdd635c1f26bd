"""Recall against throughput: the variants of a recall sweep timed with the options their recall runs used, at one
long length, and the frontier of the two (the Based paper's question, https://arxiv.org/abs/2402.18668 Figure 1,
asked of our zoo).

Timing is the benchmark's (`zoo_bench.measure`: one attention module, qkv and proj included, forward + backward,
median of the repeats, each configuration in a fresh process), at the benchmark's settings (batch 1, width 512,
8 heads, fp32) and causal where the variant's recall runs were, so the numbers sit beside `results.md`. Throughput
is tokens per second of forward + backward. A variant is on the frontier when no other variant has at least its
recall and at least its throughput, one of them higher.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .measure import Settings, single_config
from .recall_grid import parse_variant, variant_spec
from .sweep import metadata, run_config

__all__ = ["SPEED_FILE", "SPEED_LENGTH", "frontier", "frontier_points", "measure_speed", "throughputs"]

SPEED_FILE = "recall_speed.json"
# long enough that the quadratic variants pay for it, short enough that every variant fits a CPU's memory
SPEED_LENGTH = 16384


def measure_speed(
    labels: Iterable[str],
    out_dir: Path | str,
    *,
    length: int = SPEED_LENGTH,
    settings: Settings | None = None,
    timeout: float = 1200.0,
    command: str | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Time each variant label (`local(window=16)`) at `length` with its recall options; writes
    `out_dir/recall_speed.json` and returns it. A failure is recorded with its reason. Labels the saved file already
    timed at the same length and settings on this machine are kept, not timed again (a sweep that grew resumes)."""
    settings = settings or Settings()
    out = Path(out_dir) / SPEED_FILE
    meta = metadata(settings, [], command=command or "tools/recall.py --speed", length=length)
    records = _earlier(out, meta, log)
    done = {record["label"] for record in records}
    for label in dict.fromkeys(labels):
        if label in done:
            continue
        variant = parse_variant(variant_spec(label))
        config = single_config(variant.name, length, replace(settings, causal=variant.causal), variant.options)
        record = {"label": label, **run_config(config, timeout)}
        records.append(record)
        took = f"{record['fwd_bwd_s']:.3g} s fwd+bwd" if record["status"] == "ok" else record["status"]
        log(f"{label} at N={length:,}: {took}")
    meta["causal"] = "as each variant's recall runs: causal where the variant has a causal mode"
    results = {"metadata": meta, "records": records}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    return results


def _earlier(path: Path, meta: dict[str, Any], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The records of a saved file measured as `meta` would be (length, settings, machine); none otherwise."""
    if not path.is_file():
        return []
    saved = json.loads(path.read_text())
    old = saved["metadata"]
    if any(old.get(key) != meta.get(key) for key in ("length", "settings", "device_name")):
        log(f"{path} was timed at another length, settings or machine: timing every variant again")
        return []
    log(f"resuming {path}: {len(saved['records'])} variants timed")
    return saved["records"]


def throughputs(speed: dict[str, Any]) -> dict[str, float]:
    """Label -> forward + backward tokens per second, for the records that ran."""
    batch = speed["metadata"]["settings"]["batch"]
    return {r["label"]: batch * r["length"] / r["fwd_bwd_s"] for r in speed["records"] if r["status"] == "ok"}


def frontier(points: dict[str, tuple[float, float]]) -> list[str]:
    """The labels whose (recall, throughput) no other point matches or beats on both, one strictly; by throughput."""

    def beaten(a: tuple[float, float]) -> bool:
        return any(b[0] >= a[0] and b[1] >= a[1] and b != a for b in points.values())

    return sorted((label for label, point in points.items() if not beaten(point)), key=lambda x: points[x][1])


def frontier_points(
    cells: dict[tuple[str, int, int], dict[str, Any]], speed: dict[str, Any] | None, cell: tuple[int, int]
) -> dict[str, tuple[float, float]]:
    """Label -> (test accuracy at the recall `cell` (length, width), tokens per second) for the variants with both;
    `cells`: the sweep's (`summarize_cells`), of which those that ran count. Accuracy to the 3 decimals the reports
    show: 0.99985 against 0.99984 is a tie, not a reason to be on the frontier."""
    rates = throughputs(speed) if speed else {}
    recalls = {label: cells.get((label, *cell), {}) for label in rates}
    return {
        label: (round(recalls[label]["top1"], 3), rate)
        for label, rate in rates.items()
        if recalls[label].get("status") == "ok"
    }
