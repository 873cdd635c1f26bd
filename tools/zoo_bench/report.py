"""A sweep's report: the log-log slope of time against N, the crossover against softmax, `results.md`, and the
`time.png` / `memory.png` plots (matplotlib is imported only to draw them)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .measure import PROJECTIONS, STOPPING
from .peers import PEER_PREFIX, PEER_VARIANTS

__all__ = ["SLOPE_RANGE", "find_crossover", "fit_slope", "plot", "summarize", "write_markdown", "write_report"]

# The log-log slope of forward + backward time is fitted over the measured lengths in this range (inclusive).
SLOPE_RANGE = (4096, 65536)


def fit_slope(
    lengths: list[int], times: list[float], low: int = SLOPE_RANGE[0], high: int = SLOPE_RANGE[1]
) -> float | None:
    """Least-squares slope of log(time) against log(length) over lengths in [low, high]; None below 2 lengths."""
    pairs = zip(lengths, times, strict=True)
    points = [(math.log(n), math.log(t)) for n, t in pairs if low <= n <= high and t is not None and t > 0]
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return covariance / sum((x - mean_x) ** 2 for x, _ in points)


def find_crossover(
    times: dict[int, float], baseline: dict[int, float], baseline_failed: dict[int, str] | None = None
) -> dict[str, Any]:
    """The length from which `times` beats `baseline`, log-log interpolated between measured lengths.

    `times`, `baseline`: length -> seconds, where measured; `baseline_failed`: length -> status where the baseline
    did not run (out of memory, skipped): the variant wins there. -> `{"length": float or None, "text": str}`.
    """
    baseline_failed = baseline_failed or {}
    previous = None
    for n in sorted(times):
        if n in baseline_failed:
            return {"length": float(n), "text": f"<= {n:,} (softmax: {baseline_failed[n]} at {n:,})"}
        if n not in baseline:
            continue
        ratio = times[n] / baseline[n]
        if ratio < 1 and previous is None:
            return {"length": float(n), "text": f"<= {n:,} (faster at every length measured)"}
        if ratio < 1:
            n0, r0 = previous
            log_n = math.log(n0) - math.log(r0) * (math.log(n) - math.log(n0)) / (math.log(ratio) - math.log(r0))
            return {"length": math.exp(log_n), "text": f"~{math.exp(log_n):,.0f}"}
        previous = (n, ratio)
    if previous is None:
        return {"length": None, "text": "not measured"}
    return {"length": None, "text": f"> {previous[0]:,} (slower at every length measured)"}


def _series(records: list[dict[str, Any]], name: str, key: str) -> dict[int, float]:
    return {
        r["length"]: r[key] for r in records if r["variant"] == name and r["status"] == "ok" and r.get(key) is not None
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: the fitted slope of forward + backward time, and the crossover against softmax."""
    names = list(dict.fromkeys(r["variant"] for r in records))
    softmax = _series(records, "softmax", "fwd_bwd_s")
    failed = {r["length"]: r["status"] for r in records if r["variant"] == "softmax" and r["status"] != "ok"}
    failed = {n: status for n, status in failed.items() if status in (*STOPPING, "skipped")}
    summary = {}
    for name in names:
        times = _series(records, name, "fwd_bwd_s")
        lengths = sorted(times)
        summary[name] = {
            "slope": fit_slope(lengths, [times[n] for n in lengths]),
            "slope_lengths": [n for n in lengths if SLOPE_RANGE[0] <= n <= SLOPE_RANGE[1]],
        }
        if name not in ("softmax", PROJECTIONS) and "softmax" in names:
            summary[name]["crossover"] = find_crossover(times, softmax, failed)
    return summary


_SHORT = {"oom": "OOM", "timeout": "timeout", "crashed": "crash", "skipped": "skip", "error": "error"}


def _table(names: list[str], lengths: list[int], cell: Callable[[str, int], str], extra=None) -> list[str]:
    """Markdown table, variant rows x length columns; `extra`: (title, variant -> str) for a last column."""
    header = ["variant", *(f"{n:,}" for n in lengths)] + ([extra[0]] if extra else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        cells = [f"`{name}`", *(cell(name, n) for n in lengths)] + ([extra[1](name)] if extra else [])
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def write_markdown(results: dict[str, Any], path: Path) -> None:
    meta, records, summary = results["metadata"], results["records"], results["summary"]
    settings = meta["settings"]
    names = list(dict.fromkeys(r["variant"] for r in records))
    lengths = sorted({r["length"] for r in records})
    by = {(r["variant"], r["length"]): r for r in records}

    def value(key: str, fmt: str) -> Callable[[str, int], str]:
        def cell(name: str, n: int) -> str:
            record = by.get((name, n), {"status": ""})
            if record["status"] != "ok":
                return _SHORT.get(record["status"], record["status"])
            return "n/a" if record.get(key) is None else format(record[key], fmt)

        return cell

    def ratio(numerator: str, denominator: str) -> Callable[[str, int], str]:
        def cell(name: str, n: int) -> str:
            a, b = by.get((numerator or name, n), {}), by.get((denominator or name, n), {})
            return f"{a['fwd_bwd_s'] / b['fwd_bwd_s']:.3g}" if a.get("status") == b.get("status") == "ok" else ""

        return cell

    def slope(name: str) -> str:
        fitted = summary.get(name, {}).get("slope")
        return "" if fitted is None else f"{fitted:.2f}"

    lines = [
        *_header(meta),
        "## Forward + backward time (s)",
        "",
        (
            "Gradients w.r.t. the parameters and the input. Slope: least-squares fit of log time against log N over "
            f"{SLOPE_RANGE[0]:,} <= N <= {SLOPE_RANGE[1]:,}."
        ),
        "",
        *_table(names, lengths, value("fwd_bwd_s", ".4g"), ("slope", slope)),
        "## Forward time (s), under torch.no_grad",
        "",
        *_table(names, lengths, value("fwd_s", ".4g")),
        f"## Peak memory, forward + backward (MiB): {meta['memory']}",
        "",
        *_table(names, lengths, value("peak_mib", ".0f")),
        "## Memory above the baseline before the run, forward + backward (MiB)",
        "",
        *_table(names, lengths, value("extra_mib", ".0f")),
        f"## Relative error against exact softmax ({settings['error_rows']} sampled query rows)",
        "",
        (
            "||out - exact|| / ||exact||, exact: float32 softmax attention with the variant's qkv / proj weights. A "
            "variant that forms its keys differently (reformer's shared QK) differs by construction, not only by "
            "approximation."
        ),
        "",
        *_table(names, lengths, value("rel_error", ".2e")),
    ]
    if "softmax" in names:
        lines += ["## Speedup against softmax (softmax's forward + backward time / the variant's)", ""]
        lines += _table(names, lengths, ratio("softmax", ""))
        lines += _crossovers(names, meta, summary)
    lines += ["## Time relative to projections (forward + backward time / that of the projections alone)", ""]
    lines += _table(names, lengths, ratio("", PROJECTIONS))
    lines += _peer_tables(names, lengths, by)
    lines += _failures(records, meta)
    path.write_text("\n".join(lines))


def _header(meta: dict[str, Any]) -> list[str]:
    """The title, the date and versions, the settings and the command of a sweep."""
    settings = meta["settings"]
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    return [
        f"# Attention benchmark: {meta['device_name']}",
        "",
        f"{meta['date']}; {versions}.",
        (
            f"Batch {settings['batch']}, dim {settings['dim']}, {settings['heads']} heads x {meta['head_dim']}, "
            f"{settings['dtype']}, {'causal' if settings['causal'] else 'non-causal'}, threads: {settings['threads']}; "
            f"the whole module (qkv and proj included); median of {settings['repeats']} runs after "
            f"{settings['warmup']} warm-up; each configuration in "
            f"{'a fresh process' if meta['isolated'] else 'the sweep process'}. Command: `{meta['command']}`"
        ),
        *[f"Merged with the earlier records of `{command}`." for command in meta.get("merged_from", [])],
        "",
    ]


def _crossovers(names: list[str], meta: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """The length from which each variant beats softmax (forward + backward), as a table."""
    settings = meta["settings"]
    lines = ["## Crossover against softmax (forward + backward)", ""]
    if meta["device"] == "cuda" and settings["dtype"] in ("bf16", "fp16"):
        lines += ["softmax runs through SDPA, which takes its flash kernel at this dtype.", ""]
    lines += ["| variant | crossover N |", "|---|---|"]
    lines += [f"| `{n}` | {summary[n]['crossover']['text']} |" for n in names if "crossover" in summary.get(n, {})]
    return lines + [""]


def _failures(records: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The failed and skipped configurations and the sweep's notes (nothing when there are none)."""
    failures = [r for r in records if r["status"] != "ok" or r.get("rel_error_message")]
    if not (failures or meta.get("notes")):
        return []
    lines = ["## Failures, skips and notes", ""]
    for r in failures:
        message = r.get("message") or f"relative error: {r['rel_error_message']}"
        lines.append(f"- `{r['variant']}` N={r['length']:,}: {r['status']}: {message}")
    return lines + [f"- {note}" for note in meta.get("notes", [])] + [""]


def _peer_tables(names: list[str], lengths: list[int], by: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """Each measured peer against its zoo variant: speedup (the peer's forward + backward time / ours) and peak
    memory, ours / the peer's."""
    pairs = [(PEER_VARIANTS[n[len(PEER_PREFIX) :]], n) for n in names if n.startswith(PEER_PREFIX)]
    pairs = [(ours, peer) for ours, peer in pairs if ours in names]
    if not pairs:
        return []

    def cell(ours: str, peer: str, n: int) -> str:
        a, b = by.get((ours, n), {}), by.get((peer, n), {})
        if a.get("status") != "ok" or b.get("status") != "ok":
            return ""
        return f"{b['fwd_bwd_s'] / a['fwd_bwd_s']:.2f}x, {a['peak_mib']:.0f} / {b['peak_mib']:.0f} MiB"

    lines = [
        "## Against the peer packages",
        "",
        "Per length: speedup (the peer's forward + backward time / zoo's), then peak memory, zoo's / the peer's.",
        "",
        "| zoo variant | peer | " + " | ".join(f"{n:,}" for n in lengths) + " |",
        "|" + "---|" * (len(lengths) + 2),
    ]
    for ours, peer in pairs:
        lines.append(f"| `{ours}` | `{peer}` | " + " | ".join(cell(ours, peer, n) for n in lengths) + " |")
    return lines + [""]


def plot(results: dict[str, Any], out_dir: Path) -> None:
    """`time.png` (forward + backward, forward) and `memory.png` (peak, above baseline) against N, log-log."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    records, meta = results["records"], results["metadata"]
    names = list(dict.fromkeys(r["variant"] for r in records))
    lengths = sorted({r["length"] for r in records})
    # 20 distinct colours (the default cycle repeats after 10); peers dotted with crosses, beside zoo's own
    palette = matplotlib.colormaps["tab20"].colors
    style = {name: {"color": palette[i % len(palette)], "marker": "o"} for i, name in enumerate(names)}
    style.update(
        {name: {**style[name], "linestyle": ":", "marker": "x"} for name in names if name.startswith(PEER_PREFIX)}
    )
    style.update(
        {"softmax": {"color": "black", "marker": "o"}, PROJECTIONS: {"color": "gray", "linestyle": "--", "marker": "o"}}
    )
    panels = {
        "time.png": (("fwd_bwd_s", "forward + backward (s)"), ("fwd_s", "forward (s)")),
        "memory.png": (("peak_mib", "peak memory (MiB)"), ("extra_mib", "memory above the baseline (MiB)")),
    }
    settings = meta["settings"]
    title = f"{meta['device_name']}: batch {settings['batch']}, dim {settings['dim']}, {settings['heads']} heads, "
    for filename, pair in panels.items():
        figure = Figure(figsize=(14, 5.2), layout="constrained")
        axes = figure.subplots(1, 2)
        for axis, (key, label) in zip(axes, pair, strict=True):
            for name in names:
                points = sorted((n, v) for n, v in _series(records, name, key).items() if v > 0)
                if points:
                    axis.plot(*zip(*points, strict=True), label=name, **style[name])
            axis.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel=label)
            axis.set_xticks(lengths, [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths])
            axis.xaxis.set_minor_formatter(NullFormatter())
            axis.grid(True, which="both", alpha=0.3)
        figure.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize="small")
        figure.suptitle(title + settings["dtype"] + (f"; memory: {meta['memory']}" if filename == "memory.png" else ""))
        figure.savefig(out_dir / filename, dpi=110)


def write_report(results: dict[str, Any], out_dir: Path | str) -> None:
    """`results.json`, `results.md`, `time.png` and `memory.png` in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    write_markdown(results, out_dir / "results.md")
    plot(results, out_dir)
