"""A leaderboard: every attention variant trained on one task recipe under one step budget, then tested.

Each (variant, seed) is one run in a fresh process, so that no state, compiled kernel or memory peak carries over;
it trains, then tests its best checkpoint as tools/eval.py would (`--test`; one process start instead of two):

    tools/train.py RECIPE --output RUN --overwrite --test --set model.attention.name=V train.max_steps=N \
        train.epochs=N seed=S

`train.epochs=N` only makes sure the epoch count never ends a run before its N steps (an epoch has at least one
step); everything else (model, data, optimizer, schedule, evaluation cadence) is the recipe's. The recipe's own
attention options go with its own variant only; `options` adds `model.attention.options.KEY=VALUE` per variant.

A run's record comes from its folder (`train_summary.json`, `metrics.jsonl`, `eval.json`) and from watching its
process: wall time (training's and the test's apart), and the peak resident set of its process tree (sampled every
0.2 s), or the CUDA allocator's peak in training where the summary holds one (`cuda_peak_mib`). A run that fails
(an error, out of memory, a NaN loss, a timeout) gets its record with the reason and the sweep goes on; after an
error, out of memory or timeout the variant's later seeds are skipped, since they would fail the same way. The
results are saved after every run, and a sweep started again with the same recipe, budget and device skips the
(variant, seed) pairs it holds.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import torch

from zoo._validate import check_int
from zoo.attention import get_attention, list_attentions
from zoo.config import load_recipe, recipe_to_dict

from ._study import run_cells
from .machine import default_device, device_name, device_slug, shown_path, versions

__all__ = ["FAILED", "default_variants", "read_run", "run_leaderboard", "train_and_test"]

TOOLS = Path(__file__).resolve().parents[1]
# Statuses after which a variant's later seeds are skipped: another seed would fail the same way.
FAILED = ("error", "oom", "timeout")
_POLL_S = 0.2
# the model sizes a protocol states; a ViT's timm name too (a 1-D model has none)
_MODEL_KEYS = {
    False: ("kind", "embed_dim", "depth", "num_heads"),
    True: ("kind", "name", "embed_dim", "depth", "num_heads"),
}


def default_variants(task: str, model_kind: str) -> list[str]:
    """Every registered variant that can serve `task` on a `model_kind` model: by capability, those with a causal
    mode for causal_lm, and the 2-D ones (`needs_grid`) only on a ViT's patch grid.

    Whether a variant takes the task's length shows in its first run, which fails within seconds when it cannot
    (linformer and synthesizer are built for a `max_seq_len`; pass a longer one through `options`).
    """
    chosen = []
    for name in list_attentions():
        cls = get_attention(name)
        if task == "causal_lm" and not cls.supports_causal:
            continue
        if getattr(cls, "needs_grid", False) and model_kind != "vit":
            continue
        chosen.append(name)
    return chosen


def overrides(
    recipe: dict[str, Any],
    variant: str,
    seed: int,
    budget_steps: int,
    options: dict[str, Any],
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The `--set` items of one run (values as JSON, which the recipe reads as YAML); `extra` items go last."""
    items = [f"model.attention.name={variant}", f"train.max_steps={budget_steps}", f"train.epochs={budget_steps}"]
    items.append(f"seed={seed}")
    own = recipe["model"]["attention"]
    # the recipe's options belong to its own variant: another variant would reject them
    if own.get("options") and variant != own["name"]:
        items.append("model.attention.options={}")
    items += [f"model.attention.options.{key}={json.dumps(value)}" for key, value in options.items()]
    return items + list(extra)


def _tree_rss(process: psutil.Process) -> int:
    """Resident bytes of `process` and its descendants (0 for those that just ended)."""
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def _tree_cpu_s(process: psutil.Process) -> float:
    """User + system seconds of `process`, its live descendants and the ended ones it waited for."""
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            times = member.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def _stop_tree(process: psutil.Process) -> None:
    """SIGKILL the run's process and its descendants: a timed-out run leaves nothing behind."""
    for member in [*process.children(recursive=True), process]:
        try:
            member.kill()
        except psutil.Error:
            pass


def run_child(command: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `command` (output to `log`; `env`: its environment, default this one's) -> returncode (None: timed out),
    wall_s, the tree's peak_rss_mib and its cpu_s (user + system, as last seen while it ran: this run's alone, where
    the RUSAGE_CHILDREN of a study running cells at once would mix them)."""
    start, peak, cpu, timed_out = time.perf_counter(), 0, 0.0, False
    with open(log, "w") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:
            peak = max(peak, _tree_rss(watched))
            cpu = max(cpu, _tree_cpu_s(watched))
            timed_out = time.perf_counter() - start > timeout
            if timed_out:
                _stop_tree(watched)
                proc.wait()
                break
            time.sleep(_POLL_S)
    wall = round(time.perf_counter() - start, 2)
    return {
        "returncode": None if timed_out else proc.returncode,
        "wall_s": wall,
        "peak_rss_mib": round(peak / 2**20, 1),
        "cpu_s": round(cpu, 1),
    }


def _reason(log: Path, returncode: int) -> dict[str, str]:
    """A failed process's status (oom, nan or error) and one-line message, from the end of its log."""
    lines = [line.strip() for line in re.split(r"[\r\n]+", log.read_text(errors="replace")) if line.strip()]
    # run_cli's one line for a user error, else the exception line of a traceback, else the last line
    message = next((line[len("error: ") :] for line in reversed(lines) if line.startswith("error: ")), None)
    exception = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")
    message = message or next((line for line in reversed(lines) if exception.match(line)), None)
    message = message or (lines[-1] if lines else "no output")
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (the kernel's out-of-memory killer?)" if returncode == -signal.SIGKILL else ""
        message = f"killed by {name}{hint}; {message}"
    text = message.lower()
    oom = returncode == -signal.SIGKILL or any(
        sign in text for sign in ("out of memory", "can't allocate memory", "outofmemoryerror", "memoryerror")
    )
    # the engine stops a run whose loss turns NaN or infinite (zoo.train.loop.NonFiniteError)
    status = "oom" if oom else "nan" if "non-finite loss" in text else "error"
    return {"status": status, "message": message[:500]}


def read_run(run_dir: Path) -> dict[str, Any]:
    """What a finished run's folder says: test metrics and the test's wall time, steps, samples/s, CUDA peak, or the
    NaN that spoilt it."""
    summary = json.loads((run_dir / "train_summary.json").read_text())
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(line) for line in lines if line.strip()]
    for record in evals:
        bad = [key for key in ("train_loss", "val_loss") if not math.isfinite(record.get(key, 0.0))]
        if bad:
            return {"status": "nan", "message": f"{bad[0]} is {record[bad[0]]} at step {record.get('step')}"}
    rates = [record["samples_per_s"] for record in evals if record.get("samples_per_s")]
    found = {
        "steps": summary.get("steps"),
        "samples_per_s": round(statistics.median(rates), 2) if rates else None,
        "cuda_peak_mib": summary.get("cuda_peak_mib"),
    }
    eval_path = run_dir / "eval.json"
    if eval_path.is_file():
        tested = json.loads(eval_path.read_text())
        metrics = tested["metrics"]
        found["test"] = {key: value for key, value in metrics.items() if isinstance(value, (int, float))}
        if "wall_s" in tested:
            found["eval_wall_s"] = tested["wall_s"]
        bad = [key for key, value in found["test"].items() if not math.isfinite(value)]
        if bad:
            return {**found, "status": "nan", "message": f"test {bad[0]} is {found['test'][bad[0]]}"}
    return {**found, "status": "ok"}


def train_and_test(
    recipe_path: Path,
    recipe: dict[str, Any],
    variant: str,
    seed: int,
    budget_steps: int,
    run_dir: Path,
    *,
    options: dict[str, Any],
    timeout: float,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One (variant, seed): trained, then tested, in one fresh process (`tools/train.py --test`) -> its record
    (failures included). `extra`: more `--set` items (another model layout, say)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    record: dict[str, Any] = {"variant": variant, "seed": seed, "options": options, "run_dir": str(run_dir)}
    command = [sys.executable, str(TOOLS / "train.py"), str(recipe_path), "--output", str(run_dir), "--overwrite"]
    command += ["--test", "--set", *overrides(recipe, variant, seed, budget_steps, options, extra)]
    child = run_child(command, run_dir / "train.log", timeout)
    peak = child["peak_rss_mib"]
    record.update(train_wall_s=child["wall_s"], peak_rss_mib=peak, peak_mib=peak, cpu_s=child.get("cpu_s"))
    if child["returncode"] is None:
        return {**record, "status": "timeout", "message": f"training and testing killed after {timeout:g} s"}
    if child["returncode"] != 0:
        return {**record, **_reason(run_dir / "train.log", child["returncode"])}
    record.update(read_run(run_dir))
    # the CUDA allocator's peak where the run recorded one: the resident set of a GPU run is mostly the runtime
    record["peak_mib"] = record.get("cuda_peak_mib") or record["peak_rss_mib"]
    if "eval_wall_s" in record:
        # the process's wall time less its test's: the training's own (imports and start-up included, as before)
        record["train_wall_s"] = round(child["wall_s"] - record["eval_wall_s"], 2)
    return record


def protocol(
    recipe_path: Path, recipe: dict[str, Any], budget_steps: int, device: str, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """What every run of the sweep shares; a resumed sweep must match it (`_RESUME_KEYS`)."""
    sets = "".join(f" {item}" for item in extra)
    model, data = recipe["model"], recipe["data"]
    return {
        "task": recipe["name"],
        "recipe": shown_path(recipe_path, Path.cwd()),
        "objective": recipe["task"],
        "model": {key: model.get(key) for key in _MODEL_KEYS[model.get("kind") == "vit"] if key in model},
        "recipe_attention": model["attention"],
        "dataset": data.get("name"),
        "batch_size": data.get("batch_size"),
        "budget_steps": budget_steps,
        "device": device,
        "device_name": device_name(device),
        "cpu_count": os.cpu_count(),
        # the runs inherit this process's OMP_NUM_THREADS, as torch reads it
        "threads": torch.get_num_threads(),
        "memory": (
            "peak resident set of the process tree that trains and then tests, sampled every 0.2 s (a GPU run's CUDA "
            "allocator peak in training instead where its train_summary.json holds cuda_peak_mib)"
        ),
        "run": "tools/train.py RECIPE --output RUN --overwrite --test --set model.attention.name=V "
        f"train.max_steps={budget_steps} train.epochs={budget_steps} seed=S{sets}",
        "sets": list(extra),
    }


def default_out(task: str, device: str, root: Path = Path("benchmarks")) -> Path:
    """Where a sweep writes without `--out`: `root/<device>`, unless its `leaderboard_<task>.json` was measured on
    another machine (the committed CPU tables): then `root/<device>-<this machine's CPU or GPU model>`, so the
    README's command runs on any machine and leaves the committed table as it was."""
    out = root / device_slug(device)
    saved = out / f"leaderboard_{task}.json"
    if saved.is_file() and json.loads(saved.read_text())["protocol"].get("device_name") != device_name(device):
        return root / f"{device_slug(device)}-{re.sub(r'[^a-z0-9]+', '-', device_name(device).lower()).strip('-')}"
    return out


_RESUME_KEYS = ("task", "budget_steps", "device_name", "recipe_attention", "sets")
# what a sweep saved before a key existed had: the same as leaving it out now
_KEY_DEFAULTS: dict[str, Any] = {"sets": []}


def _earlier(path: Path, proto: dict[str, Any], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The records of the sweep saved at `path`, which must share this one's protocol."""
    if not path.is_file():
        return []
    saved = json.loads(path.read_text())
    for key in _RESUME_KEYS:
        earlier = saved["protocol"].get(key, _KEY_DEFAULTS.get(key))
        if earlier != proto[key]:
            raise ValueError(
                f"{path} holds a sweep with {key}={earlier!r}, this one has {proto[key]!r}: "
                "pass another --out, or the same settings to resume it"
            )
    log(f"resuming {path}: {len(saved['records'])} runs done")
    return saved["records"]


def _kept(
    records: list[dict[str, Any]], options: dict[str, dict[str, Any]], retry_failed: bool, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The saved records that stand: not those of a variant whose options changed, nor (`retry_failed`) failures."""
    stale = {r["variant"] for r in records if r["options"] != options.get(r["variant"], {})}
    if stale:
        log(f"run again with other options: {', '.join(sorted(stale))}")
    records = [r for r in records if r["variant"] not in stale]
    if retry_failed:
        records = [r for r in records if r["status"] == "ok"]
    return records


def _skipped(records: list[dict[str, Any]], variant: str, seed: int, options: dict[str, Any]) -> dict | None:
    """The record of a run not started because an earlier seed of the variant failed; None: run it."""
    failed = [r for r in records if r["variant"] == variant and r["seed"] < seed and r["status"] in FAILED]
    if not failed:
        return None
    reason = f"seed {failed[0]['seed']} failed ({failed[0]['status']}): {failed[0]['message']}"
    return {"variant": variant, "seed": seed, "options": options, "status": "skipped", "message": reason}


def run_leaderboard(
    recipe_path: Path | str,
    out_dir: Path | str,
    *,
    variants: list[str] | None = None,
    budget_steps: int | None = None,
    seeds: int = 1,
    first_seed: int = 0,
    runs_dir: Path | str | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    timeout: float = 3600.0,
    retry_failed: bool = False,
    extra: tuple[str, ...] = (),
    command: str | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Train and test every variant x seed (seeds first_seed.. first_seed+seeds-1, seed-major, so each seed's table
    fills in turn; a later seed's sweep can run in another process, with another `out_dir`, and be merged);
    writes `leaderboard_<task>.{json,md,png}` to `out_dir` after every run and returns the results.

    `budget_steps` defaults to the recipe's `train.max_steps`. Runs go to `runs_dir/<variant>_seed<S>` (default
    `runs/leaderboard/<task>`). `extra`: `--set` items for every run (self-pretraining, say), part of the
    protocol; such a sweep belongs in another `out_dir` than the plain one. Pairs already in the saved results are
    skipped; with `retry_failed`, failed ones run again. A variant whose options differ from its saved records' is
    run again from scratch.
    """
    from .leaderboard_report import write_report

    recipe_path = Path(recipe_path).resolve()
    extra = tuple(extra)
    recipe = recipe_to_dict(load_recipe(recipe_path, extra))  # a bad --set item fails here, before any run
    budget_steps = recipe["train"].get("max_steps") if budget_steps is None else budget_steps
    if budget_steps is None:
        raise ValueError(f"--budget-steps is needed: recipe {recipe_path.name} sets no train.max_steps")
    check_int("budget_steps", budget_steps, 1)
    check_int("seeds", seeds, 1)
    check_int("first_seed", first_seed, 0)
    seed_list = list(range(first_seed, first_seed + seeds))
    variants = list(dict.fromkeys(variants or default_variants(recipe["task"], recipe["model"]["kind"])))
    for variant in variants:
        # a misspelt name is the user's error, not a variant's failure: the registry refuses it before any run
        get_attention(variant)
    options = options or {}
    device = default_device()
    proto = protocol(recipe_path, recipe, budget_steps, device, extra)
    out_dir = Path(out_dir)
    path = out_dir / f"leaderboard_{recipe['name']}.json"
    runs_dir = Path(runs_dir) if runs_dir else Path("runs") / "leaderboard" / recipe["name"]
    records = _kept(_earlier(path, proto, log), options, retry_failed, log)
    done = {(r["variant"], r["seed"]) for r in records}
    results: dict[str, Any] = {"protocol": proto, "records": records}
    results["protocol"].update(
        command=command or " ".join(sys.argv),
        variants=variants,
        seeds=seed_list,
        options=options,
        versions=versions(),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )

    def run(cell: tuple[int, str]) -> dict[str, Any]:
        seed, variant = cell
        record = _skipped(records, variant, seed, options.get(variant, {}))
        if record is None:
            run_dir = runs_dir / f"{variant}_seed{seed}"
            args = (recipe_path, recipe, variant, seed, budget_steps, run_dir)
            record = train_and_test(*args, options=options.get(variant, {}), timeout=timeout, extra=extra)
        return record

    def add(cell: tuple[int, str], record: dict[str, Any]) -> None:
        record["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        records.append(record)
        log(_describe(record))

    # seed-major, so each seed's table fills in turn
    cells = [(seed, variant) for seed in seed_list for variant in variants if (variant, seed) not in done]
    run_cells(cells, run, add, lambda: write_report(results, out_dir))
    write_report(results, out_dir)
    return results


def _describe(record: dict[str, Any]) -> str:
    where = f"{record['variant']} seed {record['seed']}"
    if record["status"] != "ok":
        return f"{where}: {record['status']}: {record.get('message', '')}"
    scores = " ".join(f"{k}={v:.4g}" for k, v in record.get("test", {}).items() if k != "samples")
    return f"{where}: test {scores}; trained in {record['train_wall_s']:.1f} s, peak {record['peak_mib']} MiB"
