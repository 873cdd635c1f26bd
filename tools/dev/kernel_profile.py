"""Where a fused linear-family layer spends its GPU time, kernel by kernel (`zoo.attention._kernels.fused_linear`).

`python -m dev.kernel_profile --out DIR` runs forward + backward of one attention layer (projections
included, bf16 autocast, ViT-S/16 at 1024 px: batch 32, 4,097 tokens, dim 384, 6 heads) under `torch.profiler` for
each (variant, `ZOO_FUSED_CONFIG`) in `CASES`, SDPA's layer first, window2d's windowed layer last, and writes
`kernel_profile.json` / `.md` after every case: each kernel's device ms per step and share of the step, with the
registers, spills (triton's `n_spills`: local memory a thread in 4-byte words) and shared memory that Triton compiled
it with on this GPU (where its cache exposes them).
The wall ms per step is the median of the timed steps outside the profiler. `kernel_configs` says which
configuration is fastest; this says why.
On the CPU (`--device cpu`, with `TRITON_INTERPRET=1` set) the same cases run at toy sizes through Triton's
interpreter, without device times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from zoo.attention import create_attention, get_attention
from zoo.attention._grid import GridAttention
from zoo.attention._kernels.fused_linear import kernels as fused_kernels
from zoo_bench.device_parts import sync
from zoo_bench.recall_grid import parse_variant

from .kernel_configs import FEATURES, layer_step, median_ms

# (label, variant with options as `recall.parse_variant` reads them, ZOO_FUSED_CONFIG or "" for the kernels' own
# block sizes): each fused map at its defaults, then the layouts that compile without spills on sm_90
# (`dev.kernel_resources`, benchmarks/cpu/kernel_resources_sm90.md) and performer's 128-row tiles (whole
# features and tf32 products were timed on the H200 already: slower, benchmarks/nvidia-h200/chunked); window2d as
# vit_window2d_global_1024's windowed blocks run it (FlexAttention, then the torch path), whose windowed blocks
# cost more than their FLOPs say (benchmarks/nvidia-h200/chunked/kernel_profile.md)
CASES = (
    ("sdpa", "softmax", ""),
    ("performer", "performer", ""),
    ("performer", "performer", "favor=32:8::64"),
    ("performer", "performer", "favor=128:8::64"),
    ("hedgehog", "hedgehog", ""),
    ("hedgehog", "hedgehog", "hedgehog=32:8::64"),
    ("linear", "linear", ""),
    ("linear", "linear", "elu=64:8"),
    ("window2d", "window2d:window=16", ""),
    ("window2d", "window2d:window=16,backend=torch", ""),
)
# A layout replaces a map's default in `fastest_config` only when its wall time is this much shorter: well above how
# far the median of a few steps moves between runs of the same layout
MARGIN = 0.03
SHAPE = (32, 4097, 384, 6)  # batch, tokens (a class token and a 64 x 64 grid), dim, heads
CPU_SHAPE = (2, 65, 64, 1)  # a class token and an 8 x 8 grid


def _module(variant: str, n: int, dim: int, heads: int) -> torch.nn.Module:
    """The layer of `variant` (`name:key=value,...`) with the sweep's options for its map; a grid variant over the
    square grid of n - 1 patches after one class token."""
    spec = parse_variant(variant)
    options = next((options for name, options, _ in FEATURES.values() if name == spec.name), {})
    options = {**options, **spec.options}
    if issubclass(get_attention(spec.name), GridAttention):
        side = math.isqrt(n - 1)
        options.update(grid_size=(side, side), num_prefix_tokens=1)
    return create_attention(spec.name, dim, heads, **options)


def _compiled_resources() -> dict[str, dict]:
    """Each fused kernel's registers, spills and shared memory as compiled on this device (the last compiled
    variant of each), from the Triton JIT caches; {} where this Triton keeps them elsewhere."""
    resources = {}
    for name in dir(fused_kernels):
        kernel = getattr(fused_kernels, name)
        caches = getattr(kernel, "device_caches", None)
        if not name.endswith("_kernel") or not isinstance(caches, dict):
            continue
        for cache in caches.values():
            compiled = cache[0] if isinstance(cache, tuple) else cache
            for binary in compiled.values() if isinstance(compiled, dict) else ():
                metadata = getattr(binary, "metadata", None)
                resources[name] = {
                    "registers": getattr(binary, "n_regs", None),
                    "spills": getattr(binary, "n_spills", None),
                    "shared": getattr(metadata, "shared", None),
                    "warps": getattr(metadata, "num_warps", None),
                    "stages": getattr(metadata, "num_stages", None),
                }
    return resources


def profile_case(variant: str, config: str, device: str, steps: int) -> dict:
    """Wall ms per step (median) and device ms per step for each kernel of one layer under `config`."""
    batch, n, dim, heads = SHAPE if device == "cuda" else CPU_SHAPE
    os.environ["ZOO_FUSED_CONFIG"] = config
    try:
        module = _module(variant, n, dim, heads).to(device)
        x = torch.randn(batch, n, dim, device=device).requires_grad_()
        grad = torch.randn(batch, n, dim, device=device)
        wall_ms = median_ms(module, x, grad, device, steps)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(steps):
                layer_step(module, x, grad, device)
            sync(device)
        kernels: dict[str, float] = defaultdict(float)
        for event in prof.key_averages():
            # the kernels themselves: an operator's row would count its kernels' time a second time
            device_us = getattr(event, "self_device_time_total", 0) or 0
            if device_us > 0 and str(event.device_type).endswith("CUDA"):
                kernels[event.key[:90]] += device_us / 1e3 / steps
        return {
            "wall_ms": wall_ms,
            "kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
            "resources": _compiled_resources() if device == "cuda" else {},
        }
    except Exception as error:  # noqa: BLE001 - recorded, and the profile goes on
        return {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    finally:
        os.environ.pop("ZOO_FUSED_CONFIG", None)


def markdown(results: dict) -> str:
    batch, n, dim, heads = results["shape"]
    lines = [
        "# Fused kernels, kernel by kernel",
        "",
        f"One layer's forward + backward on {results['device']} ({results['name']}), bf16 autocast, batch {batch}, "
        f"{n:,} tokens, dim {dim}, {heads} heads; ms per step. Written by `dev.kernel_profile`.",
    ]
    for case in results["cases"]:
        lines += ["", f"## {case.get('variant', case['label'])} `{case['config'] or 'default'}`", ""]
        if "error" in case:
            lines.append(f"error: {case['error']}")
            continue
        total = sum(case["kernels_ms"].values())
        lines += [
            f"wall {case['wall_ms']:.2f} ms per step; kernels {total:.2f} ms",
            "",
            "| kernel | ms | share | registers | spills | shared B |",
            "|---|---|---|---|---|---|",
        ]
        for name, ms in case["kernels_ms"].items():
            res = next((r for k, r in case["resources"].items() if k in name), {})
            cells = [res.get(key, "") for key in ("registers", "spills", "shared")]
            lines.append(f"| {name} | {ms:.3f} | {ms / total:.0%} | " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def fastest_config(cases: list[dict]) -> str:
    """`ZOO_FUSED_CONFIG` for the maps whose default and some other layout were both timed, naming each where a
    layout beat the default by more than `MARGIN` (the fastest of them); "" where none did."""
    chosen = []
    for label in dict.fromkeys(case["label"] for case in cases):
        timed = [case for case in cases if case["label"] == label and "wall_ms" in case]
        default = next((case for case in timed if not case["config"]), None)
        others = [case for case in timed if case["config"]]
        if default is None or not others:
            continue
        best = min(others, key=lambda case: case["wall_ms"])
        if best["wall_ms"] < default["wall_ms"] * (1 - MARGIN):
            chosen.append(best["config"])
    return ",".join(chosen)


def run(device: str, out: Path, steps: int, labels: tuple[str, ...] = ()) -> dict:
    name = torch.cuda.get_device_name() if device == "cuda" else "interpreter"
    results = {"device": device, "name": name, "shape": list(SHAPE if device == "cuda" else CPU_SHAPE), "cases": []}
    out.mkdir(parents=True, exist_ok=True)
    for label, variant, config in CASES:
        if labels and label not in labels:
            continue
        started = time.perf_counter()
        case = {"label": label, "variant": variant, "config": config, **profile_case(variant, config, device, steps)}
        results["cases"].append(case)
        # what `tools/device_check.py --fused-config-from` reads for the check that follows, kept up to date in a
        # profile cut short
        results["fastest_config"] = fastest_config(results["cases"])
        (out / "kernel_profile.json").write_text(json.dumps(results, indent=1))
        (out / "kernel_profile.md").write_text(markdown(results))
        print(f"{variant} {config or 'default'}: {case.get('wall_ms', case.get('error'))} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: toy sizes, interpreted")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--labels", nargs="+", default=(), help="default: every case in CASES")
    args = parser.parse_args()
    run(args.device, args.out, args.steps, tuple(args.labels))
    print((args.out / "kernel_profile.md").read_text())


if __name__ == "__main__":
    main()
