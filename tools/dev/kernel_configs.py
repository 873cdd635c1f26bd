"""Block sizes of the fused linear-family kernels (`zoo.attention._kernels.fused_linear`), timed on a GPU.

`python -m dev.kernel_configs --out DIR` times forward + backward of one attention layer (projections
included, bf16 autocast, the shapes the 1024-px recipes and the 64K sweep use) for every feature map under each
`rows:warps[:dot[:chunk]]` configuration, with SDPA beside it, and writes `kernel_configs.json` / `.md` with the
fastest configuration per feature map, and the line `ZOO_FUSED_CONFIG=...` that selects them, for a script to
export before the device check. Both are rewritten, and the line printed again, after each configuration, so that a
sweep stopped at its time limit still chooses among those it timed (maps not reached keep the kernels' own block
sizes).
Performer's map goes first: its 256 features are the furthest from the others' default tiles.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import torch

from zoo.attention import create_attention
from zoo.attention._kernels.fused_linear import force_fused
from zoo_bench.device_parts import sync

# name -> (variant, options, `Feature` name), in the order swept
FEATURES = {
    "performer": ("performer", {"nb_features": 256}, "favor"),
    "hedgehog": ("hedgehog", {"feature_dim": 64}, "hedgehog"),
    "linear": ("linear", {}, "elu"),
}
# rows:warps[:dot[:chunk]] (`fused_linear.plan.config_override`): `::64` holds 64 features at a time (hedgehog: its
# halves), `::0` all at once (performer's 256, hedgehog's 2 x 64); linear's elu + 1 is always whole. An empty dot is
# bf16 operands under bf16 autocast (the kernels' default since the H200 profile: each map's fastest), `tf32` the
# earlier default. Each configuration compiles before it is timed (benchmarks/nvidia-h200/chunked/kernel_configs.md)
CONFIGS = ("64:8::64", "32:8::0", "64:4::64", "32:4::64", "128:8::64", "64:8:tf32:64")
# (batch, tokens, dim, heads): ViT-S/16 at 1024 px (4,097 tokens, batch 32), and one 64K sequence
SHAPES = {"vit_s_1024": (32, 4097, 384, 6), "64k": (1, 65536, 512, 8)}
# The CPU rehearsal (Triton's interpreter): the same shapes' roles at toy sizes
CPU_SHAPES = {"vit_s_1024": (2, 65, 64, 1), "64k": (1, 256, 64, 1)}


def layer_step(module, x, grad, device: str) -> None:
    """One forward + backward of `module` in bf16 autocast (the fused path forced on the CPU, in the interpreter)."""
    forced = force_fused() if device == "cpu" else contextlib.nullcontext()
    with forced, torch.autocast(device, dtype=torch.bfloat16):
        out = module(x)
    out.backward(grad)


def median_ms(module, x, grad, device: str, repeats: int) -> float:
    """Median ms of `layer_step` over `repeats` steps, after warm-up steps on a GPU (they compile the kernels; the
    interpreter compiles none)."""
    times = []
    warmup = 3 if device == "cuda" else 0
    for step in range(repeats + warmup):
        sync(device)
        start = time.perf_counter()
        layer_step(module, x, grad, device)
        sync(device)
        if step >= warmup:
            times.append(1e3 * (time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


def time_layer(name: str, options: dict, shape: tuple[int, int, int, int], device: str, repeats: int) -> float:
    """Median ms of forward + backward of one layer in bf16 autocast (the fused path forced on the CPU)."""
    batch, n, dim, heads = shape
    module = create_attention(name, dim, heads, **options).to(device)
    x = torch.randn(batch, n, dim, device=device).requires_grad_()
    grad = torch.randn(batch, n, dim, device=device)
    return median_ms(module, x, grad, device, repeats)


def sweep(device: str = "cuda", repeats: int = 10, names: tuple[str, ...] = (), out: Path | None = None) -> dict:
    """Every (variant, configuration, shape) timed, for the feature maps `names` (default: all, in `FEATURES`'
    order); the best configuration per feature map weighs the 1024-px shape fully and the 64K one by a quarter.
    With `out`, the results are written there after each map."""
    shapes = SHAPES if device == "cuda" else CPU_SHAPES
    results: dict = {"device": device, "configs": {}, "sdpa_ms": {}, "best": {}, "env": ""}
    for shape_name, shape in shapes.items():
        results["sdpa_ms"][shape_name] = time_layer("softmax", {}, shape, device, repeats)
    for name in names or tuple(FEATURES):
        variant, options, feature = FEATURES[name]
        rows = results["configs"].setdefault(name, {})
        for config in CONFIGS:
            rows[config] = _time_config(config, variant, options, shapes, device, repeats)
            timed = {c: r for c, r in rows.items() if "error" not in r}
            if timed:
                results["best"][feature] = min(timed, key=lambda c: timed[c]["vit_s_1024"] + timed[c]["64k"] / 4)
            results["env"] = ",".join(f"{feature}={config}" for feature, config in results["best"].items())
            if out is not None:
                write(results, out)
    return results


def _time_config(config: str, variant: str, options: dict, shapes: dict, device: str, repeats: int) -> dict:
    """ms per shape under `ZOO_FUSED_CONFIG=config`, or the error of a configuration that fails to compile."""
    os.environ["ZOO_FUSED_CONFIG"] = config
    try:
        return {s: time_layer(variant, options, shape, device, repeats) for s, shape in shapes.items()}
    except Exception as error:  # noqa: BLE001 - recorded, and the sweep goes on
        return {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    finally:
        os.environ.pop("ZOO_FUSED_CONFIG", None)


def write(results: dict, out: Path) -> None:
    """`kernel_configs.json` / `.md` into `out`, and the `ZOO_FUSED_CONFIG=` line of the maps chosen so far."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_configs.json").write_text(json.dumps(results, indent=1))
    (out / "kernel_configs.md").write_text(markdown(results))
    print(markdown(results), flush=True)
    print(f"ZOO_FUSED_CONFIG={results['env']}", flush=True)


def markdown(results: dict) -> str:
    lines = [
        "# Fused kernel block sizes",
        "",
        f"Forward + backward of one layer on {results['device']}, bf16, ms (median); SDPA: {results['sdpa_ms']}.",
        "",
        "| variant | rows:warps[:dot[:chunk]] | " + " | ".join(SHAPES) + " |",
        "|---|---|" + "---|" * len(SHAPES),
    ]
    for name, rows in results["configs"].items():
        for config, timing in rows.items():
            cells = [timing.get(s, timing.get("error", "-")) for s in SHAPES]
            lines.append(
                f"| {name} | {config} | " + " | ".join(f"{c:.2f}" if isinstance(c, float) else c for c in cells) + " |"
            )
    lines += ["", f"Chosen: `ZOO_FUSED_CONFIG={results['env']}`"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: toy sizes, interpreted")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--maps", nargs="+", choices=tuple(FEATURES), default=(), help="default: all, in this order")
    args = parser.parse_args()
    sweep(args.device, args.repeats, tuple(args.maps), args.out)


if __name__ == "__main__":
    main()
