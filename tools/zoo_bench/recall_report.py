"""The recall grid's report: `recall.json` (every run), `recall.md` (a table per width, the recall goals beside the
measured numbers, the state formulas, the protocol) and `recall.png` (an accuracy heatmap per variant and accuracy
against the state each variant keeps per layer). Cells of the plan that have no run yet read "not run".
matplotlib is imported only to draw."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import textwrap
from pathlib import Path
from typing import Any

from .recall_grid import (
    DEFAULT_LENGTHS,
    DEFAULT_VARIANTS,
    DEFAULT_WIDTHS,
    STATE_FORMULAS,
    cell_text,
    parse_variant,
    state_size,
    summarize_cells,
    variant_spec,
)
from .recall_speed import SPEED_FILE, frontier, frontier_points, throughputs

__all__ = ["goals", "write_markdown", "write_report"]

# the goal cell (vocabulary 256, length 128, 16 pairs) at width 64, and the cell of the "beyond" goal
GOAL_CELL = (128, 64)
FAR_CELL = (512, 128)
# compute that grows as N^2: every query reads every key, or (the dense synthesizer) N x N weights per head
QUADRATIC = ("softmax", "softmax1", "synthesizer")


def _plan(results: dict[str, Any]) -> dict[str, list]:
    """The grid the report shows: the whole default grid (`DEFAULT_*`) and whatever the sweeps asked beyond it, so a
    cell no run reached reads `not run` instead of vanishing."""
    plan = results["protocol"].get("plan", {})
    records = results["records"]
    asked = plan.get("variants") or list(dict.fromkeys(r["label"] for r in records))
    return {
        "variants": list(dict.fromkeys([*asked, *(parse_variant(text).label for text in DEFAULT_VARIANTS)])),
        "lengths": sorted({*plan.get("lengths", []), *(r["length"] for r in records), *DEFAULT_LENGTHS}),
        "widths": sorted({*plan.get("widths", []), *(r["width"] for r in records), *DEFAULT_WIDTHS}),
    }


def goals(
    cells: dict[tuple[str, int, int], dict[str, Any]],
    variants: list[str],
    planned_cells: int | None = None,
    speed: dict[str, Any] | None = None,
) -> list[str]:
    """The recall goals, each beside the measured number: reached, not reached, or not run.
    `planned_cells`: cells per variant in the grid (default: those softmax has runs in); `speed`: the saved
    `recall_speed.json`, for the frontier."""
    ok = {key: cell for key, cell in cells.items() if cell["status"] == "ok"}
    lines = []
    at_goal = {label: ok.get((label, *GOAL_CELL)) for label in variants}
    shown = ", ".join(f"{label} {cell_text(cell)}" for label, cell in at_goal.items() if cell)
    lines.append(
        "- Separate at least as well as the goal cell (vocabulary 256, length 128, 16 pairs, width 64: "
        f"softmax 0.998, linear 0.885, performer 0.019): measured here {shown or 'not run'}."
    )
    softmax = [cell["top1"] for (label, _, _), cell in ok.items() if label == "softmax"]
    planned = planned_cells or sum(1 for (label, _, _) in cells if label == "softmax")
    verdict = "not run" if not softmax else ("reached" if min(softmax) >= 0.99 else "not reached")
    if softmax and verdict == "reached" and len(softmax) < planned:
        verdict = "reached where measured"
    lines.append(
        f"- softmax >= 0.99 at every cell (Zoology Figure 2): {verdict}; lowest {min(softmax):.3f} over "
        f"{len(softmax)} measured cells of {planned} in the grid."
        if softmax
        else "- softmax >= 0.99 at every cell (Zoology Figure 2): not run."
    )
    pairs = [
        (key[1:], cell["top1"], ok[("linear", *key[1:])]["top1"])
        for key, cell in ok.items()
        if key[0] == "performer" and ("linear", *key[1:]) in ok
    ]
    if pairs:
        shown = "; ".join(f"L={n} d={d}: performer {p:.3f} vs linear {q:.3f}" for (n, d), p, q in sorted(pairs))
        verdict = "reached" if all(p < q - 0.3 for _, p, q in pairs) else "not reached everywhere"
        lines.append(f"- performer far below elu+1 linear (Based Figure 3): {verdict}: {shown}.")
    else:
        lines.append("- performer far below elu+1 linear (Based Figure 3): not run (no cell with both).")
    lines.append(_window_goal(ok))
    lines.append(_far_goal([(label, cell) for (label, n, d), cell in ok.items() if (n, d) == FAR_CELL]))
    lines.append(_frontier_goal(ok, speed))
    return lines


def _far_goal(far: list[tuple[str, dict[str, Any]]]) -> str:
    """The "beyond" goal: the best sub-quadratic variant at length 512, width 128; and, since a sub-quadratic
    variant may still keep every key (reformer, bigbird, sparse), the best whose state does not grow with L."""
    goal = f"- best sub-quadratic variant >= 0.9 at length 512, width 128 (all but {', '.join(QUADRATIC)})"
    sub = [(label, cell) for label, cell in far if parse_variant(variant_spec(label)).name not in QUADRATIC]
    if not sub:
        return f"{goal}: not run."
    line = f"{goal}: {_best(sub)}"
    bounded = [(label, cell) for label, cell in sub if _state_is_bounded(label)]
    if bounded:
        line += f"; with a state that does not grow with L: {_best(bounded)}"
    return f"{line}."


def _best(cells: list[tuple[str, dict[str, Any]]]) -> str:
    label, best = max(cells, key=lambda item: item[1]["top1"])
    return f"{'reached' if best['top1'] >= 0.9 else 'not reached'}: {label} {cell_text(best)}"


def _state_is_bounded(label: str) -> bool:
    variant, (length, width) = parse_variant(variant_spec(label)), FAR_CELL
    state = state_size(variant, length, width, 1)
    return state is not None and state == state_size(variant, 2 * length, width, 1)


def _frontier_goal(ok: dict[tuple[str, int, int], dict[str, Any]], speed: dict[str, Any] | None) -> str:
    goal = "- recall-versus-throughput frontier with the variants on it named"
    points = frontier_points(ok, speed, GOAL_CELL)
    if len(points) < 2:
        return f"{goal}: not run (`tools/recall.py --speed` times the variants; fewer than 2 have both numbers)."
    length = speed["metadata"]["length"]
    named = ", ".join(f"{label} ({points[label][0]:.3f}, {points[label][1]:,.0f} tok/s)" for label in frontier(points))
    return (
        f"- recall-versus-throughput frontier with the variants on it named: {named}: MQAR at L={GOAL_CELL[0]}, "
        f"d={GOAL_CELL[1]} against forward + backward tokens per second at N={length:,} (recall_frontier.png)."
    )


def _window_goal(ok: dict[tuple[str, int, int], dict[str, Any]]) -> str:
    rows = []
    for n, d in sorted({(n, d) for (_, n, d) in ok}):
        windows = []
        for (label, ln, ld), cell in ok.items():
            variant = parse_variant(variant_spec(label))
            if (ln, ld) == (n, d) and variant.name == "local" and "window" in variant.options:
                windows.append((variant.options["window"], cell["top1"]))
        if len(windows) >= 2:
            windows.sort()
            rising = all(b >= a - 0.02 for (_, a), (_, b) in itertools.pairwise(windows))
            shown = ", ".join(f"w={w}: {acc:.3f}" for w, acc in windows)
            rows.append((rising, f"L={n} d={d}: {shown}"))
    if not rows:
        return "- sliding-window accuracy rising with its window (Based Figure 2): not run (fewer than 2 windows)."
    verdict = "reached" if all(rising for rising, _ in rows) else "not reached everywhere"
    cells = "; ".join(text for _, text in rows)
    return f"- sliding-window accuracy rising with its window (Based Figure 2): {verdict}: {cells}."


def _left_out(labels: list[str]) -> str:
    """The registered variants with no label in the grid, with the reason when the registry gives one."""
    from zoo.attention import get_attention, list_attentions

    named = {parse_variant(variant_spec(label)).name for label in labels}
    missing = [name for name in list_attentions() if name not in named]
    if not missing:
        return "Every registered variant is in the grid."
    reasons = [f"`{n}`" + (" (2-D only: needs a patch grid)" if get_attention(n).needs_grid else "") for n in missing]
    return f"Registered variants not in this grid: {', '.join(reasons)}."


def write_markdown(results: dict[str, Any], path: Path, speed: dict[str, Any] | None = None) -> None:
    """`speed`: the saved `recall_speed.json`, for the frontier's goal line and table."""
    proto, plan = results["protocol"], _plan(results)
    cells = summarize_cells(results["records"])
    written = (
        f"Written by `{proto.get('command', 'tools/recall.py')}` on {proto.get('device_name')} "
        f"({proto.get('cpu_count')} CPUs, {proto.get('threads')} torch thread(s)), {proto.get('date')}."
    )
    protocol = (
        f"Protocol: recipe `{proto['recipe']}` ({proto['model']}), {proto['budget_steps']} steps of batch "
        f"{proto['batch_size']}; {proto['grid']}. Per cell: {proto['cell_rule']}. Test accuracy over the query "
        "positions, out of the whole vocabulary. A cell without runs reads `not run`; a failed one its status "
        "(the message is in recall.json)."
    )
    lines = [
        "# Recall: MQAR over lengths, widths, seeds and learning rates",
        "",
        written,
        "",
        protocol,
        "",
        "## Goals beside the measured numbers",
        "",
        *goals(cells, plan["variants"], len(plan["lengths"]) * len(plan["widths"]), speed),
        "",
    ]
    for width in plan["widths"]:
        lines += [f"## Width {width}: test accuracy (mean ± std over seeds, best learning rate by validation)", ""]
        lines.append("| variant | causal | " + " | ".join(f"L={n}" for n in plan["lengths"]) + " | state at L=512 |")
        lines.append("|---|---|" + "---|" * len(plan["lengths"]) + "---|")
        for label in plan["variants"]:
            variant = parse_variant(variant_spec(label))
            row = [cell_text(cells.get((label, n, width))) for n in plan["lengths"]]
            heads = proto["model"].get("num_heads") or 2
            state = state_size(variant, 512, width, heads)
            lines.append(
                f"| {label} | {'yes' if variant.causal else 'no'} | " + " | ".join(row) + f" | {state or 'n/a'} |"
            )
        lines.append("")
    lines += [_left_out(plan["variants"]), ""]
    if speed:
        lines += _speed_table(cells, speed)
    lines += ["## Runs per cell (learning rate chosen, seeds, mean training wall time)", ""]
    lines += ["| variant | L | d | lr | seeds | lrs tried | per seed | train s |", "|---|---|---|---|---|---|---|---|"]
    for (label, n, d), cell in sorted(cells.items()):
        if cell["status"] == "ok":
            per_seed = ", ".join(f"{v:.3f}" for v in cell["per_seed"])
            lines.append(
                f"| {label} | {n} | {d} | {cell['lr']:g} | {cell['seeds']} | {cell['lrs']} | {per_seed} | "
                f"{cell['train_wall_s']} |"
            )
        else:
            lines.append(f"| {label} | {n} | {d} | - | - | {cell['lrs']} | {cell['status']} | - |")
    lines += ["", "## State per layer (floats), by family", ""]
    lines += ["d: width, h: heads, e = d / h, N: length; options as each variant's label, else its defaults.", ""]
    lines += [f"- `{name}`: {formula}" for name, formula in STATE_FORMULAS.items()]
    path.write_text("\n".join(lines) + "\n")


def _speed_table(cells: dict[tuple[str, int, int], dict[str, Any]], speed: dict[str, Any]) -> list[str]:
    meta = speed["metadata"]
    points = frontier_points(cells, speed, GOAL_CELL)
    on = set(frontier(points))
    settings = meta["settings"]
    lines = [
        f"## Recall against throughput (MQAR at L={GOAL_CELL[0]}, d={GOAL_CELL[1]}; speed at N={meta['length']:,})",
        "",
        f"Written by `{meta['command']}` on {meta['device_name']}, {meta['date']}: each variant with its recall "
        f"options, forward + backward of one attention module (qkv and proj included) at batch {settings['batch']}, "
        f"width {settings['dim']}, {settings['heads']} heads, {settings['dtype']}, {settings['threads']} threads, "
        f"median of {settings['repeats']}; {meta['causal']} ({SPEED_FILE}). On the frontier: no other variant has "
        "at least its recall and at least its throughput.",
        "",
        "| variant | MQAR | fwd+bwd s | tokens/s | on the frontier |",
        "|---|---|---|---|---|",
    ]
    rates = throughputs(speed)
    for record in sorted(speed["records"], key=lambda r: -rates.get(r["label"], 0.0)):
        label = record["label"]
        recall = cell_text(cells.get((label, *GOAL_CELL)))
        if record["status"] != "ok":
            lines.append(f"| {label} | {recall} | {record['status']}: {record.get('message', '')[:80]} | - | - |")
            continue
        mark = "yes" if label in on else ("no" if label in points else "no recall cell")
        lines.append(f"| {label} | {recall} | {record['fwd_bwd_s']:.3g} | {rates[label]:,.0f} | {mark} |")
    return [*lines, ""]


_CROWD = 0.1


def _label_offsets(points: dict[str, tuple[float, float]]) -> dict[str, int]:
    """Vertical offsets (in points) of the labels: one line lower for a label next to one already placed (a tenth
    of a decade of speed and 0.03 of recall apart, as softmax and softmax1)."""
    placed: list[tuple[float, float, int, str]] = []
    for label, (recall, rate) in sorted(points.items(), key=lambda item: item[1][1]):
        offset = 3
        while any(abs(math.log10(rate / r)) < 0.1 and abs(recall - a) < 0.03 and o == offset for a, r, o, _ in placed):
            offset -= 10
        placed.append((recall, rate, offset, label))
    return {label: offset for _, _, offset, label in placed}


def plot_frontier(results: dict[str, Any], speed: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summarize_cells(results["records"])
    points = frontier_points(cells, speed, GOAL_CELL)
    if not points:
        return
    on = frontier(points)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    near_chance = [label for label, (recall, _) in points.items() if recall < _CROWD and label not in on]
    crowd = sorted(near_chance, key=lambda label: points[label][1])
    offsets = _label_offsets({label: point for label, point in points.items() if label not in crowd})
    for label, (recall, rate) in points.items():
        ax.scatter(rate, recall, color="C3" if label in on else "C0", zorder=3)
        if label in offsets:
            ax.annotate(label, (rate, recall), fontsize=7, xytext=(4, offsets[label]), textcoords="offset points")
    if crowd:
        # near chance the points crowd and their labels would overlap: listed once, by speed
        names = textwrap.fill(", ".join(crowd), 70)
        ax.text(0.02, 0.1, f"below {_CROWD}, slowest first:\n{names}", transform=ax.transAxes, fontsize=7, va="bottom")
    ax.plot([points[label][1] for label in on], [points[label][0] for label in on], color="C3", linewidth=1)
    ax.set_xscale("log")
    meta = speed["metadata"]
    ax.set_xlabel(f"forward + backward tokens/s at N={meta['length']:,} ({meta['device_name']})")
    ax.set_ylabel(f"MQAR test accuracy (L={GOAL_CELL[0]}, d={GOAL_CELL[1]})")
    ax.set_ylim(-0.03, 1.05)
    ax.set_title("Recall against throughput; red: the frontier")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan, proto = _plan(results), results["protocol"]
    cells = summarize_cells(results["records"])
    variants = plan["variants"]
    cols = 4
    rows = math.ceil(len(variants) / cols) + 1
    fig = plt.figure(figsize=(4 * cols, 2.6 * rows))
    lengths, widths = plan["lengths"], plan["widths"]
    for index, label in enumerate(variants):
        ax = fig.add_subplot(rows, cols, index + 1)
        grid = [[cells.get((label, n, d), {}).get("top1", math.nan) for n in lengths] for d in widths]
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for i, d in enumerate(widths):
            for j, n in enumerate(lengths):
                cell = cells.get((label, n, d))
                text = "not run" if cell is None else f"{cell['top1']:.2f}" if cell["status"] == "ok" else "fail"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="w")
        ax.set_title(label, fontsize=8)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(widths)), [str(d) for d in widths], fontsize=7)
    ax = fig.add_subplot(rows, 1, rows)
    heads = proto["model"].get("num_heads") or 2
    for label in variants:
        points = [
            (state_size(parse_variant(variant_spec(label)), n, d, heads), cell["top1"])
            for (lab, n, d), cell in cells.items()
            if lab == label and cell["status"] == "ok"
        ]
        points = sorted(p for p in points if p[0])
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label, linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("state per layer (floats, STATE_FORMULAS)")
    ax.set_ylabel("MQAR test accuracy")
    ax.set_ylim(-0.02, 1.02)
    if ax.lines:
        ax.legend(fontsize=6, ncol=4)
    fig.suptitle("MQAR accuracy: heatmaps (width x length) per variant; accuracy vs state (Based Fig. 3)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict[str, Any], out_dir: Path | str, *, figure: bool = True) -> None:
    """`recall.json` (written whole, then renamed into place), `recall.md`, and `recall.png` when `figure` and
    matplotlib is installed (a bare GPU machine may lack it: `tools/recall.py --report-only` draws it later)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "recall.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    tmp.replace(out_dir / "recall.json")
    speed_path = out_dir / SPEED_FILE
    speed = json.loads(speed_path.read_text()) if speed_path.is_file() else None
    write_markdown(results, out_dir / "recall.md", speed)
    if figure and importlib.util.find_spec("matplotlib") is not None:
        plot(results, out_dir / "recall.png")
        if speed:
            plot_frontier(results, speed, out_dir / "recall_frontier.png")
