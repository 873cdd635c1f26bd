"""Which attention to pick: `docs/choose.md`, generated from the committed results the cards read.

One answer per setting (images at 256 / 1024 / 2048 px on a GPU and on a CPU, 1-D sequences at 1K / 16K / 64K
tokens on each, tasks that recall tokens, converting a pretrained softmax ViT): the variant and its options, the
number the pick rests on and the file it was measured in, or "not measured" and the command that would measure it.
A variant is picked over softmax only where it is faster by more than the measurement's noise (`MARGIN`, or the
spread of the repeats where larger); otherwise the answer is softmax, the exact reference. `tools/pages.py` writes
this page with the cards; the suite checks it is what the committed results give.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from ._results import (
    GPU_TRAIN,
    HIGHRES,
    QUALITY_COMMAND,
    RECALL2D,
    beyond_noise,
    load,
    mean_std,
    percent_mean_std,
    quality_races,
)
from .cards import variant_facts
from .machine import REPO_ROOT
from .recall_grid import summarize_cells

__all__ = ["LAYER_FILES", "choose_markdown", "choose_rows", "recall_picks", "write_choose"]

# one layer (dim 512, 8 heads), forward + backward: device -> files, a later file wins per variant and length
LAYER_FILES = {
    "CPU": ("benchmarks/cpu/results.json",),
    "GPU": (
        "benchmarks/nvidia-h100-80gb-hbm3/results.json",
        "benchmarks/nvidia-h100-80gb-hbm3/one_block/results.json",
        "benchmarks/nvidia-h200/fused/results.json",
        "benchmarks/nvidia-h200/all_recipes/results.json",
        "benchmarks/nvidia-h200/chunked/results.json",
    ),
}
CONVERSION = "benchmarks/cpu/conversion.json"
RECALL_LENGTHS = ("benchmarks/cpu/recall_lengths/recall.json",)
# a recipe per image variant (`recipes/vit_<name>_1024.yaml`); the GPU check's run names read `vit_<name>_<px>`
# or `<name>_<px>`
GPU_RECALL_COMMAND = (
    "tools/recall.py --out benchmarks/<gpu>/recall_lengths --lengths 1024 4096 16384 --widths 128 --lrs 1e-3 3e-3 "
    "--seeds 0 1 --pairs 64 --budget-steps 3000 --jobs 8 --variants softmax linear hedgehog performer "
    "local:window=256 local:window=1024 reformer:bucket_size=64 bigbird:block_size=64 nystrom:num_landmarks=64"
)
IMAGE_COMMAND = "make device-check DEVICE_OUT=benchmarks/<gpu>  (the train part: every vit_*_1024 recipe, two at 2048)"


def _train_rows() -> list[dict[str, Any]]:
    """Every GPU classifier training measurement in `GPU_TRAIN` (the checks the cards' column reads, oldest first):
    run, layout, variant, tokens, samples/s, the same file's softmax rate at the same tokens, file. Segmentation
    runs (`seg_*`) are left out: their decoder's cost is not the classifier's."""
    rows = []
    for path in GPU_TRAIN:
        data = load(path)
        items = [i for i in (data or {}).get("parts", {}).get("train", {}).get("items", []) if i.get("ok")]
        items = [{**i, **_names(i)} for i in items if not i["run"].startswith("seg_")]
        base = {i["tokens"]: i["samples_per_s"] for i in items if i["attention"] == "softmax"}
        for item in items:
            if item["tokens"] in base:
                rows.append({**item, "softmax": base[item["tokens"]], "file": path, "device": data["device_name"]})
    return rows


def _names(item: dict[str, Any]) -> dict[str, str]:
    """A run's attention and layout: `vit_window2d_global_2048` is `window2d` attention in the `window2d_global`
    layout (the run's name less `vit_` and its size); older checks name the run only (`window2d_global_1024`)."""
    match = re.fullmatch(r"(?:vit_)?(.+)_\d+", item["run"])
    layout = match.group(1) if match else item["attention"]
    return {"attention": item.get("attention") or layout, "layout": layout}


def _gpu_images(tokens: int) -> tuple[str, str]:
    """The pick at `tokens` (4,097: 1024 px; 16,385: 2048 px) from the newest file that measured that size."""
    rows = [r for r in _train_rows() if r["tokens"] == tokens]
    if not rows:
        return "not measured", f"`{IMAGE_COMMAND}`"
    newest = [r for r in rows if r["file"] == rows[-1]["file"]]
    best = max(newest, key=lambda r: r["samples_per_s"] / r["softmax"])
    x = best["samples_per_s"] / best["softmax"]
    where = f"{best['device']}, `{best['file']}`"
    if best["attention"] == "softmax" or not beyond_noise(best["softmax"], best["samples_per_s"]):
        return "`softmax`", f"no variant trains more than {MARGIN_TEXT} faster ({where})"
    runners_up = sorted((r for r in newest if r is not best), key=lambda r: r["samples_per_s"], reverse=True)
    others = ", ".join(f"`{r['layout']}` {r['samples_per_s'] / r['softmax']:.2f}x" for r in runners_up[:5])
    more = len(runners_up) - 5
    others += f" and {more} more below" if more > 0 else ""
    sets = " ".join(best.get("overrides") or [])
    text = f"`{best['layout']}` (`{best['recipe']}`{' --set ' + sets if sets else ''})"
    return text, f"{x:.2f}x softmax's training samples/s ({others}; {where}){_options_note(best)}"


def _options_note(record: dict[str, Any]) -> str:
    """Where the recipe's attention options (its overrides applied) are not those the record measured, or the record
    (older checks) did not keep them while the recipe now sets some: a sentence saying so, else ""."""
    from zoo.config import load_recipe

    path = REPO_ROOT / record["recipe"]
    if not path.exists():
        return f". Its recipe, `{record['recipe']}`, is no longer shipped"
    now = load_recipe(path, list(record.get("overrides") or [])).model.attention.options
    measured = record.get("attention_options")
    if measured is None and now:
        return (
            f". The check that measured it kept no attention options; the recipe now sets {_options_text(now)}, "
            "which `make device-check` times as it is"
        )
    if measured is not None and measured != now:
        return f". Measured with {_options_text(measured)}; the recipe now sets {_options_text(now)}"
    return ""


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(f"`{key}={value}`" for key, value in sorted(options.items())) or "none"


class _Timed(NamedTuple):
    """A variant's newest layer timing: the file, its record, and the same file's softmax record (None: that file
    has no softmax that ran)."""

    path: str
    record: dict[str, Any]
    softmax: dict[str, Any] | None

    @property
    def speedup(self) -> float:
        return self.softmax["fwd_bwd_s"] / self.record["fwd_bwd_s"]


def _layer(device: str, length: int) -> tuple[str, str]:
    """The variant with the largest speedup over softmax at `length` (beyond the noise), with its error against
    exact. Each variant's record comes from the newest file that has it, and its speedup from that file's softmax:
    two files may be two machines."""
    from zoo.attention import list_attentions

    latest: dict[str, _Timed] = {}
    for path in LAYER_FILES[device]:
        # registered variants only (a file's `projections` row times the projections alone)
        mine = [
            r
            for r in (load(path) or {}).get("records", [])
            if r["length"] == length and r["variant"] in list_attentions()
        ]
        softmax = next((r for r in mine if r["variant"] == "softmax" and r["status"] == "ok"), None)
        latest.update({r["variant"]: _Timed(path, r, softmax) for r in mine})
    ok = {name: timed for name, timed in latest.items() if timed.record["status"] == "ok"}
    if "softmax" not in latest or not ok:
        what = "--device cuda" if device == "GPU" else "--device cpu"
        return "not measured", f"`tools/benchmark.py {what} --lengths {length}`"
    if "softmax" not in ok:
        fastest = min(ok.values(), key=lambda timed: timed.record["fwd_bwd_s"])
        why = f"softmax: {latest['softmax'].record['status']}"
        return (
            f"`{fastest.record['variant']}`",
            f"{1000 * fastest.record['fwd_bwd_s']:.3g} ms, the fastest; {why} (`{fastest.path}`)",
        )
    compared = sorted((t for t in ok.values() if t.softmax is not None), key=lambda t: t.speedup, reverse=True)
    # the error against exact at 16K, measured on the CPU
    errors = {
        r["variant"]: r.get("rel_error") for p in LAYER_FILES["CPU"] for r in load(p)["records"] if r["length"] == 16384
    }
    best = compared[0]
    name, seconds = best.record["variant"], best.record["fwd_bwd_s"]
    if name == "softmax" or not beyond_noise(best.softmax["fwd_bwd_s"], seconds, best.record, best.softmax, time=True):
        return "`softmax`", f"nothing faster by more than {MARGIN_TEXT} (`{ok['softmax'].path}`)"
    exactish = [t for t in compared if (errors.get(t.record["variant"]) or 1.0) <= 0.1]
    tail = ""
    if exactish and exactish[0] is not best:
        e = exactish[0]
        if beyond_noise(e.softmax["fwd_bwd_s"], e.record["fwd_bwd_s"], time=True):
            tail = f"; the fastest within 0.1 of exact: `{e.record['variant']}` {e.speedup:.1f}x"
    error = errors.get(name)
    shown = f", error vs exact {error:.2g} at 16K" if error is not None else ""
    return f"`{name}`", f"{best.speedup:.1f}x softmax ({1000 * seconds:.3g} ms{shown}){tail} (`{best.path}`)"


def _cpu_images() -> dict[str, tuple[str, str]]:
    data = load(HIGHRES)
    if data is None:
        return {}
    by_layout: dict[str, list[float]] = {}
    for run in data["runs"]:
        if run["status"] == "ok":
            by_layout.setdefault(run["layout"], []).append(run["test"]["top1"])
    means = {k: mean_std([100 * top1 for top1 in v]) for k, v in by_layout.items()}
    best = max(means, key=lambda k: means[k][0])
    soft = means.get("softmax", (0.0, 0.0))
    spread = max(means[best][1], soft[1])
    if best != "softmax" and means[best][0] - soft[0] <= spread:
        best = "softmax"
    steps = {k: v["step_s"] for k, v in data["steps"].items() if v.get("status") == "ok"}
    fastest = min(steps, key=steps.get)
    return {
        "256": (
            f"`{best}`",
            f"top-1 {percent_mean_std(by_layout[best])} % after {data['protocol']['budget_steps']} steps "
            f"(softmax {soft[0]:.1f}; a layout beats softmax only by more than the seeds' spread) (`{HIGHRES}`)",
        ),
        "2048": (
            f"`{fastest}`",
            f"{steps[fastest]:.2f} s per training step at 2048 px against softmax's {steps.get('softmax', 0):.1f} s, "
            f"one thread (`{HIGHRES}`)",
        ),
    }


def recall_picks() -> list[tuple[str, str]]:
    """The variants that recall (MQAR >= 0.9 at their longest learnable length), best first, and the long lengths."""
    from zoo.attention import list_attentions

    rows = []
    for name in list_attentions():
        fact = variant_facts(name)["recall (MQAR)"]
        if fact is not None and fact.value is not None and fact.value >= 0.9 and name not in ("softmax", "softmax1"):
            rows.append((fact.value, name, fact.text))
    rows.sort(reverse=True)
    return [(f"`{name}`", text) for _, name, text in rows]


def _long_recall() -> str:
    """What the sweeps at 1K tokens and beyond hold: measured cells beside MQAR's chance (one value in L at
    vocabulary 2 L) and whether softmax learned the task at that length and budget (>= 0.99: else the cells measure
    the budget, not the attention), or why none."""
    cells, failures, learned = [], [], {}
    for path in RECALL_LENGTHS:
        data = load(path)
        if data is None:
            continue
        summary = summarize_cells(data["records"])
        learned.update(
            {length: cell.get("top1", 0) >= 0.99 for (label, length, _), cell in summary.items() if label == "softmax"}
        )
        steps = data["protocol"].get("budget_steps")
        for (label, length, _), cell in summary.items():
            if cell["status"] == "ok":
                cells.append((length, f"{label} {cell['top1']:.4f}", steps, path))
            else:
                failures.append(f"{label} at L={length}: {cell['status']} ({cell.get('message', '')}) in `{path}`")
    if not cells:
        return "not measured" + (f" (CPU: {'; '.join(failures)})" if failures else "")
    parts = []
    for length in sorted({c[0] for c in cells}):
        at = [c for c in cells if c[0] == length]
        control = {
            True: "softmax learned it",
            False: "softmax did not learn it at this budget, so these cells measure the budget, not the attention",
        }.get(learned.get(length), "no softmax control")
        parts.append(
            f"L={length} ({at[0][2]} steps; chance {1 / length:.4f}; {control}): " + ", ".join(c[1] for c in at)
        )
    unfinished = f"; not finished: {'; '.join(failures)}" if failures else ""
    return "CPU, `" + cells[0][3] + "`: " + "; ".join(parts) + unfinished


def _recall_2d() -> str:
    """Each layout's verdict on the 2-D recall probe, its test accuracy on the query pixels and the rules that recall
    nothing, or the command that measures it."""
    data = load(RECALL2D)
    measured = data and {k: v for k, v in data["summary"]["layouts"].items() if v["mean"] is not None}
    if not measured:
        return "not measured; `make bench-recall2d` measures it."
    baselines = data["summary"]["baselines"].items()
    rules = ", ".join(f"{name} {100 * v['pixel_accuracy']:.1f}" for name, v in baselines if "pixel_accuracy" in v)
    rows = "; ".join(f"`{name}` {percent_mean_std(v['accuracy'])}: {v['verdict']}" for name, v in measured.items())
    return (
        f"test accuracy % on the query pixels (mean ± std over seeds {', '.join(map(str, data['protocol']['seeds']))}, "
        f"{data['protocol']['budget_steps']} steps; rules that recall nothing: {rules or 'not measured'}): {rows} "
        f"(`{RECALL2D}`)."
    )


def _gpu_quality() -> list[str]:
    """Per comparison of the newest committed `make device-train` run: the attention that first reached softmax's
    final validation metric and when, beside every other's time; or the command that measures it."""
    races = quality_races()
    if not races:
        return [f"Not measured; `{QUALITY_COMMAND}` measures it on a GPU."]
    lines = []
    for race in races:
        times = "; ".join(
            f"`{run}` ({race['runs'][run]}) {'never' if t is None else f'{t:.0f} s'}"
            for run, t in race["times"].items()
        )
        first = f"`{race['first']}` first" if race["first"] else "none got there"
        lines.append(
            f"- `{race['group']}`: softmax's final validation {race['metric']} {race['target']:.3f} in "
            f"{race['seconds']:g} s each; {first} ({times}; {race['device']}, `{race['file']}`)"
        )
    return lines


def _conversion() -> tuple[str, str]:
    data = load(CONVERSION)
    if data is None:
        return "not measured", "`PYTHONPATH=tools .venv/bin/python -m zoo_bench.conversion`"
    best = max(data["rows"], key=lambda r: r["stage2"])
    teacher = data["teacher"]["top1_at_target"]
    options = ", ".join(f"{k}={v}" for k, v in best["options"].items())
    return (
        f"`{best['variant']}`" + (f" ({options})" if options else ""),
        f"top-1 {100 * best['stage2']:.1f} % against the teacher's {100 * teacher:.1f} at 4x the tokens, "
        f"{100 * best['scratch']:.1f} from scratch (`{CONVERSION}`)",
    )


def _table(rows: Iterable[tuple[str, str, str]]) -> list[str]:
    lines = ["| setting | pick | the number it rests on, and where |", "|---|---|---|"]
    return lines + [f"| {a} | {b} | {c} |" for a, b, c in rows]


MARGIN_TEXT = "5 % (or the repeats' spread)"


def _image_rows() -> list[tuple[str, str, str]]:
    cpu_images = _cpu_images()
    missing_cpu = (
        "not measured",
        "`PYTHONPATH=tools .venv/bin/python -m zoo_bench.highres --img-size 1024 --out benchmarks/cpu/highres_1024.md`"
        " (its timed step at 1024 px)",
    )
    gpu_256 = (
        "not measured",
        "`PYTHONPATH=tools .venv/bin/python -m zoo_bench.highres --out benchmarks/<gpu>/highres.md` on a GPU machine "
        "(the CPU row's 256-px sweep)",
    )
    return [
        ("256 px, GPU", *gpu_256),
        ("1024 px, GPU", *_gpu_images(4097)),
        ("2048 px, GPU", *_gpu_images(16385)),
        ("256 px, CPU", *cpu_images.get("256", missing_cpu)),
        ("1024 px, CPU", *missing_cpu),
        ("2048 px, CPU", *cpu_images.get("2048", missing_cpu)),
    ]


def _sequence_rows() -> list[tuple[str, str, str]]:
    return [
        (f"{n // 1024}K tokens, {device}", *_layer(device, n))
        for device in ("GPU", "CPU")
        for n in (1024, 16384, 65536)
    ]


def choose_rows() -> list[tuple[str, str, str]]:
    """(setting, pick, the number it rests on and where) for every setting of the page's tables: images, 1-D
    sequences, converting a softmax ViT."""
    return [
        *(("images, " + setting, pick, why) for setting, pick, why in _image_rows()),
        *(("1-D sequence, " + setting, pick, why) for setting, pick, why in _sequence_rows()),
        ("converting a softmax ViT to more tokens", *_conversion()),
    ]


def choose_markdown() -> str:
    images, sequences = _image_rows(), _sequence_rows()
    recall = recall_picks()
    lines = [
        "# Which attention to pick",
        "",
        "Generated by `tools/pages.py` from the committed results (do not edit by hand; the suite checks it is "
        "current). Each pick names the variant, the number it rests on and the file it was measured in; "
        f"a variant is picked over softmax only when it is faster by more than {MARGIN_TEXT}, else softmax, the "
        "exact reference. Every variant's measurements: docs/cards.md.",
        "",
        "## Images (ViT)",
        "",
        *_table(images),
        "",
        "Every GPU training measurement behind the image rows (ViT, bf16, one real batch repeated; against softmax "
        "in the same file at the same tokens):",
        "",
        "| run | tokens | samples/s | vs softmax | GPU | file |",
        "|---|---|---|---|---|---|",
        *(
            f"| `{r['run']}` | {r['tokens']:,} | {r['samples_per_s']:.1f} | {r['samples_per_s'] / r['softmax']:.2f}x "
            f"| {r['device']} | `{r['file']}` |"
            for r in _train_rows()
        ),
        "",
        "## Quality per GPU minute",
        "",
        "Each attention trained the same wall time per comparison (the 1024-px image and segmentation recipes, "
        "genomes, ListOps, Path-X, each beside softmax): which reached softmax's final validation metric first, and "
        "when (seconds of training, evaluations not counted).",
        "",
        *_gpu_quality(),
        "",
        "## 1-D sequences (one layer, dim 512, 8 heads, forward + backward)",
        "",
        *_table(sequences),
        "",
        "## Tasks that recall tokens (MQAR)",
        "",
        "Variants that recall (MQAR >= 0.9 at the longest length where softmax learned the task): "
        + ("; ".join(f"{name} {text}" for name, text in recall) if recall else "none measured")
        + ". Tasks that need no recall: pick by speed above. At 1K, 4K and 16K tokens (long DNA, say): "
        + _long_recall()
        + f"; on a GPU: not measured, `{GPU_RECALL_COMMAND}` measures it.",
        "",
        "## Recall across an image (2-D)",
        "",
        "Which layouts pair a query with a digit at least 4 patches away (`recipes/recall2d_quick.yaml`, the images' "
        "MQAR; recalls across the image at >= 90 %, not below 50 %): " + _recall_2d(),
        "",
        "## Converting a pretrained softmax ViT",
        "",
        *_table([("to more tokens", *_conversion())]),
        "",
        "## The shipped choices",
        "",
        "The quickstart and `recipes/vit_performer_1024.yaml` use Performer because it was the project's first "
        "family and needs no custom kernel on a CPU; the measured pick for a 1024-px GPU run is the one above "
        "(their comments say so).",
    ]
    return "\n".join(lines) + "\n"


def write_choose(path: Path | str = REPO_ROOT / "docs" / "choose.md") -> Path:
    path = Path(path)
    path.write_text(choose_markdown())
    return path
