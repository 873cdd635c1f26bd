"""The recall grid's cells: the variants (`Variant`, `parse_variant`), the MQAR data of a length (`cell_data`), the
state each variant keeps per layer (`state_size`, by `STATE_FORMULAS`), and a cell's summary over its runs
(`summarize_cells`). The sweep that runs the grid is `zoo_bench.recall`; its report `zoo_bench.recall_report`.

A variant is a registered name with options, `local:window=16` (its label is `local(window=16)`); a variant with a
`max_seq_len` option gets the cell's length there. `state_size` gives the floats each variant keeps per layer (the
Based paper's x-axis, https://arxiv.org/abs/2402.18668 Figure 3).
"""

from __future__ import annotations

import statistics
from typing import Any

import yaml

from zoo._validate import check_int
from zoo.attention import attention_options, get_attention

__all__ = [
    "DEFAULT_LENGTHS",
    "DEFAULT_LRS",
    "DEFAULT_VARIANTS",
    "DEFAULT_WIDTHS",
    "STATE_FORMULAS",
    "Variant",
    "cell_data",
    "cell_text",
    "parse_variant",
    "state_size",
    "summarize_cells",
    "variant_spec",
]

# Zoology's Figure 2 lengths, and widths a CPU trains
DEFAULT_LENGTHS = (64, 128, 256, 512)
DEFAULT_WIDTHS = (64, 128)
DEFAULT_LRS = (1e-3, 3e-3)
# every 1-D variant, with windows and blocks well below the lengths (their defaults of 256+ would be exact softmax
# attention at these lengths) and the sliding window at several sizes (Based Figure 2)
DEFAULT_VARIANTS = (
    "softmax",
    "linear",
    "performer",
    "hedgehog",
    "local:window=8",
    "local:window=16",
    "local:window=32",
    "local:window=64",
    "softmax1",
    "dilated:window=16",
    "longformer:window=16",
    "sparse:block=16",
    "bigbird:block_size=16",
    "reformer:bucket_size=16",
    "gau:group_size=16",
    "vq:block_len=16",
    "banded_conv:radius=16",
    "linformer:k=32",
    "nystrom:num_landmarks=16",
    "synthesizer",
)


class Variant:
    """An attention name with options: `local:window=16,backend=auto` -> name `local`, options, label."""

    def __init__(self, name: str, options: dict[str, Any] | None = None) -> None:
        get_attention(name)  # an unknown name is the registry's error
        allowed = attention_options(name)
        for key in options or {}:
            if key not in allowed:
                raise ValueError(f"attention {name!r} has no option {key!r}; its options: {', '.join(allowed)}")
        self.name, self.options = name, dict(options or {})

    @property
    def label(self) -> str:
        inner = ",".join(f"{key}={value}" for key, value in self.options.items())
        return f"{self.name}({inner})" if inner else self.name

    @property
    def causal(self) -> bool:
        return bool(get_attention(self.name).supports_causal)

    def options_at(self, length: int) -> dict[str, Any]:
        """The options a run at `length` uses: `max_seq_len` set to the length where the variant has one."""
        options = dict(self.options)
        if "max_seq_len" in attention_options(self.name):
            options.setdefault("max_seq_len", length)
        return options


def parse_variant(text: str) -> Variant:
    """`name` or `name:key=value,key=value` (values read as YAML) -> a `Variant`."""
    name, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"variant {text!r}: option {item!r} is not KEY=VALUE")
        options[key.strip()] = yaml.safe_load(value)
    return Variant(name.strip(), options)


def variant_spec(label: str) -> str:
    """A label back to the text `parse_variant` reads: `local(window=16)` -> `local:window=16`."""
    name, _, inner = label.partition("(")
    return f"{name}:{inner.rstrip(')')}" if inner else name


def cell_data(length: int, pairs: int | None = None) -> dict[str, int]:
    """MQAR's options at `length`: vocabulary `max(2 L, 128)` (Zoology needs it above L), `L / 8` pairs, or `pairs`
    (a fixed count: recall over distance rather than capacity, the long-length protocol a CPU affords)."""
    check_int("length", length, 16)
    if pairs is not None:
        check_int("pairs", pairs, 1)
    return {"seq_len": length, "vocab_size": max(2 * length, 128), "num_kv_pairs": pairs or length // 8}


# The floats of state one layer keeps to answer a query (Based's recall-vs-state x-axis), per family, with d the
# width, h the heads, e = d / h the head width and N the length. For causal variants this is the recurrent (decoding)
# state; for the encoder-only ones the keys and values every query reads.
STATE_FORMULAS = {
    "softmax": "2 N d (every key and value)",
    "softmax1": "2 N d (every key and value)",
    "synthesizer": "N d values + N^2 h weights (dense)",
    "reformer": "2 N d (every key and value, hashed into buckets)",
    "sparse": "2 N d (strided: every key and value may be read)",
    "bigbird": "2 N d (every key and value: random blocks)",
    "local": "2 (w + 1) d (the window's keys and values)",
    "dilated": "2 (w + 1) d (keys and values of the dilated window)",
    "longformer": "2 (w + 1 + g) d (window and g global tokens)",
    "banded_conv": "2 (r + 1) d (the band's keys and values)",
    "gau": "2 g d (a group's keys and values) + e d (the linear part's sum)",
    "vq": "2 (c + b) d (codebook c per head row and the last block b)",
    "linear": "h e (e + 1) = d (e + 1) (elu+1 feature map: e x e sum and normaliser)",
    "performer": "h m (e + 1) (m random features)",
    "hedgehog": "h f (e + 1) (f learned features) + 2 w d if windowed",
    "linformer": "2 k d (k projected keys and values)",
    "nystrom": "2 m d (m landmarks' keys and values)",
}


def state_size(variant: Variant, length: int, width: int, heads: int) -> int | None:
    """Floats of state per layer by `STATE_FORMULAS` (None for a family without one)."""
    options = {**_defaults(variant.name), **variant.options_at(length)}
    d, h, n = width, heads, length
    e = d // h
    name = variant.name
    if name in ("softmax", "softmax1", "reformer", "sparse", "bigbird"):
        return 2 * n * d
    if name == "synthesizer":
        return n * d + n * n * h
    if name in ("local", "dilated", "longformer"):
        window = min(options["window"], n)
        extra = len(options.get("global_indices", ())) if name == "longformer" else 0
        return 2 * (window + 1 + extra) * d
    if name == "banded_conv":
        return 2 * (min(options["radius"], n) + 1) * d
    if name == "gau":
        return 2 * min(options["group_size"], n) * d + e * d
    if name == "vq":
        return 2 * (options["codebook_size"] + min(options["block_len"], n)) * d
    if name == "linear":
        return h * e * (e + 1)
    if name == "performer":
        return h * options["nb_features"] * (e + 1)
    if name == "hedgehog":
        return h * options["feature_dim"] * (e + 1) + 2 * options["window"] * d
    if name == "linformer":
        return 2 * min(options["k"], n) * d
    if name == "nystrom":
        return 2 * min(options["num_landmarks"], n) * d
    return None


def _defaults(name: str) -> dict[str, Any]:
    return dict(attention_options(name))


def summarize_cells(records: list[dict[str, Any]]) -> dict[tuple[str, int, int], dict[str, Any]]:
    """(label, length, width) -> the cell: its chosen lr, test accuracy mean / std / per seed, the lrs tried, the
    seeds, and the failures (status and message) when no run of it succeeded."""
    cells: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for record in records:
        cells.setdefault((record["label"], record["length"], record["width"]), []).append(record)
    return {key: _cell(runs) for key, runs in cells.items()}


def _cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["status"] == "ok" and r.get("test", {}).get("top1") is not None]
    cell: dict[str, Any] = {"lrs": sorted({r["lr"] for r in runs}), "runs": len(runs)}
    if not ok:
        first = runs[0]
        return {**cell, "status": first["status"], "message": first.get("message", "")}
    by_lr: dict[float, list[dict[str, Any]]] = {}
    for r in ok:
        by_lr.setdefault(r["lr"], []).append(r)

    def validation(lr: float) -> float:
        values = [r["val_top1"] if r.get("val_top1") is not None else r["test"]["top1"] for r in by_lr[lr]]
        return statistics.fmean(values)

    best = max(by_lr, key=lambda lr: (validation(lr), len(by_lr[lr])))
    tests = [r["test"]["top1"] for r in sorted(by_lr[best], key=lambda r: r["seed"])]
    walls = [r.get("train_wall_s") for r in by_lr[best] if r.get("train_wall_s")]
    return {
        **cell,
        "status": "ok",
        "lr": best,
        "val_top1": round(validation(best), 4),
        "top1": round(statistics.fmean(tests), 4),
        "top1_std": round(statistics.stdev(tests), 4) if len(tests) > 1 else None,
        "per_seed": tests,
        "seeds": sorted(r["seed"] for r in by_lr[best]),
        "train_wall_s": round(statistics.fmean(walls), 1) if walls else None,
    }


def cell_text(cell: dict[str, Any] | None) -> str:
    """A cell as every page shows it: test accuracy `0.987 ± 0.004` (mean ± std over seeds), its failure, or
    `not run`."""
    if cell is None:
        return "not run"
    if cell["status"] != "ok":
        return cell["status"]
    spread = f" ± {cell['top1_std']:.3f}" if cell.get("top1_std") is not None else ""
    return f"{cell['top1']:.3f}{spread}"
