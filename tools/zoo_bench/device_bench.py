"""The device check's `bench` part: the speed sweep in this process (CUDA's peak memory resets per phase), in bf16,
forward + backward, at each of the profile's batch sizes (1 and 8 on CUDA), each variant at growing lengths until
one fails (out of memory: recorded, and the longer ones not tried).

The variants whose kernel compiles again at every length (a 2-D grid or a FlexAttention backend) take the square
lengths only and run after the others: softmax, projections and the kernel families at both batch sizes first, then
those. The batch-1 sweep's report (`results.json`, `results.md`, `time.png`, `memory.png`) goes beside the check's,
each other batch's into `batch<B>/`."""

from __future__ import annotations

import math
from typing import Any

import torch

from zoo.attention import attention_options, get_attention, list_attentions

from .device_parts import Profile, Report, part_budget, tidy
from .measure import PROJECTIONS, Settings, single_config
from .report import summarize, write_report
from .sweep import metadata, run_config

__all__ = ["BENCH_VARIANTS", "bench_names", "bench_summary", "run_bench"]

# The variants the speed targets name (docs/attention.md), softmax first: the baseline of every crossover; of the
# grid and FlexAttention families, those the GPU work touches first
BENCH_VARIANTS = ("softmax", PROJECTIONS, "linear", "performer", "hedgehog", "neighborhood", "window2d", "local")
# Seconds one sweep configuration may spend repeating (at least one timed run); in-process runs are not killed.
BENCH_SECONDS, BENCH_TIMEOUT = 15.0, 60.0


def bench_names(asked: tuple[str, ...] = ()) -> list[str]:
    """`asked` (default: the targets' variants) after softmax and projections, the baseline and the floor."""
    for name in asked:
        get_attention(name)  # an unknown name: the registry's one-line error with close matches
    names = list(dict.fromkeys(("softmax", PROJECTIONS, *asked))) if asked else list(BENCH_VARIANTS)
    known = set(list_attentions()) | {PROJECTIONS}
    return [name for name in names if name in known]


def _compiles_per_length(name: str) -> bool:
    return name != PROJECTIONS and (get_attention(name).needs_grid or "backend" in attention_options(name))


def _bench_lengths(name: str, lengths: tuple[int, ...]) -> list[int]:
    """The square lengths alone for a 2-D variant, and for a family with a FlexAttention backend, whose kernel
    compiles again at every length (static shapes): 1K, 4K, 16K, 64K."""
    if _compiles_per_length(name):
        return [n for n in lengths if math.isqrt(n) ** 2 == n]
    return list(lengths)


def bench_summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: the crossover against softmax and the speedup over softmax at the longest length both ran."""
    summary = summarize(records)
    times = {(r["variant"], r["length"]): r["fwd_bwd_s"] for r in records if r["status"] == "ok"}
    for name, entry in summary.items():
        shared = [n for (v, n) in times if v == name and ("softmax", n) in times]
        if name not in ("softmax", PROJECTIONS) and shared:
            longest = max(shared)
            entry["speedup"] = {"length": longest, "x": round(times["softmax", longest] / times[name, longest], 2)}
    return summary


def _bench_line(record: dict[str, Any], batch: int) -> dict[str, Any]:
    keys = ("variant", "length", "status", "fwd_bwd_s", "fwd_s", "peak_mib", "rel_error", "message")
    return {"batch": batch, **{key: record[key] for key in keys if key in record}}


def _plan(names: list[str], batches: tuple[int, ...]) -> list[tuple[int, str]]:
    """(batch, variant) in the order they run: the variants that compile once at every batch size, then those
    that compile per length at every batch size."""
    plain = [name for name in names if not _compiles_per_length(name)]
    per_length = [name for name in names if _compiles_per_length(name)]
    return [(batch, name) for group in (plain, per_length) for batch in batches for name in group]


def run_bench(report: Report, profile: Profile) -> None:
    """The speed sweep of `profile.bench_variants` (default: the targets' variants) at `profile.bench_batches`."""
    names = bench_names(profile.bench_variants)
    settings = {
        batch: Settings(
            batch=batch,
            dim=profile.bench_dim,
            heads=profile.bench_heads,
            dtype="bf16" if profile.device == "cuda" else "fp32",
            device=profile.device,
            threads=torch.get_num_threads(),
            repeats=3,
            warmup=1,
        )
        for batch in profile.bench_batches
    }
    with part_budget(report, "bench", profile.budgets["bench"]) as clock:
        part = report.part("bench")
        part["report"] = "results.md"
        sweeps = {
            batch: {
                "metadata": metadata(
                    settings[batch],
                    names,
                    command="tools/device_check.py",
                    lengths=list(profile.bench_lengths),
                    options={},
                    max_seconds=BENCH_SECONDS,
                    timeout=BENCH_TIMEOUT,
                    isolated=False,
                    notes=["measured in one process by the device check (CUDA's peak memory is reset per phase)"],
                ),
                "records": [],
                "summary": {},
            }
            for batch in profile.bench_batches
        }
        plan = _plan(names, profile.bench_batches)
        for done, (batch, name) in enumerate(plan):
            if clock.over():
                part["skipped_for_time"] = [f"{variant} (batch {b})" for b, variant in plan[done:]]
                break
            for length in _bench_lengths(name, profile.bench_lengths):
                config = single_config(name, length, settings[batch], budget_s=BENCH_SECONDS)
                record = run_config(config, timeout=BENCH_TIMEOUT, isolate=False)
                sweeps[batch]["records"].append(record)
                part["items"].append(_bench_line(record, batch))
                report.save()
                clock.lap()
                if record["status"] != "ok" or clock.over():
                    break
            tidy(profile.device)
        for batch, sweep in sweeps.items():
            sweep["summary"] = bench_summary(sweep["records"])
            if sweep["records"]:
                write_report(sweep, report.out if batch == profile.bench_batches[0] else report.out / f"batch{batch}")
        part["summary"] = sweeps[profile.bench_batches[0]]["summary"]
        part["summary_by_batch"] = {str(batch): sweep["summary"] for batch, sweep in sweeps.items()}
