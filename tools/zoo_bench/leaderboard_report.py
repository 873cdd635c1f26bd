"""A leaderboard's report: each variant's score over seeds beside Long Range Arena's row for its family, the
protocol stated, as `leaderboard_<task>.json`, `.md` and `.png` (matplotlib is imported only to draw)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

__all__ = ["LRA_COLUMNS", "LRA_FAMILY", "LRA_TABLE1", "lra_column", "summarize", "write_markdown", "write_report"]

# Long Range Arena (Tay et al. 2020, arXiv:2011.04006) Table 1: test accuracy (%) under LRA's own protocol (its
# models, sizes and budgets); None: the model did not learn the task (Path-X, "fail" in the paper).
LRA_COLUMNS = ("ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Path-X", "avg")
LRA_TABLE1 = {
    "Transformer": (36.37, 64.27, 57.46, 42.44, 71.40, None, 54.39),
    "Local Attention": (15.82, 52.98, 53.39, 41.46, 66.63, None, 46.06),
    "Sparse Trans.": (17.07, 63.58, 59.59, 44.24, 71.71, None, 51.24),
    "Longformer": (35.63, 62.85, 56.89, 42.22, 69.71, None, 53.46),
    "Linformer": (35.70, 53.94, 52.27, 38.56, 76.34, None, 51.36),
    "Reformer": (37.27, 56.10, 53.40, 38.07, 68.50, None, 50.67),
    "Synthesizer": (36.99, 61.68, 54.67, 41.61, 69.45, None, 52.88),
    "BigBird": (36.05, 64.02, 59.29, 40.83, 74.87, None, 55.01),
    "Linear Trans.": (16.13, 65.90, 53.09, 42.34, 75.30, None, 50.55),
    "Performer": (18.01, 65.40, 53.82, 42.77, 77.05, None, 51.41),
}
# zoo variant -> the LRA row of its family; the others have none
LRA_FAMILY = {
    "softmax": "Transformer",
    "local": "Local Attention",
    "sparse": "Sparse Trans.",
    "longformer": "Longformer",
    "linformer": "Linformer",
    "reformer": "Reformer",
    "synthesizer": "Synthesizer",
    "bigbird": "BigBird",
    "linear": "Linear Trans.",
    "performer": "Performer",
}
# a word in the recipe's name -> the LRA column of its task (checked in this order: pathx before pathfinder)
_TASK_WORDS = (
    ("listops", "ListOps"),
    ("pathx", "Path-X"),
    ("path_x", "Path-X"),
    ("pathfinder", "Pathfinder"),
    ("lra_image", "Image"),
    ("cifar", "Image"),
    ("lra_text", "Text"),
    ("imdb", "Text"),
    ("retrieval", "Retrieval"),
)
# the test metric a leaderboard ranks by: the first of these that the runs report
_HEADLINES = ("top1", "f1", "mcc", "auroc", "mse", "mae", "perplexity", "loss")
_LOWER_IS_BETTER = ("mse", "mae", "perplexity", "loss")


def lra_column(task: str) -> str:
    """The LRA column that compares with `task` (a recipe name such as lra_listops_quick), else `avg`."""
    return next((column for word, column in _TASK_WORDS if word in task.lower()), "avg")


def lra_value(variant: str, column: str) -> str:
    family = LRA_FAMILY.get(variant)
    if family is None:
        return "-"
    value = LRA_TABLE1[family][LRA_COLUMNS.index(column)]
    return "fail" if value is None else f"{value:.2f}"


def headline(records: list[dict[str, Any]]) -> str | None:
    """The metric to rank by (`top1` for classification), or None when no run finished."""
    reported = {key for r in records if r["status"] == "ok" for key in r.get("test", {})}
    return next((key for key in _HEADLINES if key in reported), None)


def _score(record: dict[str, Any], key: str) -> float:
    # accuracy in percent, as LRA reports it
    return 100 * record["test"][key] if key == "top1" else record["test"][key]


def summarize(records: list[dict[str, Any]], variants: list[str]) -> list[dict[str, Any]]:
    """One row per variant, ranked: score mean and sample standard deviation over the seeds that finished, mean
    wall time and samples/s, largest peak memory, and the failures; variants with no finished seed come last."""
    key = headline(records)
    names = list(dict.fromkeys([*variants, *(r["variant"] for r in records)]))
    rows = []
    for name in names:
        runs = sorted((r for r in records if r["variant"] == name), key=lambda r: r["seed"])
        done = [r for r in runs if r["status"] == "ok" and key in r.get("test", {})]
        scores = [_score(r, key) for r in done]
        rows.append(
            {
                "variant": name,
                "seeds": len(runs),
                "finished": len(done),
                "score": statistics.fmean(scores) if scores else None,
                "spread": statistics.stdev(scores) if len(scores) > 1 else None,
                "wall_s": statistics.fmean(r["train_wall_s"] for r in done) if done else None,
                "samples_per_s": _mean([r.get("samples_per_s") for r in done]),
                "peak_mib": max((r["peak_mib"] for r in done if r.get("peak_mib")), default=None),
                "failures": [{k: r.get(k) for k in ("seed", "status", "message")} for r in runs if r["status"] != "ok"],
            }
        )
    sign = 1 if key in _LOWER_IS_BETTER else -1
    rows.sort(key=lambda row: (row["score"] is None, sign * (row["score"] or 0.0)))
    return rows


def _mean(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.fmean(present) if present else None


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def write_markdown(results: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    proto, key = results["protocol"], headline(results["records"])
    column = lra_column(proto["task"])
    unit = " (%)" if key == "top1" else ""
    model = ", ".join(f"{k} {v}" for k, v in proto["model"].items() if v is not None)
    versions = ", ".join(f"{k} {v}" for k, v in proto["versions"].items() if v)
    seeds = proto["seeds"]
    lines = [
        f"# Leaderboard: {proto['task']} on {proto['device_name']}",
        "",
        f"{proto['date']}; {versions}. Command: `{proto['command']}`",
        "",
        "## Protocol",
        "",
        (
            f"- Recipe `{proto['recipe']}`: task {proto['objective']}, data {proto['dataset']}, model ({model}), "
            f"batch {proto['batch_size']}; every variant with the same model, data and budget: "
            f"{proto['budget_steps']} optimizer steps per run, seeds {seeds[0]}..{seeds[-1]} (the seed sets the "
            "initialisation and the batch order; the data and its splits are the recipe's)."
        ),
        f"- Each run in fresh processes: `{proto['run']}`; the tested checkpoint is the run's best on validation.",
        (
            f"- Score: test {key}{unit}, mean +- sample standard deviation over the seeds that finished. "
            "Wall time: the training process from start to end (start-up, data, evaluations and checkpoints "
            "included), mean over seeds; samples/s: the training loop's own rate, median over a run's epochs, mean "
            f"over seeds; peak memory: {proto['memory']}, the largest over seeds."
        ),
        (
            f"- LRA: Tay et al. 2020, Table 1, column {column}, the row of the variant's family (- : no family there). "
            "LRA trained larger models for longer under its own protocol: compare the ranking, not the numbers."
        ),
        f"- Device: {proto['device_name']} ({proto['cpu_count']} CPUs; "
        f"{proto.get('threads', '?')} torch threads per run).",
        "",
        (
            f"| rank | variant | test {key}{unit} | seeds done | wall time (s) | samples/s | peak memory (MiB) "
            f"| LRA row | LRA {column} |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rank, row in enumerate(rows, 1):
        if row["score"] is None:
            score = f"failed: {row['failures'][0]['status']}" if row["failures"] else "not run"
            place = "-"
        else:
            spread = "" if row["spread"] is None else f" +- {row['spread']:.2f}"
            score, place = f"{row['score']:.2f}{spread}", str(rank)
        cells = [
            place,
            f"`{row['variant']}`",
            score,
            # out of the sweep's seeds: a variant that a stopped sweep has not reached yet shows 0/2, not 0/0
            f"{row['finished']}/{max(row['seeds'], len(proto.get('seeds', [])))}",
            _cell(row["wall_s"], ".1f"),
            _cell(row["samples_per_s"], ".1f"),
            _cell(row["peak_mib"], ".0f"),
            LRA_FAMILY.get(row["variant"], "-"),
            lra_value(row["variant"], column),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    failures = [(row["variant"], failure) for row in rows for failure in row["failures"]]
    if failures:
        lines += ["", "## Failures", ""]
        lines += [f"- `{name}` seed {f['seed']}: {f['status']}: {f['message']}" for name, f in failures]
    path.write_text("\n".join(lines) + "\n")


def plot(results: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    """Score per variant with its spread and LRA's number for the family; score against wall time."""
    from matplotlib.figure import Figure

    key, column = headline(results["records"]), lra_column(results["protocol"]["task"])
    scored = [row for row in rows if row["score"] is not None][::-1]
    figure = Figure(figsize=(13, 1.5 + 0.35 * max(len(scored), 6)), layout="constrained")
    bars, scatter = figure.subplots(1, 2, width_ratios=(3, 2))
    positions = range(len(scored))
    label = f"test {key}" + (" (%)" if key == "top1" else "")
    bars.barh(
        positions,
        [row["score"] for row in scored],
        xerr=[row["spread"] or 0 for row in scored],
        color="tab:blue",
        label=f"{label}, mean +- std over seeds",
    )
    lra = [(i, lra_value(row["variant"], column)) for i, row in enumerate(scored)]
    lra = [(i, float(value)) for i, value in lra if value not in ("-", "fail")]
    if lra and key == "top1":
        bars.plot([v for _, v in lra], [i for i, _ in lra], "kD", label=f"LRA Table 1, {column}")
    bars.set(yticks=list(positions), yticklabels=[row["variant"] for row in scored], xlabel=label)
    figure.legend(*bars.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize="small")
    for row in scored:
        scatter.plot(row["wall_s"], row["score"], "o", color="tab:blue")
        scatter.annotate(
            row["variant"], (row["wall_s"], row["score"]), fontsize="small", xytext=(3, 3), textcoords="offset points"
        )
    walls = [row["wall_s"] for row in scored]
    # a log axis only where the times span a decade: its ticks are unreadable over a narrow range
    wide = bool(walls) and max(walls) > 10 * min(walls)
    scatter.set(xscale="log" if wide else "linear", xlabel="training wall time (s)", ylabel=label)
    scatter.grid(True, alpha=0.3)
    proto = results["protocol"]
    figure.suptitle(f"{proto['task']}: {proto['budget_steps']} steps per run, {proto['device_name']}")
    figure.savefig(path, dpi=110)


def write_report(results: dict[str, Any], out_dir: Path | str) -> None:
    """`leaderboard_<task>.json` (protocol, every run's record, the ranked rows), `.md` and `.png`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"leaderboard_{results['protocol']['task']}"
    rows = summarize(results["records"], results["protocol"]["variants"])
    results["summary"] = rows
    # written aside, then renamed: a sweep stopped mid-write still resumes from the previous file
    partial = out_dir / f"{stem}.json.tmp"
    partial.write_text(json.dumps(results, indent=1))
    partial.replace(out_dir / f"{stem}.json")
    write_markdown(results, rows, out_dir / f"{stem}.md")
    plot(results, rows, out_dir / f"{stem}.png")
