"""The device check's markdown report (`device_check.md`), from its results alone: one section per part."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown"]


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
    for name, writer in (
        ("correctness", _md_correctness),
        ("flex", _md_flex),
        ("bench", _md_bench),
        ("train", _md_train),
    ):
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
    lines = [
        "Forward + backward, batch 1, bf16 on CUDA (fp32 on the CPU); the full tables in `results.md`.",
        "",
        "| variant | crossover vs softmax (tokens) | speedup over softmax |",
        "|---|---|---|",
    ]
    for name, entry in part.get("summary", {}).items():
        if name == "softmax":
            continue
        crossover = (entry.get("crossover") or {}).get("text", "-")
        speedup = entry.get("speedup")
        speed = f"{speedup['x']}x at {speedup['length']:,}" if speedup else "-"
        lines.append(f"| `{name}` | {crossover} | {speed} |")
    failures = [i for i in part["items"] if i["status"] != "ok"]
    lines += [""] + [f"- `{i['variant']}` at {i['length']:,}: {i['status']} {i.get('message', '')}" for i in failures]
    return [*lines, ""]


def _md_train(part: dict[str, Any]) -> list[str]:
    lines = [
        (
            "A `Trainer` built from each recipe; one real batch on the device, repeated (data loading excluded); "
            "samples/s over the timed steps after warm-up."
        ),
        "",
        "| run | px | tokens | batch | precision | step s | samples/s | peak MiB | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for item in part["items"]:
        if item["status"] != "ok":
            lines.append(f"| {item['run']} | - | - | - | - | - | - | - | {item['status']}: {item['message']} |")
            continue
        row = [item["run"], item["img_size"], item["tokens"], item["batch_size"], item["mixed_precision"]]
        row += [item["step_s"], item["samples_per_s"], item.get("peak_mib", "-"), "ok"]
        lines.append("| " + " | ".join(map(str, row)) + " |")
    lines.append("")
    for title, ratio in part.get("ratios", {}).items():
        lines.append(f"- {title}: {ratio if ratio is not None else 'not measured'}")
    return [*lines, ""]
