"""A sweep: every (variant, length) in a fresh subprocess, failures recorded, the report written after each.

Lengths run in increasing order. After a configuration that runs out of memory, times out, crashes, or takes
longer than `max_seconds`, the longer ones of that variant are recorded as skipped; an unknown variant, or one
without a causal mode in a causal sweep, is an error at every length, and a grid variant (`needs_grid`) at every
length that is not a square. `merge` keeps an earlier sweep's records.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml

from zoo._validate import check_int, did_you_mean, unknown_name
from zoo.attention import attention_options, list_attentions

from .machine import device_name, versions
from .measure import (
    BENCH_OPTIONS,
    PROJECTIONS,
    SHARED_OPTIONS,
    STOPPING,
    Settings,
    failure,
    footprint,
    measure,
    needs_grid,
    own_options,
    single_config,
    supports_causal,
)
from .peers import PEER_PREFIX, PEERS
from .report import summarize, write_report

__all__ = ["DEFAULT_LENGTHS", "check_variants", "metadata", "parse_options", "run_config", "run_sweep", "stop_reason"]

DEFAULT_LENGTHS = (1024, 4096, 16384, 65536)
# The child runs `python -m zoo_bench.measure`: this package's folder (tools/) and the repository on its path.
_CHILD_PATH = (Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2])


def check_variants(names: list[str]) -> None:
    """ValueError for a name that is not a registered variant, `projections` or `peer:<package>`."""
    known = [*list_attentions(), PROJECTIONS, *(PEER_PREFIX + peer for peer in PEERS)]
    for name in names:
        if name not in known:
            raise unknown_name("variant", name, known)


def parse_options(items: list[str], variants: list[str], *, shared: bool = True) -> dict[str, dict[str, Any]]:
    """`["performer.nb_features=256", ...]` -> `{"performer": {"nb_features": 256}}`, values by yaml.safe_load.

    A variant takes its own options and, with `shared`, timm's shared arguments (qkv_bias, ...) too.
    """
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, equals, raw = item.partition("=")
        variant, dot, option = key.partition(".")
        if not (equals and dot and variant and option):
            raise ValueError(f"option {item!r} is not VARIANT.KEY=VALUE (e.g. performer.nb_features=256)")
        if variant not in variants:
            raise ValueError(f"option {item!r} is for {variant!r}, which is not benchmarked: {', '.join(variants)}")
        if variant.startswith(PEER_PREFIX):
            raise ValueError(f"option {item!r}: peer layers are timed at fixed settings and take no options")
        own = set() if variant == PROJECTIONS else set(attention_options(variant))
        allowed = sorted(own | (SHARED_OPTIONS if shared else set()))
        if option not in allowed:
            hint = did_you_mean(option, allowed, n=1)
            raise ValueError(f"{variant!r} has no option {option!r}{hint}; its options: {', '.join(allowed)}")
        options.setdefault(variant, {})[option] = yaml.safe_load(raw)
    return options


def run_config(config: dict[str, Any], timeout: float, isolate: bool = True) -> dict[str, Any]:
    """One configuration in a fresh subprocess -> its record, `wall_s` added; failures are recorded, not raised.

    `isolate=False` runs it in this process instead (quick checks; its memory peaks include this process's).
    """
    head = {"variant": config["variant"], "length": config["length"], "options": config["options"]}
    start = time.perf_counter()
    if not isolate:
        threads = torch.get_num_threads()
        try:
            return {**measure(config), "wall_s": round(time.perf_counter() - start, 3)}
        finally:
            torch.set_num_threads(threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(config["settings"]["threads"]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (*map(str, _CHILD_PATH), env.get("PYTHONPATH"))))
    command = [sys.executable, "-m", "zoo_bench.measure", "--single", json.dumps(config)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        wall = round(time.perf_counter() - start, 3)
        return {**head, "status": "timeout", "message": f"killed after {timeout:g} s", "wall_s": wall}
    wall = round(time.perf_counter() - start, 3)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return {**json.loads(lines[-1]), "wall_s": wall}
    tail = " | ".join(proc.stderr.strip().splitlines()[-5:])[-1000:]
    if proc.returncode < 0:
        hint = " (the kernel's out-of-memory killer?)" if proc.returncode == -signal.SIGKILL else ""
        message = f"killed by {signal.Signals(-proc.returncode).name}{hint}; {tail}"
    else:
        message = f"exit code {proc.returncode} without a result; {tail}"
    return {**head, "status": "crashed", "message": message, "wall_s": wall}


def stop_reason(record: dict[str, Any], max_seconds: float) -> str | None:
    """Why longer sequences of this variant are not tried after `record`, or None."""
    if record["status"] in STOPPING:
        return f"{record['status']} at N={record['length']:,}"
    # the child's own time: interpreter start-up is the same at every length
    took = record.get("elapsed_s", record.get("wall_s", 0.0))
    if took > max_seconds:
        return f"N={record['length']:,} took {took:.3g} s > max-seconds {max_seconds:g}"
    return None


def _sweep_variants(variants: list[str]) -> tuple[list[str], list[str]]:
    """Sweep order (softmax, projections, then as asked) and notes on peers that are not installed."""
    names = list(dict.fromkeys(variants))
    ordered = [v for v in ("softmax",) if v in names] + [PROJECTIONS]
    ordered += [v for v in names if v not in ordered]
    kept, notes = [], []
    for name in ordered:
        module = PEERS.get(name[len(PEER_PREFIX) :]) if name.startswith(PEER_PREFIX) else None
        if module is not None and importlib.util.find_spec(module) is None:
            notes.append(f"{name} not timed: {module} is not installed (pip install {name[len(PEER_PREFIX) :]})")
        else:
            kept.append(name)
    return kept, notes


def metadata(settings: Settings, names: list[str], **extra: Any) -> dict[str, Any]:
    """Device, package versions, settings and date of a sweep; `extra` added as is."""
    cuda = settings.device == "cuda"
    meta = {
        "device": settings.device,
        "device_name": device_name(settings.device),
        "versions": versions(n[len(PEER_PREFIX) :] for n in names if n.startswith(PEER_PREFIX)),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": asdict(settings),
        "head_dim": settings.dim // settings.heads,
        "cpu_count": os.cpu_count(),
        "memory": "CUDA allocator peak" if cuda else "peak resident set (VmHWM)",
    }
    if cuda:
        meta.update(cuda=torch.version.cuda, flash_sdp_enabled=torch.backends.cuda.flash_sdp_enabled())
    return {**meta, **extra}


def run_sweep(
    variants: list[str],
    lengths: list[int],
    out_dir: Path | str,
    settings: Settings | None = None,
    *,
    options: dict[str, dict[str, Any]] | None = None,
    max_seconds: float = 120.0,
    timeout: float | None = None,
    command: str | None = None,
    isolate: bool = True,
    merge: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Time every variant, and `projections`, at every length; writes the report to `out_dir` and returns it.

    With `merge`, the records of an earlier sweep in `out_dir` (same settings) are kept, except those this sweep
    measures again, so a few variants can be re-measured without repeating the whole sweep. `timeout` (default
    10 x `max_seconds`) kills a configuration's child process.
    """
    settings = settings or Settings()
    options = options or {}
    timeout = 10 * max_seconds if timeout is None else timeout
    lengths = sorted({check_int("length", length, 1) for length in lengths})
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names, notes = _sweep_variants(variants)
    options = {n: {**BENCH_OPTIONS.get(n, {}), **options.get(n, {})} for n in names}
    options = {n: chosen for n, chosen in options.items() if chosen}
    notes += _option_notes(names, options, settings.causal)
    meta = metadata(
        settings,
        names,
        command=command or " ".join(sys.argv),
        lengths=lengths,
        options=options,
        max_seconds=max_seconds,
        timeout=timeout,
        isolated=isolate,
        notes=notes,
    )
    earlier = _earlier_records(out_dir, meta, {(name, length) for name in names for length in lengths}) if merge else []
    results: dict[str, Any] = {"metadata": meta, "records": earlier, "summary": {}}
    for note in notes:
        log(note)
    for name in names:
        for record in _variant_records(name, lengths, settings, options.get(name, {}), max_seconds, timeout, isolate):
            record["date"] = meta["date"]
            results["records"].append(record)
            log(_describe(record))
            (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    results["summary"] = summarize(results["records"])
    write_report(results, out_dir)
    return results


def _option_notes(names: list[str], options: dict[str, dict[str, Any]], causal: bool) -> list[str]:
    """What the report says of the options the sweep set: `max_seq_len`, the grids, the windows' keys per query."""
    notes = []
    fitted = [n for n in names if "max_seq_len" in own_options(n) and "max_seq_len" not in options.get(n, {})]
    if fitted:
        notes.append(f"max_seq_len set to each length N for {', '.join(fitted)}")
    grids = [n for n in names if needs_grid(n) and "grid_size" not in options.get(n, {})]
    if grids:
        prefix = {options.get(n, {}).get("num_prefix_tokens", 0) for n in grids} - {0}
        tokens = "the N tokens" if not prefix else "the tokens after num_prefix_tokens"
        notes.append(f"{', '.join(grids)}: {tokens} as a square patch grid, sqrt(N) x sqrt(N) (N = 1,024: 32 x 32)")
    return notes + [note for n in names if (note := footprint(n, options.get(n, {}), causal))]


def _variant_records(
    name: str,
    lengths: list[int],
    settings: Settings,
    options: dict[str, Any],
    max_seconds: float,
    timeout: float,
    isolate: bool,
):
    """One variant's records, shortest length first (a generator: the caller saves each as it comes)."""
    try:
        check_variants([name])
        problem = None if supports_causal(name) or not settings.causal else f"{name!r} has no causal mode"
    except ValueError as error:
        problem = str(error)
    stop = None
    for length in lengths:
        if problem or stop:
            status, message = ("error", f"ValueError: {problem}") if problem else ("skipped", stop)
            yield {"variant": name, "length": length, "options": options, "status": status, "message": message}
            continue
        try:
            config = single_config(name, length, settings, options, budget_s=max_seconds)
        except ValueError as error:
            # a length this variant cannot take (not a square grid): the longer ones may be
            yield {"variant": name, "length": length, "options": options, **failure(error)}
            continue
        record = run_config(config, timeout, isolate)
        stop = stop_reason(record, max_seconds)
        yield record


def _earlier_records(out_dir: Path, meta: dict[str, Any], remeasured: set[tuple[str, int]]) -> list[dict[str, Any]]:
    """The records of the sweep saved in `out_dir` that this one does not measure again (for `merge`)."""
    path = out_dir / "results.json"
    if not path.is_file():
        return []
    earlier = json.loads(path.read_text())
    if earlier["metadata"]["settings"] != meta["settings"]:
        raise ValueError(
            f"cannot merge into {path}: its settings {earlier['metadata']['settings']} differ from {meta['settings']}"
        )
    date = earlier["metadata"]["date"]
    kept = [r for r in earlier["records"] if (r["variant"], r["length"]) not in remeasured]
    meta["merged_from"] = [*earlier["metadata"].get("merged_from", []), earlier["metadata"]["command"]]
    # the earlier options and notes stay with the earlier records (a re-measured variant's options are this sweep's)
    names = {name for name, _ in remeasured}
    kept_options = {name: chosen for name, chosen in earlier["metadata"]["options"].items() if name not in names}
    meta["options"] = {**kept_options, **meta["options"]}
    meta["notes"] = list(dict.fromkeys([*earlier["metadata"].get("notes", []), *meta["notes"]]))
    meta["lengths"] = sorted({*meta["lengths"], *earlier["metadata"]["lengths"]})
    # the packages of both sweeps (peers measured only in the earlier one included)
    meta["versions"] = {**earlier["metadata"]["versions"], **meta["versions"]}
    return [{"date": date, **record} for record in kept]


def _describe(record: dict[str, Any]) -> str:
    where = f"{record['variant']} N={record['length']}"
    if record["status"] != "ok":
        return f"{where}: {record['status']}: {record.get('message', '')}"
    error = "n/a" if record.get("rel_error") is None else f"{record['rel_error']:.2e}"
    return (
        f"{where}: fwd+bwd {record['fwd_bwd_s']:.4g} s, fwd {record['fwd_s']:.4g} s, peak {record['peak_mib']:.0f} MiB "
        f"(+{record['extra_mib']:.0f}), rel error {error} [{record['wall_s']:.1f} s]"
    )
