"""One card per registered attention variant: `docs/cards.md`, generated from the committed results alone.

Each column is one capability read from one committed JSON file (`COLUMNS`: a title, the file, the report it
links to, and a function from the loaded file and a variant to a `Fact`); a variant the file does not cover reads
"not measured", one that failed there its failure. The "pick this when" line of a card is derived from the facts by
`RULES`, each a threshold stated in the page, never written by hand. `tools/pages.py` regenerates the page; the
suite checks that the committed page is what the committed results give, and that every registered variant has a
row.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from zoo.attention import list_attentions

from ._results import (
    CHUNKED_CHECK,
    FUSED_DIR,
    GPU_DIR,
    GPU_QUALITY,
    GPU_TRAIN,
    H200_CHECK,
    HIGHRES,
    MARGIN,
    QUALITY_COMMAND,
    RECALL2D,
    Fact,
    conversion_text,
    faster_from,
    load,
    miou_text,
    percent_mean_std,
    quality_races,
    score_text,
    timed,
)
from .machine import REPO_ROOT
from .recall_grid import summarize_cells
from .recall_report import GOAL_CELL
from .recall_speed import frontier, frontier_points

__all__ = [
    "COLUMNS",
    "RULES",
    "Column",
    "cards_markdown",
    "faster_from",
    "pick_this_when",
    "variant_facts",
    "write_cards",
]


@dataclass(frozen=True)
class Column:
    title: str
    sources: tuple[str, ...]  # JSON files under the repository root, merged in order (a later file wins)
    link: str  # the report the cell links to
    what: str  # what the number is, for the page's legend
    cell: Callable[[list[dict[str, Any]], str], Fact | None]


def _linked(text: str, report: str) -> str:
    """`text` linked to the report, or with "not yet written" where the study that writes it has not run (a
    link to a missing file would be a dead end on the page)."""
    if (REPO_ROOT / report).exists():
        return f"[{text}](../{report})"
    return f"{text} (not yet written)" if text == report else text


# ----- the cells


def _recall(data: list[dict[str, Any]], name: str) -> Fact | None:
    """MQAR test accuracy of the variant's best cell (tools/recall.py's rule: the lr with the best validation
    accuracy, mean over seeds) at the longest length where softmax learned the task (>= 0.99 in any sweep, CPU or
    GPU, at the same step budget: beyond it the budget, not the attention, is what fails). A cell from a sweep
    with another budget than the first one's names its steps."""
    sweeps = [
        (
            summarize_cells(results["records"]),
            results["protocol"].get("device", "cpu") != "cpu",
            results["protocol"].get("budget_steps"),
        )
        for results in data
    ]
    learnable = {
        (*key[1:], budget)
        for cells, _, budget in sweeps
        for key, cell in cells.items()
        if key[0] == "softmax" and cell.get("top1", 0) >= 0.99
    }
    found, failures = [], []
    for cells, gpu, budget in sweeps:
        for (label, length, width), cell in cells.items():
            if label.split("(")[0] != name:
                continue
            if cell["status"] != "ok":
                failures.append(cell["status"])
            else:
                learned = (length, width, budget) in learnable or not learnable
                found.append(_Cell(learned, length, cell["top1"], width, label, gpu, budget))
    if not found:
        return Fact(f"failed ({failures[0]})") if failures else None
    first_budget = sweeps[0][2]
    read = max(found)
    text, where = _recall_text(read, name, first_budget)
    # a much better cell at a shorter learnable length is shown too: the longest where the variant still recalls
    # (>= 0.9), else its best
    shorter = [c for c in found if c.learned and c.length < read.length and c.top1 >= read.top1 + _SHOWN_GAIN]
    if read.learned and shorter:
        recalls = [c for c in shorter if c.top1 >= 0.9]
        if recalls:
            shown = max(recalls, key=lambda c: (c.length, c.top1))
        else:
            shown = max(shorter, key=lambda c: (c.top1, c.length))
        text += f"; {_recall_text(shown, name, first_budget)[0]}"
    return Fact(text, read.top1, where)


class _Cell(NamedTuple):
    """A variant's recall cell; fields in the order `max` ranks them: learnable length first, then the longest,
    then the most recall."""

    learned: bool
    length: int
    top1: float
    width: int
    label: str
    gpu: bool
    budget: int | None


# how much more recall a shorter length must have to be shown beside the longest one's
_SHOWN_GAIN = 0.3


def _recall_text(cell: _Cell, name: str, first_budget: int | None) -> tuple[str, str]:
    """The cell's text and where it was measured."""
    shown = "" if cell.label == name else f" {cell.label}"
    steps = "" if cell.budget == first_budget else f", {cell.budget:,} steps"
    where = f"L={cell.length}, d={cell.width}{steps}"
    return f"{cell.top1:.3f} at {where}{shown}{' (GPU)' if cell.gpu else ''}", where


def _frontier(data: list[dict[str, Any]], name: str) -> Fact | None:
    """Whether one of the variant's configurations is on the recall-versus-throughput frontier (recall_speed.py):
    value 1 on it, 0 off it."""
    recall = next((d for d in data if "protocol" in d), None)
    speed = next((d for d in data if "metadata" in d), None)
    if recall is None or speed is None:
        return None
    points = frontier_points(summarize_cells(recall["records"]), speed, GOAL_CELL)
    mine = [label for label in points if label.split("(")[0] == name]
    if not mine:
        return None
    on = [label for label in frontier(points) if label in mine]
    label = on[0] if on else max(mine, key=lambda label: points[label])
    text = f"{'on it' if on else 'off it'}: {label} {points[label][0]:.3f}, {points[label][1]:,.0f} tok/s"
    return Fact(text, 1.0 if on else 0.0)


def _listops(data: list[dict[str, Any]], name: str) -> Fact | None:
    for row in (r for d in data for r in d["summary"] if r["variant"] == name):
        if not row["finished"]:
            return Fact(f"failed ({'; '.join(row['failures'])[:60]})")
        return Fact(score_text(row), row["score"])
    return None


def _highres(data: list[dict[str, Any]], name: str) -> Fact | None:
    """Top-1 at 256 px (mean over seeds) of the plain layout, and its step at 2048 px."""
    for results in data:
        scores = [r["test"]["top1"] for r in results["runs"] if r["layout"] == name and r["status"] == "ok"]
        if scores:
            step = results["steps"].get(name, {}).get("step_s")
            at_2048 = f", {step:.1f} s/step at 2048 px" if step else ""
            return Fact(f"{percent_mean_std(scores)}{at_2048}", 100 * statistics.fmean(scores))
    return None


def _recall2d(data: list[dict[str, Any]], name: str) -> Fact | None:
    """Test accuracy % on the query pixels of the 2-D recall probe (mean ± std over seeds) of the plain layout, and
    its verdict."""
    for results in data:
        row = results["summary"]["layouts"].get(name)
        if row and row["mean"] is not None:
            return Fact(f"{percent_mean_std(row['accuracy'])}: {row['verdict']}", row["mean"])
    return None


def _segmentation(data: list[dict[str, Any]], name: str) -> Fact | None:
    """Test mIoU % of the quick segmentation recipe (mean over seeds) of the plain layout, beside the all-background
    rule's."""
    for results in data:
        row = results["summary"]["layouts"].get(name)
        if row and row["miou"] is not None:
            background = results["summary"]["all_background"]["miou"]
            return Fact(miou_text(row, background), 100 * row["miou"])
    return None


def _conversion(data: list[dict[str, Any]], name: str) -> Fact | None:
    for results in data:
        for row in (r for r in results["rows"] if r["variant"] == name):
            teacher = results["teacher"]["top1_at_target"]
            return Fact(conversion_text(row, teacher), 100 * (row["stage2"] - teacher))
    return None


def _records(data: list[dict[str, Any]], name: str) -> dict[int, dict[str, Any]]:
    """length -> the variant's record, a later file's winning."""
    return {r["length"]: r for d in data for r in d["records"] if r["variant"] == name}


def _cpu_time(data: list[dict[str, Any]], name: str) -> Fact | None:
    by_length = _records(data, name)
    if not by_length:
        return None
    cells = [timed(by_length.get(n)) for n in (16384, 65536)]
    summary = next((d.get("summary", {})[name] for d in reversed(data) if name in d.get("summary", {})), {})
    start = faster_from(by_length, _records(data, "softmax")) if name != "softmax" else None
    # a quadratic variant that edges out softmax at some length is no long-sequence choice: slope >= 1.5
    linear_ish = (summary.get("slope") or 2.0) < 1.5
    tail = f"; faster than softmax (by > {MARGIN:.0%}) from {start:,} tokens" if start else ""
    return Fact(f"{cells[0]} / {cells[1]}{tail}", start if start and linear_ish else None)


def _error(data: list[dict[str, Any]], name: str) -> Fact | None:
    record = _records(data, name).get(16384)
    if record is None or record.get("rel_error") is None:
        return None
    return Fact(f"{record['rel_error']:.2g}", record["rel_error"])


def _gpu_speed(data: list[dict[str, Any]], name: str) -> Fact | None:
    """Speedup over SDPA at 64K (each file's own softmax baseline), fwd+bwd in bf16."""
    for results in reversed(data):
        mine = _records([results], name).get(65536)
        base = _records([results], "softmax").get(65536)
        if mine and base and mine["status"] == base["status"] == "ok":
            x = base["fwd_bwd_s"] / mine["fwd_bwd_s"]
            return Fact(f"{x:.1f}x ({1000 * mine['fwd_bwd_s']:.3g} ms)", x)
        if mine:
            return Fact(mine["status"])
    return None


def _gpu_train(data: list[dict[str, Any]], name: str) -> Fact | None:
    """ViT-S training at 1024 px (4,097 tokens): the variant's best run in the newest check that trained it, over
    that check's softmax (two checks may be two machines), with its compiled run where the check has one. Checks
    older than the fused ones name no attention per run; every variant they trained a newer check trained too."""
    for results in reversed(data):
        parts = results["parts"]
        runs = [i for i in parts.get("train", {}).get("items", []) if i.get("ok") and i.get("tokens") == 4097]
        runs = [i for i in runs if not i["run"].startswith("seg_")]  # a decoder's cost is not the classifier's
        base = next((i["samples_per_s"] for i in runs if i["run"] == "vit_softmax_1024"), None)
        mine = [i for i in runs if i.get("attention") == name]
        if base is None or not mine:
            continue
        best = max(mine, key=lambda i: i["samples_per_s"])
        x = best["samples_per_s"] / base
        shown = "" if best["run"] == f"vit_{name}_1024" else f" `{best['run']}`"
        text = f"{x:.2f}x ({best['samples_per_s']:.1f} samples/s{shown})"
        compiled = next((i for i in parts.get("compile", {}).get("items", []) if i["run"] == best["run"]), None)
        if compiled and compiled.get("ok"):
            text += f"; compiled {compiled['samples_per_s'] / base:.2f}x"
        return Fact(text, x, f"`{best['run']}`")
    return None


def _gpu_quality(data: list[dict[str, Any]], name: str) -> Fact | None:
    """Per comparison the variant trained in on a GPU (`make device-train`, each attention the same wall time): when
    it first reached softmax's final validation metric, or that it did not. The number: softmax's time to it over
    the variant's in the 1024-px image comparison (0 where it never got there)."""
    said, value = [], None
    for race in quality_races():
        for run, attention in race["runs"].items():
            if attention != name:
                continue
            mine, softmax = race["times"][run], race["times"][race["softmax"]]
            if run == race["softmax"]:
                said.append(f"{run}: the reference, {race['metric']} {race['target']:.3f} at {mine:.0f} s")
                continue
            got = f"reached at {mine:.0f} s (softmax {softmax:.0f} s)" if mine is not None else "not reached"
            said.append(f"{run}: {got} in {race['seconds']:g} s")
            if race["group"] == "vit_1024":
                value = softmax / mine if mine else 0.0
    return Fact("; ".join(said), value, "`vit_1024`") if said else None


def _quality_report() -> str:
    """The newest committed `make device-train` report; until one is, the page that says how to measure it."""
    reports = (path.removesuffix(".json") + ".md" for path in reversed(GPU_QUALITY))
    return next((report for report in reports if (REPO_ROOT / report).exists()), "docs/gpu.md")


def _gpu_correct(data: list[dict[str, Any]], name: str) -> Fact | None:
    """Yes where every case is within tolerance; yes too where fp32 is and only bf16 is past it, because then the
    device computes the CPU's function and the bf16 gap is rounding (reformer's LSH buckets flip in bf16 on the CPU
    as well: docs/attention.md); no where fp32 differs or a value is not finite."""
    for results in reversed(data):
        for item in results["parts"].get("correctness", {}).get("items", []):
            if item["variant"] == name:
                worst = max((c.get(k) or 0.0) for c in item["cases"] if c["dtype"] == "bf16" for k in ("out", "grad_x"))
                fp32 = all(c["ok"] for c in item["cases"] if c["dtype"] == "fp32")
                finite = all(c.get("finite", True) for c in item["cases"])
                if item["ok"]:
                    return Fact(f"yes (bf16 {worst:.1e})", 1.0)
                if fp32 and finite:
                    return Fact(f"yes in fp32; bf16 {worst:.1e} past tolerance (rounding, not the device)", 1.0)
                return Fact(f"**no** (bf16 {worst:.1e})", 0.0)
    return None


COLUMNS = (
    Column(
        "recall (MQAR)",
        (
            "benchmarks/cpu/recall.json",
            "benchmarks/nvidia-h200/recall.json",
            "benchmarks/nvidia-h100-80gb-hbm3/recall.json",
            "benchmarks/cpu/recall_long/recall.json",
            "benchmarks/nvidia-h200/recall_long/recall.json",
            "benchmarks/cpu/recall_lengths/recall.json",
        ),
        "benchmarks/cpu/recall.md",
        "MQAR test accuracy on the query positions, 2-layer 1-D model, 600 steps (1,500 where marked): the variant's "
        "best configuration at the longest length where softmax reached 0.99 in any sweep of the same budget (the "
        "CPU ones, or the GPU ones in benchmarks/nvidia-h200/recall.md, benchmarks/nvidia-h200/recall_long/recall.md "
        "and benchmarks/nvidia-h100-80gb-hbm3/recall.md, marked GPU); where a shorter length recalls at least 0.3 "
        "more, that cell follows (the longest at >= 0.9, else the best)",
        _recall,
    ),
    Column(
        "recall-speed frontier",
        ("benchmarks/cpu/recall.json", "benchmarks/cpu/recall_speed.json"),
        "benchmarks/cpu/recall.md",
        f"MQAR at length {GOAL_CELL[0]}, width {GOAL_CELL[1]} against forward + backward tokens per second of one "
        "layer (dim 512, 8 heads, fp32, CPU) at 16K tokens with the same options: on the frontier when no variant "
        "has both more recall and more speed",
        _frontier,
    ),
    Column(
        "ListOps",
        ("benchmarks/cpu/leaderboard_lra_listops_quick.json",),
        "benchmarks/cpu/leaderboard_lra_listops_quick.md",
        "`lra_listops_quick` test top-1 %, mean ± std over 2 seeds, 600 steps (majority class: about 15)",
        _listops,
    ),
    Column(
        "high-res images",
        (HIGHRES,),
        "benchmarks/cpu/highres.md",
        "`highres_quick` (256 px, MegaMNIST) test top-1 %, mean ± std over 2 seeds, 400 steps; one training "
        "step at 2048 px (16K tokens) on one CPU thread",
        _highres,
    ),
    Column(
        "2-D recall",
        (RECALL2D,),
        "benchmarks/cpu/recall2d.md",
        "`recall2d_quick` (at every query frame, name the digit framed in its colour, every query at least 4 "
        "patches from every digit) test accuracy % on the query pixels, mean ± std over seeds, the same steps for "
        "every variant, and the verdict: recalls across the image at >= 90, not below 50 (a digit guessed among "
        "those on the canvas: 1 in their number)",
        _recall2d,
    ),
    Column(
        "segmentation",
        ("benchmarks/cpu/seg_megamnist_quick.json",),
        "benchmarks/cpu/seg_megamnist_quick.md",
        "`seg_megamnist_quick` (64-px MegaMNIST masks, 11 classes) test mIoU %, mean ± std over 2 seeds, the same "
        "steps for every variant, beside the all-background rule's",
        _segmentation,
    ),
    Column(
        "converting a softmax ViT",
        ("benchmarks/cpu/conversion.json",),
        "benchmarks/cpu/conversion.md",
        "top-1 % of the softmax teacher converted to the variant at 4x the tokens, against the teacher there and "
        "the same student trained from scratch",
        _conversion,
    ),
    Column(
        "CPU time and memory at 16K / 64K",
        ("benchmarks/cpu/results.json",),
        "benchmarks/cpu/results.md",
        "one layer (dim 512, 8 heads), fp32, forward + backward on 2 threads of an AMD EPYC: time, peak resident "
        "memory; the length from which it beats softmax",
        _cpu_time,
    ),
    Column(
        "error vs exact at 16K",
        ("benchmarks/cpu/results.json",),
        "benchmarks/cpu/results.md",
        "||out - exact|| / ||exact|| against softmax with the same weights, 256 sampled rows, at 16K tokens",
        _error,
    ),
    Column(
        "GPU speed at 64K",
        (
            f"{GPU_DIR}/results.json",
            f"{GPU_DIR}/one_block/results.json",
            f"{FUSED_DIR}/results.json",
            f"{H200_CHECK}/results.json",
            f"{CHUNKED_CHECK}/results.json",
        ),
        f"{CHUNKED_CHECK}/results.md",
        "one layer (dim 512, 8 heads), batch 1, bf16, forward + backward on an H200 (`linear`, `performer`, "
        f"`hedgehog` on their fused kernels, performer's 256 features whole, the block-size sweep's pick: "
        f"{CHUNKED_CHECK}; `neighborhood`, `window2d`: {H200_CHECK}), else on an H100 ({GPU_DIR}): softmax's "
        "(SDPA flash) time over the variant's, in the same file, and its own time",
        _gpu_speed,
    ),
    Column(
        "GPU training at 1024 px",
        GPU_TRAIN,
        f"{CHUNKED_CHECK}/device_check.md",
        "ViT-S/16 training at 1024 px (4,097 tokens, batch 32, bf16, one real batch repeated) on an H200: the "
        "variant's fastest run in the newest check that trained it (named where it is not `vit_<variant>_1024`: "
        "another window, another backend) over `vit_softmax_1024`'s samples/s in the same check, eager, and "
        "compiled (`train.compile=true`, over the same eager softmax) where that check compiled it",
        _gpu_train,
    ),
    Column(
        "GPU quality per minute",
        GPU_QUALITY,
        _quality_report(),
        "each attention trained the same wall time per comparison (`make device-train`: the ViT-S 1024-px image and "
        "segmentation recipes, genomes, ListOps, Path-X, each beside softmax): when the variant's validation metric "
        f"first reached softmax's final one; not measured until `{QUALITY_COMMAND}` runs on a GPU",
        _gpu_quality,
    ),
    Column(
        "correct on CUDA",
        (
            f"{GPU_DIR}/device_check.json",
            f"{GPU_DIR}/one_block/device_check.json",
            f"{H200_CHECK}/torch_paths/device_check.json",
            f"{CHUNKED_CHECK}/device_check.json",
        ),
        f"{CHUNKED_CHECK}/device_check.md",
        f"forward and backward on an H200 with the fused kernels on ({CHUNKED_CHECK}; for a variant it did "
        f"not reach, {H200_CHECK}/torch_paths, the torch paths; an H100 for one both lack) in fp32 and bf16 within "
        "tolerance of the CPU fp32 reference (worst bf16 error of output and input gradient)",
        _gpu_correct,
    ),
)


@dataclass(frozen=True)
class Rule:
    column: str
    holds: Callable[[float], bool]
    says: str  # formatted with the fact's value and where
    threshold: str  # the rule as the page states it
    # the capability the verdict is about: per variant, the first rule of a capability that holds is its one verdict
    capability: str = ""


RULES = (
    Rule(
        "error vs exact at 16K",
        lambda e: e <= 1e-2,
        "exact attention: the reference, and the choice below the others' crossovers",
        "<= 0.01",
    ),
    Rule("GPU speed at 64K", lambda x: x >= 10, "long sequences on a GPU ({value:.0f}x SDPA at 64K)", ">= 10x"),
    Rule(
        "GPU training at 1024 px",
        lambda x: x > 1 + MARGIN,
        "training a ViT at 1024 px on a GPU ({value:.2f}x softmax's samples/s, {where})",
        f"faster than softmax by more than {MARGIN:.0%}",
    ),
    Rule(
        "GPU quality per minute",
        lambda x: x > 1 + MARGIN,
        "learning a 1024-px image task on a GPU ({value:.2f}x softmax's pace to its validation top-1)",
        f"reaches softmax's final validation top-1 at 1024 px in less wall time, by more than {MARGIN:.0%}",
    ),
    Rule(
        "CPU time and memory at 16K / 64K",
        lambda n: n <= 4096,
        "long sequences on a CPU (faster than softmax from {value:,.0f} tokens on)",
        "faster than softmax (beyond the noise) at every measured length from <= 4K tokens on, time growing slower "
        "than N^1.5",
    ),
    Rule(
        "recall (MQAR)",
        lambda a: a >= 0.9,
        "tasks that recall tokens (MQAR {value:.2f} at {where})",
        ">= 0.9",
        "recall",
    ),
    Rule("recall (MQAR)", lambda a: a < 0.5, "not for recall (MQAR {value:.2f} at {where})", "< 0.5", "recall"),
    Rule(
        "recall-speed frontier",
        lambda on: on == 1.0,
        f"the most recall at its speed at length {GOAL_CELL[0]} (on the recall-throughput frontier)",
        "on the frontier, when no recall rule above holds",
        "recall",
    ),
    Rule(
        "2-D recall",
        lambda a: a >= 0.9,
        "recalling across an image (2-D recall {value:.2f})",
        ">= 0.9",
        "2-D recall",
    ),
    Rule(
        "2-D recall",
        lambda a: a < 0.5,
        "does not recall across an image (2-D recall {value:.2f})",
        "< 0.5",
        "2-D recall",
    ),
    Rule("ListOps", lambda s: s >= 32.0, "long-range classification (ListOps {value:.1f})", ">= 32 %"),
    Rule("ListOps", lambda s: s < 20.0, "did not learn ListOps in 600 steps ({value:.1f})", "< 20 %"),
    Rule(
        "high-res images",
        lambda s: s >= 20.0,
        "2-D images at high resolution (top-1 {value:.1f} at 256 px)",
        ">= 20 % (chance 10)",
    ),
    Rule(
        "high-res images",
        lambda s: s < 12.0,
        "not for 2-D images at this budget (top-1 {value:.1f} at 256 px, chance 10)",
        "< 12 %",
    ),
    Rule(
        "converting a softmax ViT",
        lambda d: d >= -5.0,
        "converting a trained softmax ViT ({value:+.1f} points against it)",
        "within 5 points of the teacher",
    ),
)


def variant_facts(name: str) -> dict[str, Fact | None]:
    facts = {}
    for column in COLUMNS:
        data = [loaded for loaded in map(load, column.sources) if loaded is not None]
        facts[column.title] = column.cell(data, name) if data else None
    return facts


def pick_this_when(name: str, facts: dict[str, Fact | None]) -> str:
    """The variant's strengths (and the measured limits) as the rules read its facts."""
    said, decided = [], set()
    for rule in RULES:
        fact = facts.get(rule.column)
        capability = rule.capability or rule.column
        if capability in decided or fact is None or fact.value is None or not rule.holds(fact.value):
            continue
        decided.add(capability)
        said.append(rule.says.format(value=fact.value, where=fact.where))
    return "; ".join(said) if said else "no measured strength yet"


def cards_markdown() -> str:
    names = list_attentions()
    facts = {name: variant_facts(name) for name in names}
    header = ["variant", *(_linked(c.title, c.link) for c in COLUMNS)]
    lines = [
        "# One card per attention variant",
        "",
        (
            "Generated by `tools/pages.py` from the committed results (do not edit by hand): one row per registered "
            "variant, one column per capability, each linked to the table it comes from. `not measured`: the table "
            "has no row for the variant; a failure reads as such."
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name in names:
        cells = [(facts[name][c.title] or Fact("not measured")).text for c in COLUMNS]
        lines.append("| " + " | ".join([f"`{name}`", *cells]) + " |")
    lines += ["", "## Pick this when", ""]
    lines += [f"- `{name}`: {pick_this_when(name, facts[name])}." for name in names]
    lines += ["", "## The columns", ""]
    lines += [f"- **{c.title}** ({_linked(c.link, c.link)}): {c.what}." for c in COLUMNS]
    lines += ["", "## The rules behind “pick this when”", ""]
    lines += [f"- {rule.column} {rule.threshold}." for rule in RULES]
    lines += [
        "",
        f"Each capability gives one verdict per variant: the first of its rules that holds. “Faster” means by more "
        f"than {MARGIN:.0%} or the repeats' spread, whichever is larger.",
    ]
    return "\n".join(lines) + "\n"


def write_cards(path: Path | str = REPO_ROOT / "docs" / "cards.md") -> Path:
    path = Path(path)
    path.write_text(cards_markdown())
    return path
