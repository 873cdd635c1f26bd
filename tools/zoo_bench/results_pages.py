"""One results page per machine, `docs/results/<machine>.md`, and their index `docs/results/README.md`: every committed
JSON file under `benchmarks/<machine>/` shown as a table, each number through the same function the cards and the
decision page format it with (`zoo_bench._results`), so that no two pages disagree. `tools/pages.py` writes them;
the suite checks that the committed pages are what the committed results give.

A file is read by what it holds: a layer sweep (`records` with `fwd_bwd_s`), a device check (`parts`), a recall grid
(`protocol` and `records` with `label`), the recall timing beside it (`recall_speed.json`), a leaderboard, the
high-resolution, segmentation and conversion studies; any other file (a kernel tuning, a training recipe's record)
is listed with a link to it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._results import (
    conversion_text,
    faster_from,
    load,
    miou_text,
    percent_mean_std,
    score_text,
    timed,
)
from .machine import REPO_ROOT
from .measure import PROJECTIONS
from .recall_grid import cell_text, summarize_cells
from .recall_speed import throughputs

__all__ = ["MACHINES", "results_pages"]

# machine -> its results folder, in the index's order
MACHINES = {
    "cpu": "benchmarks/cpu",
    "cpu-xeon": "benchmarks/cpu-xeon",
    "nvidia-h200": "benchmarks/nvidia-h200",
    "nvidia-h100-80gb-hbm3": "benchmarks/nvidia-h100-80gb-hbm3",
}
PAGES = "docs/results"


def _link(path: str) -> str:
    """`path` (relative to the repository root) as a link from a page in docs/results/."""
    return f"[{path}]({os.path.relpath(path, PAGES)})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _by_variant(records: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for record in records:
        found.setdefault(record["variant"], {})[record["length"]] = record
    return found


# rows of a layer sweep that are no variant to compare with softmax
_SPECIAL = {"softmax": "softmax itself", PROJECTIONS: "the cost floor"}


def _layer_sweep(data: dict[str, Any]) -> list[str]:
    meta = data["metadata"]
    settings = meta.get("settings", {})
    lengths = sorted({r["length"] for r in data["records"]})
    by_variant = _by_variant(data["records"])
    softmax = by_variant.get("softmax", {})
    rows = []
    for name, mine in by_variant.items():
        start = faster_from(mine, softmax) if name != "softmax" and softmax else None
        faster = _SPECIAL.get(name) or (f"{start:,} tokens" if start else "-")
        error = mine.get(16384, {}).get("rel_error")
        error_text = "-" if error is None or name == PROJECTIONS else f"{error:.2g}"
        rows.append([f"`{name}`", *(timed(mine.get(n)) for n in lengths), faster, error_text])
    what = (
        f"One layer (dim {settings.get('dim')}, {settings.get('heads')} heads, batch {settings.get('batch')}, "
        f"{settings.get('dtype')}), forward + backward: time and peak memory; the length from which it is faster than "
        "softmax beyond the noise at every longer measured length; the error against exact attention at 16K."
    )
    header = ["variant", *(f"{n:,}" for n in lengths), "faster than softmax from", "error at 16K"]
    return [what, "", *_table(header, rows)]


# softmax's classifier run in a check: `vit_softmax_1024`, or `softmax_1024` in the older checks
_SOFTMAX_RUN = re.compile(r"(?:vit_)?softmax_\d+")


def _rate_over(item: dict[str, Any], base: dict[int, float]) -> str:
    if item["run"].startswith("seg_") or item["tokens"] not in base:
        return "-"
    return f"{item['samples_per_s'] / base[item['tokens']]:.2f}x"


def _device_check(data: dict[str, Any]) -> list[str]:
    lines = []
    items = [i for i in data["parts"].get("train", {}).get("items", []) if i.get("ok")]
    if items:
        # a classifier's rate over softmax's at the same tokens; a segmentation run's decoder is not the classifier's
        base = {i["tokens"]: i["samples_per_s"] for i in items if _SOFTMAX_RUN.fullmatch(i["run"])}
        rows = [
            [
                f"`{i['run']}`",
                f"{i['tokens']:,}",
                f"{i['samples_per_s']:.1f}",
                _rate_over(i, base),
            ]
            for i in items
        ]
        header = ["run", "tokens", "samples/s", "vs softmax"]
        lines += ["Training (ViT, bf16, one real batch repeated):", "", *_table(header, rows), ""]
    checked = data["parts"].get("correctness", {}).get("items", [])
    if checked:
        wrong = [i["variant"] for i in checked if not i["ok"]]
        past = f"; past tolerance: {', '.join(f'`{name}`' for name in wrong)}" if wrong else ""
        lines += [f"Correctness: {len(checked) - len(wrong)} of {len(checked)} variants within tolerance{past}.", ""]
    parts = ", ".join(f"{name} ({part.get('status')})" for name, part in data["parts"].items())
    return [*lines, f"Parts: {parts}."]


def _recall(data: dict[str, Any]) -> list[str]:
    cells = summarize_cells(data["records"])
    columns = sorted({(length, width) for _, length, width in cells})
    labels = list(dict.fromkeys(label for label, _, _ in cells))
    rows = [[f"`{label}`", *(cell_text(cells.get((label, *column))) for column in columns)] for label in labels]
    steps = data["protocol"].get("budget_steps")
    what = f"MQAR test accuracy, the best lr's mean ± std over seeds, {steps} steps; columns: length L, width d."
    return [what, "", *_table(["variant", *(f"L={n}, d={d}" for n, d in columns)], rows)]


def _recall_speed(data: dict[str, Any]) -> list[str]:
    rates = throughputs(data)
    rows = [
        [f"`{r['label']}`", f"{rates[r['label']]:,.0f}" if r["label"] in rates else r["status"]]
        for r in data["records"]
    ]
    length = data["metadata"].get("length")
    return [
        f"Forward + backward tokens per second of one layer at {length:,} tokens.",
        "",
        *_table(["variant", "tok/s"], rows),
    ]


def _leaderboard(data: dict[str, Any]) -> list[str]:
    proto = data["protocol"]
    rows = [
        [
            f"`{row['variant']}`",
            score_text(row) if row["finished"] else "failed",
            f"{row.get('samples_per_s') or 0:.1f}",
        ]
        for row in data["summary"]
    ]
    what = f"`{proto['task']}`, {proto['budget_steps']} steps, seeds {proto.get('seeds')}: test score %, mean ± std."
    return [what, "", *_table(["variant", "score", "samples/s"], rows)]


def _highres(data: dict[str, Any]) -> list[str]:
    proto = data["protocol"]
    layouts = list(dict.fromkeys([*(r["layout"] for r in data["runs"]), *data["steps"]]))
    rows = []
    for layout in layouts:
        scores = [r["test"]["top1"] for r in data["runs"] if r["layout"] == layout and r["status"] == "ok"]
        step = data["steps"].get(layout, {})
        rows.append(
            [
                layout,
                percent_mean_std(scores) if scores else "-",
                f"{step['step_s']:.2f}" if "step_s" in step else step.get("status", "-"),
            ]
        )
    header = ["layout", "test top-1 % (mean ± std)", f"step at {proto['step_img_size']} px (s)"]
    return [f"`{proto['recipe']}`, {proto['budget_steps']} steps.", "", *_table(header, rows)]


def _recall2d(data: dict[str, Any]) -> list[str]:
    """The 2-D recall probe (zoo_bench.recall2d): each layout's test accuracy on the query pixels and verdict."""
    summary = data["summary"]

    def score(values: list[float]) -> str:
        if len(values) == 1:
            return f"{100 * values[0]:.1f} (one seed)"
        return percent_mean_std(values) if values else "-"

    rows = [[layout, score(row["accuracy"]), row["verdict"]] for layout, row in summary["layouts"].items()]
    rules = ", ".join(
        f"{name} {100 * scores['pixel_accuracy']:.1f}"
        for name, scores in summary["baselines"].items()
        if "pixel_accuracy" in scores
    )
    proto = data["protocol"]
    text = f"`{proto['recipe']}`, {proto['budget_steps']} steps; rules that recall nothing: {rules}."
    return [text, "", *_table(["layout", "test accuracy % on the query pixels (mean ± std)", "verdict"], rows)]


def _segmentation(data: dict[str, Any]) -> list[str]:
    summary = data["summary"]
    background = summary["all_background"]["miou"]
    rows = [
        [layout, miou_text(row, background) if row["miou"] is not None else "-"]
        for layout, row in summary["layouts"].items()
    ]
    return [f"`{data['protocol']['recipe']}`: test mIoU %, mean ± std.", "", *_table(["layout", "mIoU"], rows)]


def _conversion(data: dict[str, Any]) -> list[str]:
    teacher = data["teacher"]["top1_at_target"]
    rows = [[f"`{row['variant']}`", conversion_text(row, teacher)] for row in data["rows"]]
    return [
        "A softmax teacher converted to each variant at 4x the tokens: test top-1 %.",
        "",
        *_table(["variant", "top-1"], rows),
    ]


def _quickstart(data: dict[str, Any]) -> list[str]:
    """The quickstart study (zoo_bench.quickstart): its test top-1 over seeds, then each run's time."""
    protocol, records = data["protocol"], data["records"]
    full = [r for r in records if r["setting"] == "policy" and r["steps"] == max(x["steps"] for x in records)]
    lines = [
        f"`{protocol['recipe']}` as `make quickstart` runs it, on {protocol['cores']} cores shared with other jobs "
        f"(each run's load average before and after). Test top-1 % over seeds {', '.join(str(r['seed']) for r in full)}"
        f": {percent_mean_std([r['test_top1'] for r in full])} (mean ± std; chance "
        f"{100 * protocol['trivial_baseline_top1']:.0f}).",
        "",
    ]
    base = next((r for r in records if r["setting"] == "policy" and r["max_steps"] == protocol["timing_steps"]), None)
    rows = []
    for r in records:
        ratio = f"{r['step_s'] / base['step_s']:.2f}x" if base and r["max_steps"] == base["max_steps"] else ""
        rows.append([
            r["setting"], str(r["seed"]), str(r["steps"]), f"{r['train_wall_s']:.0f}",
            "-" if r["train_cpu_s"] is None else f"{r['train_cpu_s']:.0f}",
            f"{r['step_s']:.3g}", ratio, (r["threads"] or "-").removeprefix("threads: ").split(" (")[0],
            f"{r['load_before']:.1f} / {r['load_after']:.1f}", f"{100 * r['test_top1']:.1f}",
        ])  # fmt: skip
    header = ["setting", "seed", "steps", "wall s", "CPU s", "step s", "step / policy's", "threads", "load", "top-1 %"]
    notes = [f"- {protocol[key]}" for key in ("timing", "machine", "cpu_note") if protocol.get(key)]
    settings = [f"- `{k}`: {v}" for k, v in protocol["settings"].items()]
    return [*lines, *_table(header, rows), "", *settings, *notes]


def _naflex(data: dict[str, Any]) -> list[str]:
    """Native resolution against resize-to-square at one token budget (zoo_bench.naflex)."""
    proto, rows = data["protocol"], []
    for attention in proto["attentions"]:
        for mode in proto["resize"]:
            runs = [r for r in data["runs"] if (r["attention"], r["resize"]) == (attention, mode) and "test" in r]
            if runs:
                rate = sum(r.get("valid_tokens_per_s", 0) for r in runs) / len(runs)
                per_cpu = data["summary"].get(f"{attention} {mode}", {}).get("trained_tokens_per_cpu_s", float("nan"))
                top1 = percent_mean_std([r["test"]["top1"] for r in runs])
                tokens = proto["tokens"][mode]["valid_tokens_per_sample"]
                rows.append([f"`{attention}`", mode, top1, f"{tokens:.1f}", f"{rate:.0f}", f"{per_cpu:.0f}"])
    header = [
        "attention", "resize", "test top-1 % (mean ± std)", "patches / image", "patches / s (wall)", "patches / CPU s"
    ]  # fmt: skip
    text = (
        f"`{proto['recipe']}` with {' '.join(proto['sets'])}: each image at its own size (native) or squashed to the "
        f"square grid (square), within the same budget; seeds {proto['seeds']}; most frequent class "
        f"{100 * data['trivial_top1']:.1f} %."
    )
    return [text, "", *_table(header, rows)]


def _reader(data: Any, path: str) -> Callable[[dict[str, Any]], list[str]] | None:
    """The section writer for a file, by what it holds; None: listed only."""
    if not isinstance(data, dict):
        return None
    if path.endswith("naflex.json"):
        return _naflex
    if path.endswith("recall2d.json"):
        return _recall2d
    records = data.get("records") or [{}]
    if path.endswith("recall_speed.json"):
        return _recall_speed
    if "metadata" in data and "fwd_bwd_s" in records[0]:
        return _layer_sweep
    if "parts" in data:
        return _device_check
    if "protocol" in data and "label" in records[0]:
        return _recall
    if "summary" in data and isinstance(data["summary"], list):
        return _leaderboard
    if "steps" in data and "runs" in data:
        return _highres
    if "runs" in data and isinstance(data.get("summary"), dict):
        return _segmentation
    if "rows" in data and "teacher" in data:
        return _conversion
    if "protocol" in data and "setting" in records[0]:
        return _quickstart
    return None


def _report_beside(path: str) -> str:
    """The markdown report written beside a JSON file, linked, or ""."""
    report = Path(path).with_suffix(".md")
    return f" (report: {_link(str(report))})" if (REPO_ROOT / report).is_file() else ""


def _device_name(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    for holder in (data, data.get("metadata") or {}, data.get("protocol") or {}):
        if isinstance(holder.get("device_name"), str):
            return holder["device_name"]
    return None


def machine_page(machine: str) -> str:
    folder = MACHINES[machine]
    files = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / folder).rglob("*.json"))
    names = {_device_name(load(path)) for path in files} - {None}
    lines = [
        f"# Results on {machine}",
        "",
        f"Generated by `tools/pages.py` from the JSON files under {_link(folder)} (do not edit by hand; the suite "
        f"checks it is current). Device: {', '.join(sorted(names)) or 'not recorded'}. One section per file, "
        "in path order; docs/cards.md and docs/choose.md show the same numbers in the same format.",
    ]
    listed = []
    for path in files:
        data = load(path)
        reader = _reader(data, path)
        if reader is None:
            listed.append(f"- {_link(path)}{_report_beside(path)}")
            continue
        lines += ["", f"## {path.removeprefix(folder + '/')}", "", f"From {_link(path)}{_report_beside(path)}.", ""]
        lines += reader(data)
    if listed:
        lines += [
            "",
            "## Other files",
            "",
            "Development measurements (kernel tuning, a recipe's record), not tabled here:",
            "",
        ]
        lines += listed
    return "\n".join(lines) + "\n"


def index_page() -> str:
    rows = []
    for machine, folder in MACHINES.items():
        files = sorted((REPO_ROOT / folder).rglob("*.json"))
        rows.append([f"[{machine}]({machine}.md)", _link(folder), str(len(files))])
    lines = [
        "# Results by machine",
        "",
        "Generated by `tools/pages.py` from the committed JSON under benchmarks/ (do not edit by hand). Each page "
        "shows every result file of one machine; a number that another page shows too (docs/cards.md, "
        "docs/choose.md, README.md's table) is formatted by the same function from the same record.",
        "",
        *_table(["machine", "results folder", "JSON files"], rows),
    ]
    return "\n".join(lines) + "\n"


def results_pages() -> dict[str, str]:
    """Path under the repository root -> the text of every results page."""
    pages = {f"{PAGES}/README.md": index_page()}
    pages.update({f"{PAGES}/{machine}.md": machine_page(machine) for machine in MACHINES})
    return pages
