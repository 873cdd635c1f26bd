"""One benchmark configuration in this process: time, peak memory and error against exact attention.

A sweep (`zoo_bench.sweep`) runs every (variant, length) in a fresh subprocess,
`python -m zoo_bench.measure --single '<json config>'`, which prints one JSON line, so memory peaks never leak
from one configuration into the next. The child builds the whole module (projections included) in train mode
on `x = layer_norm(randn(b, n, c))` and measures:

- forward + backward time: `out.backward(g)` for a fixed random `g`, gradients w.r.t. the parameters and `x`;
  forward time: the forward under `torch.no_grad()`. Both the median of `repeats` runs after `warmup` runs;
  once a configuration has used `budget_s` seconds it stops after the current repeat (at least one).
- peak memory of each phase: on CUDA the allocator's peak (`torch.cuda.max_memory_allocated`, reset first);
  on CPU the child's peak resident set (`VmHWM`, reset through `/proc/self/clear_refs`), and the resident set
  before the phase. `getrusage().ru_maxrss` is only the fallback where /proc has neither: after `exec` it starts
  from the parent's peak, which would hide every small configuration behind the sweep driver's size.
- relative error `||a - b|| / ||b||` of the output (eval mode) against exact softmax attention with the same
  `qkv` / `proj` weights, in float32, on a random sample of query rows: all rows would cost too much at 64K.

A variant that attends on a patch grid (`needs_grid`: `window2d`, `neighborhood`) takes its N tokens as a
sqrt(N) x sqrt(N) grid without prefix tokens; a length that is not a square is refused. `BENCH_OPTIONS` sets its
window to about as many keys per query as `local` sees; `--option` overrides it.

`projections` is the cost floor: the same `qkv` and `proj` layers, attention replaced by identity (out = v).
`peer:<package>` is a peer package's layer at fixed settings (`zoo_bench.peers`).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo._validate import check_int
from zoo.attention import AttentionBase, attention_options, create_attention, get_attention
from zoo.attention._registry import _TIMM_ARGS
from zoo.attention.softmax import softmax_attention

from .peers import NON_CAUSAL_PEERS, PEER_PREFIX, build_peer, peer_weights

__all__ = [
    "BENCH_OPTIONS",
    "DTYPES",
    "PROJECTIONS",
    "SHARED_OPTIONS",
    "STOPPING",
    "PeakMemory",
    "ProjectionsOnly",
    "Settings",
    "build_attention",
    "failure",
    "footprint",
    "grid_options",
    "length_options",
    "measure",
    "needs_grid",
    "own_options",
    "relative_error",
    "single_config",
    "supports_causal",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PROJECTIONS = "projections"
# Statuses after which longer sequences of the same variant are not tried: they would fail the same way.
STOPPING = ("oom", "timeout", "crashed")
# timm's shared arguments, settable per variant; device and dtype are the benchmark's own.
SHARED_OPTIONS = frozenset(_TIMM_ARGS - {"device", "dtype"})
# The benchmark's defaults under the user's options: the 2-D windows at 23 x 23 = 529 keys per query, about
# `local`'s 2 x 256 + 1 = 513 (the variants' own defaults, SAM's 14 x 14 and NAT's 7 x 7, see far fewer).
BENCH_OPTIONS: dict[str, dict[str, Any]] = {"window2d": {"window": 23}, "neighborhood": {"kernel": 23}}


@dataclass
class Settings:
    """What every configuration of a sweep shares; the defaults are those of the speed targets (on CPU)."""

    batch: int = 1
    dim: int = 512
    heads: int = 8
    dtype: str = "fp32"
    device: str = "cpu"
    threads: int = 2
    repeats: int = 3
    warmup: int = 1
    causal: bool = False
    error_rows: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "dim", "heads", "threads", "repeats", "error_rows", "warmup"):
            check_int(name, getattr(self, name), 0 if name == "warmup" else 1)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device {self.device!r} is not 'cpu' or 'cuda'")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for but torch.cuda.is_available() is False")


class ProjectionsOnly(AttentionBase):
    """The cost floor: timm's `qkv` and `proj` layers with the attention replaced by identity (out = v)."""

    supports_causal = True
    attention_name = PROJECTIONS

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        return v


def own_options(name: str) -> dict[str, Any]:
    """A registered variant's own options and defaults; `{}` for `projections`, a peer or an unknown name."""
    try:
        return attention_options(name)
    except ValueError:
        return {}


def needs_grid(name: str) -> bool:
    """Whether `name` is a registered variant that attends on a patch grid (`needs_grid`)."""
    try:
        return get_attention(name).needs_grid
    except ValueError:
        return False


def grid_options(name: str, length: int, options: dict[str, Any]) -> dict[str, Any]:
    """`options` of grid variant `name` at `length` tokens: the tokens after `num_prefix_tokens` (default 0) as a
    square `grid_size`, unless `options` sets one. ValueError when they are not a square."""
    prefix = check_int("num_prefix_tokens", options.get("num_prefix_tokens", 0), 0)
    if "grid_size" in options:
        return {"num_prefix_tokens": prefix, **options}
    cells = length - prefix
    side = math.isqrt(max(cells, 0))
    if side * side == cells > 0:
        return {**options, "grid_size": [side, side], "num_prefix_tokens": prefix}
    tokens = f"N={length:,}" + (f" less num_prefix_tokens={prefix} = {cells:,}" if prefix else "")
    if cells < 1:
        raise ValueError(f"{name!r} needs a patch grid, and {tokens} leaves no patches")
    plus = f"{prefix} + " if prefix else ""
    nearest = " and ".join(f"N={prefix + s * s:,} ({plus}{s} x {s})" for s in (side, side + 1) if s > 0)
    raise ValueError(
        f"{name!r} takes N tokens as a square patch grid; {tokens} is not a square, the nearest: {nearest}"
    )


def length_options(name: str, length: int, options: dict[str, Any]) -> dict[str, Any]:
    """`options` over the benchmark's defaults (`BENCH_OPTIONS`), at `length` tokens: `max_seq_len` set to `length`
    for a variant that has one and was not given it, and a grid variant's square grid (`grid_options`)."""
    options = {**BENCH_OPTIONS.get(name, {}), **options}
    if "max_seq_len" in own_options(name) and "max_seq_len" not in options:
        options["max_seq_len"] = length
    return grid_options(name, length, options) if needs_grid(name) else options


def footprint(name: str, options: dict[str, Any], causal: bool = False) -> str | None:
    """The keys per query of a windowed variant (`local`, `window2d`, `neighborhood`) at `options` over its
    defaults, for the report's notes; None for the others."""
    if name not in ("local", "window2d", "neighborhood"):
        return None
    resolved = {**own_options(name), **options}
    if name == "local":
        window = resolved["window"]
        side = f"{window} behind = {window + 1}" if causal else f"{window} each side = {2 * window + 1}"
        return f"local: window {side} keys per query"
    if name == "window2d":
        window, shift = resolved["window"], resolved["shift"]
        shifted = f", shifted by {shift}" if shift else ""
        return (
            f"window2d: {window} x {window} windows{shifted} = {window * window} keys per query (fewer in a window "
            f"cut by the grid's edge: a side that is not a multiple of {window} is padded)"
        )
    kernel, dilation = resolved["kernel"], resolved["dilation"]
    dilated = f", dilation {dilation}" if dilation > 1 else ""
    return f"neighborhood: kernel {kernel} x {kernel}{dilated} = {kernel * kernel} keys per query"


def build_attention(name: str, dim: int, heads: int, length: int, causal: bool, options: dict[str, Any]) -> nn.Module:
    """The module that `name` stands for, at `length` (a peer may fix its length at construction)."""
    if name == PROJECTIONS:
        return ProjectionsOnly(dim, heads, **options)
    if name.startswith(PEER_PREFIX):
        if options:
            raise ValueError(f"peer layer {name!r} takes no options, got {options}")
        return build_peer(name[len(PEER_PREFIX) :], dim, heads, length, causal)
    return create_attention(name, dim, heads, **options)


def supports_causal(name: str) -> bool:
    """Whether `name` (a registered variant, `projections` or a peer) has a causal mode."""
    if name.startswith(PEER_PREFIX):
        return name[len(PEER_PREFIX) :] not in NON_CAUSAL_PEERS
    return name == PROJECTIONS or get_attention(name).supports_causal


def single_config(
    variant: str, length: int, settings: Settings, options: dict[str, Any] | None = None, budget_s: float = 120.0
) -> dict[str, Any]:
    """One configuration, JSON-able, as the child receives it."""
    config = {"variant": variant, "length": length, "options": length_options(variant, length, options or {})}
    return {**config, "budget_s": budget_s, "settings": asdict(settings)}


def _proc_status_bytes(key: str) -> int | None:
    status = Path("/proc/self/status")
    for line in status.read_text().splitlines() if status.exists() else []:
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None


class PeakMemory:
    """Peak memory of one phase: `reset()` before it, `read()` after -> (baseline MiB, peak MiB)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0
        # CUDA's peak always resets; the CPU's where /proc/self/clear_refs takes "5" (Linux >= 4.0)
        self.resettable = device.type == "cuda"

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        try:
            # give freed heap back first, so the baseline is what is live
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            Path("/proc/self/clear_refs").write_text("5")
            self.resettable = True
        except (OSError, AttributeError):
            self.resettable = False
        rss = _proc_status_bytes("VmRSS")
        if rss is None:
            import psutil

            rss = psutil.Process().memory_info().rss
        self.baseline = rss

    def read(self) -> tuple[float, float]:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _proc_status_bytes("VmHWM")
            if peak is None:
                import resource

                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return self.baseline / 2**20, peak / 2**20


def _run_phase(step: Callable[[], Any], settings: Settings, deadline: float, device: torch.device) -> dict[str, Any]:
    """Warm up, then time `step` up to `repeats` times (no more once past `deadline`) -> times and memory."""
    memory = PeakMemory(device)
    memory.reset()
    times = []
    for index in range(settings.warmup + settings.repeats):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= settings.warmup:
            times.append(time.perf_counter() - start)
            if time.perf_counter() > deadline:
                break
    baseline, peak = memory.read()
    return {"times": times, "baseline": baseline, "peak": peak, "resettable": memory.resettable}


def _time_and_memory(module: nn.Module, x: Tensor, grad: Tensor, settings: Settings, deadline: float) -> dict:
    leaves = [p for p in module.parameters() if p.requires_grad] + [x]

    def forward_backward() -> None:
        for tensor in leaves:
            tensor.grad = None
        module(x, is_causal=settings.causal).backward(grad)

    def forward() -> None:
        with torch.no_grad():
            module(x, is_causal=settings.causal)

    # forward + backward first: its baseline is the clean one where the CPU peak cannot be reset
    train = _run_phase(forward_backward, settings, deadline, x.device)
    for tensor in leaves:
        tensor.grad = None
    infer = _run_phase(forward, settings, deadline, x.device)
    return {
        "fwd_bwd_s": statistics.median(train["times"]),
        "fwd_s": statistics.median(infer["times"]),
        "fwd_bwd_times": train["times"],
        "fwd_times": infer["times"],
        "baseline_mib": round(train["baseline"], 1),
        "peak_mib": round(train["peak"], 1),
        "extra_mib": round(train["peak"] - train["baseline"], 1),
        "fwd_baseline_mib": round(infer["baseline"], 1),
        "fwd_peak_mib": round(infer["peak"], 1) if infer["resettable"] else None,
    }


def relative_error(module: nn.Module, x: Tensor, settings: Settings, options: dict[str, Any]) -> tuple[float, int]:
    """`||out - exact|| / ||exact||` on `error_rows` random query rows; exact: float32 softmax, same weights."""
    weights = module.state_dict() if isinstance(module, AttentionBase) else peer_weights(module)
    shared = {k: v for k, v in options.items() if k in SHARED_OPTIONS}
    reference = create_attention("softmax", settings.dim, settings.heads, **shared).to(x.device).eval()
    missing, _ = reference.load_state_dict(weights, strict=False)
    if missing:
        raise ValueError(f"weights {missing} do not copy from {type(module).__name__} into softmax")
    length = x.shape[1]
    generator = torch.Generator().manual_seed(settings.seed + 2)
    rows = torch.randperm(length, generator=generator)[: settings.error_rows].sort().values.to(x.device)
    module.eval()
    with torch.no_grad():
        out = module(x, is_causal=settings.causal)[:, rows].float()
        x32 = x.detach().float()
        q, k, v = reference.project_qkv(x32)
        # sampled query row i sees keys j <= i
        keep = torch.arange(length, device=x.device) <= rows[:, None] if settings.causal else None
        exact = reference.project_out(softmax_attention(q[:, :, rows], k, v, keep, scale=reference.scale), x32[:, rows])
    return ((out - exact).norm() / exact.norm()).item(), len(rows)


def failure(error: BaseException) -> dict[str, str]:
    """`{"status": "oom" | "error", "message": "<type>: <first line>"}` for an exception of a configuration."""
    text = str(error).strip()
    oom = isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())
    )
    first = text.splitlines()[0] if text else ""
    return {"status": "oom" if oom else "error", "message": f"{type(error).__name__}: {first}"[:1000]}


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this process -> its record: status "ok", or the failure and its message."""
    start = time.perf_counter()
    settings = Settings(**config["settings"])
    variant, length, options = config["variant"], config["length"], config["options"]
    record: dict[str, Any] = {"variant": variant, "length": length, "options": options, "status": "ok"}
    torch.set_num_threads(settings.threads)
    device, dtype = torch.device(settings.device), DTYPES[settings.dtype]
    # any failure is recorded: one configuration never ends a sweep
    try:
        torch.manual_seed(settings.seed)
        module = build_attention(variant, settings.dim, settings.heads, length, settings.causal, options)
        module = module.to(device=device, dtype=dtype).train()
        generator = torch.Generator(device).manual_seed(settings.seed + 1)
        shape = (settings.batch, length, settings.dim)
        x = F.layer_norm(torch.randn(shape, generator=generator, device=device), shape[-1:])
        x = x.to(dtype).requires_grad_()
        grad = torch.randn(shape, generator=generator, device=device).to(dtype)
        record.update(_time_and_memory(module, x, grad, settings, start + config["budget_s"]))
    except Exception as error:  # noqa: BLE001
        return {**record, **failure(error), "elapsed_s": round(time.perf_counter() - start, 3)}
    # timings without an error figure are still a record (a peer whose weights have no exact reference)
    try:
        record["rel_error"], record["error_rows"] = relative_error(module, x, settings, options)
    except Exception as error:  # noqa: BLE001
        record.update(rel_error=None, rel_error_message=failure(error)["message"])
    return {**record, "elapsed_s": round(time.perf_counter() - start, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run one benchmark configuration; prints its record as JSON.")
    parser.add_argument("--single", required=True, metavar="JSON", help="a configuration from single_config()")
    args = parser.parse_args(argv)
    print(json.dumps(measure(json.loads(args.single))), flush=True)


if __name__ == "__main__":
    main()
