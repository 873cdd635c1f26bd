"""The recall grid: every attention variant on MQAR over sequence lengths x model widths x seeds x learning rates.

Zoology's protocol (Arora et al. 2023, https://arxiv.org/abs/2312.04927, Figure 2) at CPU size: at length L the
task has vocabulary `max(2 L, 128)` and `L / 8` key-value pairs (L = 64: 128 / 8, L = 128: 256 / 16, the two
goal cells), a model of width d trains for the recipe's steps at each learning rate, and a cell (variant, L, d)
reports the learning rate whose validation accuracy, averaged over the seeds, is best, with that rate's test
accuracy (mean and spread over the seeds). The recipe (`recipes/recall_mqar_quick.yaml`) fixes the rest.

Each run is the leaderboard's: `tools/train.py --test` in a fresh process (`leaderboard.train_and_test`, so failures
get their record with the reason), with `--set` items for the cell. A variant attends causally where it has a
causal mode (task `causal_token_classification`, as Zoology's and Based's language models) and bidirectionally
otherwise (`token_classification`: bigbird, linformer, nystrom); the data are Zoology's sample,
whose answers are never inputs, so both are fair. The results are saved after every run; a sweep started again
with the same protocol skips the runs it holds.

A variant is a registered name with options, `local:window=16` (its label is `local(window=16)`); a variant with a
`max_seq_len` option gets the cell's length there. `state_size` gives the floats each variant keeps per layer (the
Based paper's x-axis, https://arxiv.org/abs/2402.18668 Figure 3), by the formulas of `STATE_FORMULAS`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from zoo._validate import check_int
from zoo.config import load_recipe, recipe_to_dict

from ._study import run_cells
from .leaderboard import protocol, train_and_test
from .machine import default_device, versions
from .recall_grid import (
    DEFAULT_LENGTHS,
    DEFAULT_LRS,
    DEFAULT_VARIANTS,
    DEFAULT_WIDTHS,
    STATE_FORMULAS,
    Variant,
    cell_data,
    parse_variant,
    state_size,
    summarize_cells,
    variant_spec,
)
from .recall_report import write_report

__all__ = [
    "DEFAULT_VARIANTS",
    "STATE_FORMULAS",
    "Variant",
    "cell_data",
    "parse_variant",
    "run_recall",
    "state_size",
    "summarize_cells",
    "variant_spec",
]


def run_key(record: dict[str, Any]) -> tuple:
    return record["label"], record["length"], record["width"], record["seed"], record["lr"]


def _sets(variant: Variant, length: int, width: int, lr: float, proto: dict[str, Any]) -> tuple[str, ...]:
    """The `--set` items of one run beyond the leaderboard's (variant, steps, seed); the sweep's own `sets` last."""
    data = cell_data(length, proto.get("pairs"))
    task = "causal_token_classification" if variant.causal else "token_classification"
    items = [f"data.options.{key}={value}" for key, value in data.items()]
    items += [f"model.embed_dim={width}", f"optim.lr={lr}", f"task={task}"]
    return tuple(items + list(proto.get("sets") or ()))


def _val_accuracy(run_dir: Path) -> float | None:
    """The last validation accuracy of a run (`metrics.jsonl`), None when it logged none."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    values = [json.loads(line).get("val_top1") for line in path.read_text().splitlines() if line.strip()]
    values = [v for v in values if v is not None]
    return values[-1] if values else None


def _earlier(path: Path, proto: dict[str, Any], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The records saved at `path`, whose protocol must match this sweep's on `_RESUME_KEYS`; the grid it planned
    is carried into `proto`, so the report still lists the cells no run reached."""
    if not path.is_file():
        return []
    saved = json.loads(path.read_text())
    for key in _RESUME_KEYS:
        if saved["protocol"].get(key) != proto[key]:
            raise ValueError(
                f"{path} holds a sweep with {key}={saved['protocol'].get(key)!r}, this one has {proto[key]!r}: "
                "pass another --out, or the same settings to resume it"
            )
    proto["plan"] = saved["protocol"].get("plan", {})
    proto["variant_options"] = saved["protocol"].get("variant_options", {})
    log(f"resuming {path}: {len(saved['records'])} runs done")
    return saved["records"]


_RESUME_KEYS = ("task", "budget_steps", "device_name", "recipe_attention", "pairs", "sets")


def run_recall(
    recipe_path: Path | str,
    out_dir: Path | str,
    *,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    widths: Sequence[int] = DEFAULT_WIDTHS,
    seeds: Sequence[int] = (0, 1),
    lrs: Sequence[float] = DEFAULT_LRS,
    budget_steps: int | None = None,
    runs_dir: Path | str | None = None,
    timeout: float = 3600.0,
    retry_failed: bool = False,
    jobs: int = 1,
    stop_after: float | None = None,
    pairs: int | None = None,
    sets: Sequence[str] = (),
    command: str | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Train and test every (variant, length, width, seed, lr) not yet in `out_dir/recall.json`, in that order
    (variants outermost, so each variant's cells fill in turn); writes `recall.{json,md,png}` after every run.
    `jobs` runs go at once (1 on a shared CPU; more where cores are idle, as on a GPU machine).

    A run that fails (error, out of memory, timeout) leaves the variant's other runs at that length and width, and
    its longer lengths at that width, unrun (they would fail the same way): they are recorded as skipped with the
    reason. The figure is redrawn at most once a minute while the sweep runs, and at its end unless the last run's
    report drew it (a figure of the whole grid is slow to draw). `stop_after`: seconds
    after which no run starts (those running finish), so a session of fixed length ends with every finished run saved;
    the sweep resumes from there. `pairs`: a fixed number of key-value pairs at every length (default L / 8);
    `sets`: `--set` items every run gets (batch size, sample counts: the long-length protocol), kept in the protocol.
    """
    recipe_path = Path(recipe_path).resolve()
    # the protocol states the recipe as the runs see it, `sets` applied (their batch size, say)
    recipe = recipe_to_dict(load_recipe(recipe_path, list(sets)))
    budget_steps = recipe["train"].get("max_steps") if budget_steps is None else budget_steps
    check_int("budget_steps", budget_steps, 1)
    check_int("jobs", jobs, 1)
    if stop_after is not None and not stop_after >= 0:
        raise ValueError(f"stop_after must be a number of seconds >= 0, got {stop_after!r}")
    parsed = [parse_variant(text) for text in variants]
    for length in lengths:
        cell_data(length, pairs)
    proto = protocol(recipe_path, recipe, budget_steps, default_device())
    proto.update(
        grid=f"MQAR at vocabulary max(2 L, 128) and {pairs or 'L / 8'} pairs; causal attention where the variant "
        "has it",
        pairs=pairs,
        sets=list(sets) or None,
        cell_rule="the lr with the best mean validation accuracy over the seeds; its test accuracy, mean and std",
        state_formulas=STATE_FORMULAS,
    )
    out_dir = Path(out_dir)
    path = out_dir / "recall.json"
    runs_dir = Path(runs_dir) if runs_dir else Path("runs") / "recall"
    records = _earlier(path, proto, log)
    if retry_failed:
        records = [r for r in records if r["status"] == "ok"]
    done = {run_key(r) for r in records}
    results: dict[str, Any] = {"protocol": proto, "records": records}
    proto.update(
        command=command or " ".join(sys.argv),
        versions=versions(),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    _plan(proto, parsed, lengths, widths, seeds, lrs)
    todo = [
        (variant, (variant.label, length, width, seed, lr))
        for variant in parsed
        for width in widths
        for length in lengths
        for seed in seeds
        for lr in lrs
        if (variant.label, length, width, seed, lr) not in done
    ]
    # drawn: when the figure was last drawn, and whether it shows every record so far
    drawn: list = [None, False]

    def run(cell: tuple[Variant, tuple]) -> dict[str, Any]:
        variant, key = cell
        # a copy: runs on other threads add theirs meanwhile
        earlier = list(records)
        return _one_run(recipe_path, recipe, variant, key, earlier, budget_steps, runs_dir, timeout, proto)

    def add(cell: tuple[Variant, tuple], record: dict[str, Any]) -> None:
        records.append(record)
        log(_describe(record))

    def save() -> None:
        when = _save(results, out_dir, drawn[0])
        drawn[:] = [when, when != drawn[0]]

    # runs are separate processes: with jobs > 1 threads only wait for them (a GPU machine's many cores, say)
    unstarted = run_cells(todo, run, add, save, jobs=jobs, stop_after=stop_after)
    if unstarted:
        log(f"stopped after {stop_after:g} s: {len(unstarted)} runs not started; run the same command to resume")
    write_report(results, out_dir, figure=not drawn[1])
    return results


def _save(results: dict[str, Any], out_dir: Path, drawn: float | None) -> float | None:
    """Write the report after a run; the figure only when the last one is a minute old. Returns its time."""
    now = time.monotonic()
    redraw = drawn is None or now - drawn > _REDRAW_S
    write_report(results, out_dir, figure=redraw)
    return now if redraw else drawn


_REDRAW_S = 60.0


def _plan(proto: dict[str, Any], variants: list[Variant], lengths, widths, seeds, lrs) -> None:
    """The grid asked for, kept in the protocol (merged with what earlier runs of the sweep asked)."""
    plan = proto.setdefault("plan", {})
    plan["variants"] = list(dict.fromkeys([*plan.get("variants", []), *(v.label for v in variants)]))
    for key, values in (("lengths", lengths), ("widths", widths), ("seeds", seeds), ("lrs", lrs)):
        plan[key] = sorted({*plan.get(key, []), *values})
    known = proto.setdefault("variant_options", {})
    known.update({v.label: {"name": v.name, "options": v.options, "causal": v.causal} for v in variants})


def _one_run(
    recipe_path, recipe, variant: Variant, key: tuple, records, budget_steps, runs_dir, timeout, proto
) -> dict:
    label, length, width, seed, lr = key
    base = {"label": label, "variant": variant.name, "length": length, "width": width, "seed": seed, "lr": lr}
    base["causal"] = variant.causal
    base["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    failed = [
        r
        for r in records
        if r["label"] == label and r["width"] == width and r["length"] <= length and r["status"] in _STOPS
    ]
    if failed:
        first = failed[0]
        reason = f"length {first['length']} seed {first['seed']} lr {first['lr']} failed ({first['status']})"
        return {**base, "status": "skipped", "message": f"{reason}: {first.get('message', '')}"}
    run_dir = Path(runs_dir) / f"{label}_L{length}_d{width}_s{seed}_lr{lr:g}"
    options = variant.options_at(length)
    extra = _sets(variant, length, width, lr, proto)
    record = train_and_test(
        recipe_path, recipe, variant.name, seed, budget_steps, run_dir, options=options, timeout=timeout, extra=extra
    )
    record.update(base, val_top1=_val_accuracy(run_dir))
    return record


# failures that a longer sequence at the same width would repeat
_STOPS = ("error", "oom", "timeout")


def _describe(record: dict[str, Any]) -> str:
    where = f"{record['label']} L={record['length']} d={record['width']} seed {record['seed']} lr {record['lr']:g}"
    if record["status"] != "ok":
        return f"{where}: {record['status']}: {record.get('message', '')}"
    return f"{where}: test top1 {record['test'].get('top1', float('nan')):.4f}; trained in {record['train_wall_s']} s"
