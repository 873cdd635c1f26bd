"""The device check's markdown report (`device_check.md`) and `make device-train`'s (`device_train.md`), each from
its results alone: one section per part."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown", "plot_curves", "reached", "train_markdown"]


def markdown(results: dict[str, Any]) -> str:
    """`device_check.md`: one section per part, what failed first."""
    versions_text = ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items() if v)
    lines = [
        f"# Device check: {results.get('device_name')}",
        "",
        f"{results.get('date')}; {versions_text}" + (f"; CUDA {results['cuda']}" if results.get("cuda") else ""),
        f"Wall time: {results.get('wall_s', 'cut short')} s. Written by `tools/device_check.py`.",
        "",
    ]
    parts = results.get("parts", {})
    environment = ", ".join(f"{k}={v}" for k, v in results.get("environment", {}).items() if v is not None)
    if environment:
        lines[-1:-1] = [f"Environment: {environment}."]
    writers = {
        "correctness": _md_correctness,
        "train": _md_train,
        "bench": _md_bench,
        "compile": _md_compile,
        "long": _md_long,
        "flex": _md_flex,
    }
    for name, writer in writers.items():
        if name not in parts:
            continue
        part = parts[name]
        status = part["status"] + (f": {part['message']}" if part.get("message") else "")
        budget = f"{part['budget_s']:g}" if "budget_s" in part else "?"
        lines += [f"## {name} ({status}, {part.get('wall_s', '?')} s of {budget})", ""]
        lines += writer(part)
        if part.get("skipped_for_time"):
            lines += [f"Not run (time budget): {', '.join(part['skipped_for_time'])}.", ""]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2e}"
    return str(value)


def _md_correctness(part: dict[str, Any]) -> list[str]:
    tolerance = part.get("tolerance", {"fp32": "?", "bf16": "?"})
    lines = [
        (
            "Each variant on the device against the same module on the CPU in fp32 (B=2, N=37, dim 32, 2 heads, "
            "key padding; a family with a `backend` option on its torch path, the flex part checks the other): "
            "relative error of the output, the input's gradient and the parameters' gradients; allowed "
            f"{tolerance['fp32']} in fp32, {tolerance['bf16']} in bf16. A bf16 case past that is compared with "
            f"the CPU in bf16 too (allowed {tolerance.get('same_dtype', '-')}): rounding that flips a discrete choice "
            "(an LSH bucket) does so on every device."
        ),
        "",
        "| variant | causal | dtype | out | grad x | grad params | vs CPU, same dtype | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for item in part["items"]:
        for case in item["cases"]:
            cells = [case.get(k) for k in ("out", "grad_x", "grad_params", "vs_cpu_same_dtype")]
            ok = "yes" if case["ok"] else "**no**" + (f" ({case['message']})" if case.get("message") else "")
            row = [f"`{item['variant']}`", str(case["causal"]), case["dtype"], *map(_fmt, cells), ok]
            lines.append("| " + " | ".join(row) + " |")
    failed = part.get("failed")
    return [*lines, "", f"Failed: {', '.join(failed)}." if failed else "Every variant within tolerance.", ""]


def _md_flex(part: dict[str, Any]) -> list[str]:
    lines = [
        (
            "FlexAttention (compiled) against the family's torch path (fp32) on the same device, with key padding: "
            "bf16 forward and backward on CUDA, fp32 forward on the CPU. First call: compile and block mask; "
            "second: cached."
        ),
        "",
        "| variant | N | out | grad x | grad params | first call s | second call s | cache hits | ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for item in part["items"]:
        if "message" in item and "length" not in item:
            lines.append(f"| `{item['variant']}` | - | - | - | - | - | - | - | **no** ({item['message']}) |")
            continue
        cells = [item.get(k) for k in ("out", "grad_x", "grad_params")]
        timing = [str(item.get("first_call_s")), str(item.get("second_call_s")), str(item.get("block_mask_cache_hits"))]
        row = [
            f"`{item['variant']}`",
            str(item["length"]),
            *map(_fmt, cells),
            *timing,
            "yes" if item["ok"] else "**no**",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def _md_bench(part: dict[str, Any]) -> list[str]:
    by_batch = part.get("summary_by_batch") or {"1": part.get("summary", {})}
    batches = list(by_batch)
    lines = [
        (
            "Forward + backward, bf16 on CUDA (fp32 on the CPU), at batch "
            + " and ".join(batches)
            + "; the full tables in `results.md` (batch "
            + batches[0]
            + ")"
            + "".join(f", `batch{b}/results.md`" for b in batches[1:])
            + "."
        ),
        "",
        "| variant | " + " | ".join(f"batch {b}: crossover vs softmax | batch {b}: speedup" for b in batches) + " |",
        "|---|" + "---|---|" * len(batches),
    ]
    names = list(dict.fromkeys(name for summary in by_batch.values() for name in summary))
    for name in names:
        if name == "softmax":
            continue
        cells = []
        for batch in batches:
            entry = by_batch[batch].get(name, {})
            speedup = entry.get("speedup")
            cells += [
                (entry.get("crossover") or {}).get("text", "-"),
                f"{speedup['x']}x at {speedup['length']:,}" if speedup else "-",
            ]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    failures = [i for i in part["items"] if i["status"] != "ok"]
    lines += [""] + [
        f"- `{i['variant']}` at {i['length']:,}, batch {i.get('batch', 1)}: {i['status']} {i.get('message', '')}"
        for i in failures
    ]
    return [*lines, ""]


def _cell(value: Any, fmt: str = "") -> str:
    return "-" if value is None else format(value, fmt)


def _run_row(item: dict[str, Any], columns: list[tuple[str, str]]) -> str:
    """A table row of a training run: the columns' values, or its failure across them."""
    if item.get("status") != "ok":
        failed = f"**{item.get('status')}**: {item.get('message', '')}"
        return f"| {item['run']} | " + " | ".join("-" for _ in columns[:-1]) + f" | {failed} |"
    cells = [_cell(item.get(key), fmt) for key, fmt in columns[:-1]]
    data = item.get("data", "real")
    return f"| {item['run']} | " + " | ".join(cells) + f" | {'ok' if data == 'real' else 'ok; ' + data} |"


_TRAIN_COLUMNS = [
    ("attention", ""),
    ("tokens", ","),
    ("batch_size", ""),
    ("mixed_precision", ""),
    ("first_step_s", ".2f"),
    ("step_s", ".4f"),
    ("samples_per_s", ".2f"),
    ("vs_softmax", ".2f"),
    ("peak_mib", ",.0f"),
    ("status", ""),
]


def _table(titles: list[str]) -> list[str]:
    return ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]


def _md_train(part: dict[str, Any]) -> list[str]:
    lines = [
        (
            "A `Trainer` built from each shipped `recipes/vit_*_1024.yaml` (and two at 2048 px; a family the GPU work "
            "touches that ships no recipe, as `vit_softmax_1024` with its attention swapped); one real batch on the "
            "device, repeated (data loading excluded); samples/s over the timed steps after warm-up; vs softmax: "
            "over `vit_softmax_1024`'s samples/s in this check (`vit_softmax_2048`'s at 2048 px)."
        ),
        "",
        *_table(["run", "attention", "tokens", "batch", "precision", "first step s", "step s", "samples/s",
                 "vs softmax", "peak MiB", "status"]),
    ]  # fmt: skip
    lines += [_run_row(item, _TRAIN_COLUMNS) for item in part["items"]]
    lines.append("")
    for title, ratio in part.get("ratios", {}).items():
        lines.append(f"- {title}: {ratio if ratio is not None else 'not measured'}")
    return [*lines, ""]


def _md_compile(part: dict[str, Any]) -> list[str]:
    columns = [
        ("compile", ""),
        ("first_step_s", ".2f"),
        ("compile_s", ".2f"),
        ("step_s", ".4f"),
        ("samples_per_s", ".2f"),
        ("vs_eager", ".2f"),
        ("vs_softmax", ".2f"),
        ("peak_mib", ",.0f"),
        ("status", ""),
    ]
    lines = [
        (
            "The GPU work's families under `train.compile=true` (torch.compile through accelerate): compile s is the "
            "first step's time past a steady step's; vs eager: over the same recipe's samples/s in the train part; "
            "vs softmax: over eager `vit_softmax_1024`'s."
        ),
        "",
        *_table(["run", "compile", "first step s", "compile s", "step s", "samples/s", "vs eager", "vs softmax",
                 "peak MiB", "status"]),
    ]  # fmt: skip
    return [*lines, *(_run_row(item, columns) for item in part["items"]), ""]


def _md_long(part: dict[str, Any]) -> list[str]:
    columns = [
        ("attention", ""),
        ("tokens", ","),
        ("batch_size", ""),
        ("step_s", ".4f"),
        ("tokens_per_s", ",.0f"),
        ("vs_softmax", ".2f"),
        ("peak_mib", ",.0f"),
        ("status", ""),
    ]
    lines = [
        (
            "The long 1-D recipes at full length, one batch repeated; each beside the same recipe with softmax "
            "(ListOps and Path-X ship with softmax: beside linear). vs softmax: tokens/s over softmax's. A set this "
            "machine cannot build is timed on random tokens of its shape and vocabulary (the status says so)."
        ),
        "",
        *_table(["run", "attention", "tokens", "batch", "step s", "tokens/s", "vs softmax", "peak MiB", "status"]),
    ]
    return [*lines, *(_run_row(item, columns) for item in part["items"]), ""]


def _groups(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The runs by comparison, in the order they trained."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for item in results.get("runs", []):
        groups.setdefault(item.get("group", "runs"), []).append(item)
    return groups


def reached(items: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One comparison's race to softmax's final validation metric: `target` (that value), `metric`, and `times`:
    each finished run's training seconds at its first validation at or past the target (None: never within its
    time), softmax's own included; `first`: the run that got there first (None where none did). None without a
    finished softmax run."""
    done = [item for item in items if item.get("status") == "ok" and item.get("curve")]
    softmax = next((item for item in done if item["run"] == item.get("softmax")), None)
    if softmax is None:
        return None
    target, higher = softmax["val"], softmax["higher_is_better"]

    def at_target(point: dict[str, Any]) -> bool:
        value = point["val"]
        return value is not None and (value >= target if higher else value <= target)

    times = {
        item["run"]: next((point["train_s"] for point in item["curve"] if at_target(point)), None) for item in done
    }
    # a tie goes to the run that trained first (softmax)
    timed = [(time_s, order, run) for order, (run, time_s) in enumerate(times.items()) if time_s is not None]
    first = min(timed)[2] if timed else None
    return {"metric": softmax["metric"], "target": target, "softmax": softmax["run"], "times": times, "first": first}


def _reached_line(race: dict[str, Any] | None, items: list[dict[str, Any]]) -> str:
    if race is None:
        return "Softmax's run did not finish: no target to reach."
    metric, target, times = race["metric"], race["target"], race["times"]
    said = f"softmax's final validation {metric} ({target:.4f}, `{race['softmax']}`)"
    if race["first"] is None:
        return f"No run reached {said}."
    others = ", ".join(f"{run} {'never' if time_s is None else f'at {time_s:.1f} s'}" for run, time_s in times.items())
    line = f"First to reach {said}: **{race['first']}**, at {times[race['first']]:.1f} s of training ({others})."
    if any(item.get("data", "real") != "real" for item in items):
        line += " Random tokens stood in for the data here: this comparison measures speed, not learning."
    return line


def _curve_text(item: dict[str, Any]) -> str:
    return ", ".join(f"{point['train_s']:.1f} s: {_cell(point['val'], '.4f')}" for point in item.get("curve", []))


def train_markdown(results: dict[str, Any]) -> str:
    """`device_train.md`: per comparison, each attention trained for the same wall time, its validation metric
    against its training time beside its speed, and which reached softmax's final metric first."""
    lines = [
        f"# Equal-time training: {results.get('device_name')}",
        "",
        (
            f"{results.get('date')}; each recipe trained for {results.get('seconds')} s of wall time (its schedule "
            f"spread over that time; evaluations not counted), validated on {results.get('val_samples')} samples at "
            f"{results.get('points', 1)} evenly spaced times, the last its end. Written by `make device-train` "
            "(`zoo_bench.device_train`)."
        ),
        "",
    ]
    columns = [
        ("attention", ""),
        ("steps", ","),
        ("samples", ","),
        ("samples_per_s", ".1f"),
        ("first_step_s", ".2f"),
        ("train_loss", ".4f"),
        ("val", ".4f"),
        ("val_loss", ".4f"),
        ("status", ""),
    ]
    plots = results.get("plots") or {}
    for group, items in _groups(results).items():
        metric = next((item["metric"] for item in items if item.get("metric")), "metric")
        lines += [f"## {group}", ""]
        lines += _table(["run", "attention", "steps", "samples", "samples/s", "first step s", "train loss",
                         f"val {metric}", "val loss", "status"])  # fmt: skip
        lines += [_run_row(item, columns) for item in items]
        lines += ["", _reached_line(reached(items), items), ""]
        curves = [f"- {item['run']}: {_curve_text(item)}" for item in items if item.get("curve")]
        if curves:
            lines += [f"Validation {metric} against seconds of training:", "", *curves, ""]
        if group in plots:
            lines += [f"![{group}]({plots[group]})", ""]
    return "\n".join(lines)


def plot_curves(results: dict[str, Any], out: Any) -> dict[str, str]:
    """A `device_train_<comparison>.png` per comparison in folder `out`: each run's validation metric against its
    seconds of training, softmax's final value dashed -> comparison: file name. None drawn (empty) without matplotlib (a
    bare GPU machine may lack it; the JSON holds the curves)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return {}
    written = {}
    for group, items in _groups(results).items():
        drawn = [item for item in items if item.get("status") == "ok" and item.get("curve")]
        if not drawn:
            continue
        figure = Figure(figsize=(6, 4))
        axes = figure.subplots()
        for item in drawn:
            points = [point for point in item["curve"] if point["val"] is not None]
            seconds, values = [point["train_s"] for point in points], [point["val"] for point in points]
            axes.plot(seconds, values, marker="o", label=f"{item['run']} ({item['attention']})")
        race = reached(items)
        if race is not None:
            axes.axhline(race["target"], color="grey", linestyle="--", label="softmax's final")
        axes.set(xlabel="training wall time (s)", ylabel=f"validation {drawn[0]['metric']}", title=group)
        axes.legend(fontsize="small")
        name = f"device_train_{group}.png"
        figure.savefig(f"{out}/{name}", dpi=100, bbox_inches="tight")
        written[group] = name
    return written
