"""Time, memory and accuracy of attention variants against sequence length; `tools/benchmark.py` is the CLI.

Every (variant, length) runs in a fresh subprocess (`python -m zoo.benchmark --single '<json config>'`, which
prints one JSON line), so memory peaks never leak from one configuration into the next, and a crash,
out-of-memory or timeout of the child is recorded without ending the sweep. The child builds the whole module
(projections included) in train mode on `x = layer_norm(randn(b, n, c))` and measures:

- forward + backward time: `out.backward(g)` for a fixed random `g`, gradients w.r.t. the parameters and `x`;
  forward time: the forward under `torch.no_grad()`. Both the median of `repeats` runs after `warmup` runs;
  once a configuration has used `budget_s` seconds it stops after the current repeat (at least one).
- peak memory of each phase: on CUDA the allocator's peak (`torch.cuda.max_memory_allocated`, reset first);
  on CPU the child's peak resident set (`VmHWM`, reset through `/proc/self/clear_refs`), and the resident set
  before the phase. `getrusage().ru_maxrss` is only the fallback where /proc has neither: after `exec` it starts
  from the parent's peak, which would hide every small configuration behind the sweep driver's size.
- relative error `||a - b|| / ||b||` of the output (eval mode) against exact softmax attention with the same
  `qkv` / `proj` weights, in float32, on a random sample of query rows: all rows would cost too much at 64K.

`projections` is the cost floor: the same `qkv` and `proj` layers, attention replaced by identity (out = v).
`peer:<package>` times a peer package's layer at fixed settings when it is installed (never a dependency).
"""
from __future__ import annotations

import argparse
import ctypes
import difflib
import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn

from . import __version__
from .attention import AttentionBase, attention_options, create_attention, get_attention, list_attentions
from .attention._registry import _TIMM_ARGS
from .attention.softmax import softmax_attention

__all__ = [
    "PEERS",
    "ProjectionsOnly",
    "Settings",
    "build_attention",
    "check_variants",
    "default_device",
    "device_slug",
    "find_crossover",
    "fit_slope",
    "measure",
    "parse_options",
    "peer_weights",
    "run_config",
    "run_sweep",
    "single_config",
    "summarize",
    "write_report",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_LENGTHS = (1024, 4096, 16384, 65536)
PROJECTIONS = "projections"
PEER_PREFIX = "peer:"
# The log-log slope of forward + backward time is fitted over the measured lengths in this range (inclusive).
SLOPE_RANGE = (4096, 65536)
# After one of these, longer sequences of the same variant are not tried: they would fail the same way.
STOPPING = ("oom", "timeout", "crashed")
# timm's shared arguments, settable per variant; device and dtype are the benchmark's own.
SHARED_OPTIONS = frozenset(_TIMM_ARGS - {"device", "dtype"})


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
            value, least = getattr(self, name), 0 if name == "warmup" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
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

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool) -> Tensor:
        return v


class PeerAttention(nn.Module):
    """A peer package's self-attention layer `[b, n, c] -> [b, n, c]` behind zoo's forward signature."""

    def __init__(self, layer: nn.Module, causal: bool) -> None:
        super().__init__()
        self.layer = layer
        self.causal = causal

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False) -> Tensor:
        if attn_mask is not None or is_causal != self.causal:
            raise ValueError(f"this peer layer was built with causal={self.causal} and takes no attn_mask")
        return self.layer(x)


class LocalAttentionPeer(AttentionBase):
    """zoo's `qkv` / `proj` around local-attention's `LocalAttention`: windows of 256, one back, one ahead."""

    supports_causal = True

    def __init__(self, dim: int, num_heads: int = 8, *, causal: bool = False) -> None:
        from local_attention import LocalAttention

        super().__init__(dim, num_heads)
        self.causal = causal
        self.local = LocalAttention(256, causal=causal, look_backward=1, look_forward=int(not causal), autopad=True)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool) -> Tensor:
        if is_causal != self.causal or mask is not None:
            raise ValueError(f"this peer layer was built with causal={self.causal} and takes no attn_mask")
        return self.local(q, k, v)


def _build_peer(package: str, dim: int, heads: int, length: int, causal: bool) -> nn.Module:
    """A peer package's layer at the comparison's settings (linformer needs the length it is built for)."""
    if causal and package in NON_CAUSAL_PEERS:
        raise ValueError(f"{package} has no causal mode")
    if package == "performer-pytorch":
        from performer_pytorch import SelfAttention

        layer = SelfAttention(dim, heads=heads, dim_head=dim // heads, nb_features=256, causal=causal)
        return PeerAttention(layer, causal)
    if package == "linformer":
        from linformer import LinformerSelfAttention

        return PeerAttention(LinformerSelfAttention(dim, seq_len=length, k=256, heads=heads), causal)
    if package == "nystrom-attention":
        from nystrom_attention import NystromAttention

        return PeerAttention(NystromAttention(dim, dim_head=dim // heads, heads=heads, num_landmarks=256), causal)
    if package == "reformer-pytorch":
        from reformer_pytorch import LSHSelfAttention

        return PeerAttention(LSHSelfAttention(dim, heads=heads, bucket_size=64, n_hashes=4, causal=causal), causal)
    return LocalAttentionPeer(dim, heads, causal=causal)


# Peer package -> its import name.
PEERS = {
    "performer-pytorch": "performer_pytorch",
    "linformer": "linformer",
    "nystrom-attention": "nystrom_attention",
    "local-attention": "local_attention",
    "reformer-pytorch": "reformer_pytorch",
}
NON_CAUSAL_PEERS = ("linformer", "nystrom-attention")
# The zoo variant each peer package is compared with, at the peer's settings.
PEER_VARIANTS = {
    "performer-pytorch": "performer",
    "linformer": "linformer",
    "nystrom-attention": "nystrom",
    "local-attention": "local",
    "reformer-pytorch": "reformer",
}


def check_variants(names: list[str]) -> None:
    """ValueError for a name that is not a registered variant, `projections` or `peer:<package>`."""
    known = [*list_attentions(), PROJECTIONS, *(PEER_PREFIX + peer for peer in PEERS)]
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise ValueError(f"unknown variant {name!r}{hint}; known: {', '.join(known)}")


def parse_options(items: list[str], variants: list[str]) -> dict[str, dict[str, Any]]:
    """`["performer.nb_features=256", ...]` -> `{"performer": {"nb_features": 256}}`, values by yaml.safe_load."""
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, equals, raw = item.partition("=")
        variant, dot, option = key.partition(".")
        if not (equals and dot and variant and option):
            raise ValueError(f"option {item!r} is not VARIANT.KEY=VALUE (e.g. performer.nb_features=256)")
        if variant not in variants:
            raise ValueError(f"option {item!r} is for {variant!r}, which is not benchmarked: {', '.join(variants)}")
        if variant.startswith(PEER_PREFIX):
            raise ValueError(f"option {item!r}: peer layers are timed at fixed settings and take no options")
        allowed = sorted(SHARED_OPTIONS | (set() if variant == PROJECTIONS else set(attention_options(variant))))
        if option not in allowed:
            close = difflib.get_close_matches(option, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{variant!r} has no option {option!r}{hint}; its options: {', '.join(allowed)}")
        options.setdefault(variant, {})[option] = yaml.safe_load(raw)
    return options


def _own_options(name: str) -> dict[str, Any]:
    try:
        return attention_options(name)
    except ValueError:
        return {}


def length_options(name: str, length: int, options: dict[str, Any]) -> dict[str, Any]:
    """`options`, with `max_seq_len` set to `length` for a variant that has one and was not given it."""
    if "max_seq_len" in _own_options(name) and "max_seq_len" not in options:
        return {**options, "max_seq_len": length}
    return dict(options)


def build_attention(name: str, dim: int, heads: int, length: int, causal: bool, options: dict[str, Any]) -> nn.Module:
    """The module that `name` stands for, at `length` (a peer may fix its length at construction)."""
    if name == PROJECTIONS:
        return ProjectionsOnly(dim, heads, **options)
    if name.startswith(PEER_PREFIX):
        check_variants([name])
        if options:
            raise ValueError(f"peer layer {name!r} takes no options, got {options}")
        return _build_peer(name[len(PEER_PREFIX):], dim, heads, length, causal)
    return create_attention(name, dim, heads, **options)


def _supports_causal(name: str) -> bool:
    if name.startswith(PEER_PREFIX):
        return name[len(PEER_PREFIX):] not in NON_CAUSAL_PEERS
    return name == PROJECTIONS or get_attention(name).supports_causal


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=None)
def device_name(device: str) -> str:
    """The GPU's name, or the CPU model."""
    if device == "cuda":
        # asked in a child: a CUDA context in the sweep's process would hold GPU memory the configurations need
        code = "import torch; print(torch.cuda.get_device_name())"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def device_slug(device: str) -> str:
    """The results folder: `cpu`, or the GPU's name as a slug (`nvidia-h100-80gb-hbm3`)."""
    return "cpu" if device == "cpu" else re.sub(r"[^a-z0-9]+", "-", device_name(device).lower()).strip("-")


def single_config(
    variant: str, length: int, settings: Settings, options: Optional[dict[str, Any]] = None, budget_s: float = 120.0
) -> dict[str, Any]:
    """One configuration, JSON-able, as the child receives it."""
    config = {"variant": variant, "length": length, "options": length_options(variant, length, options or {})}
    return {**config, "budget_s": budget_s, "settings": asdict(settings)}


def _proc_status_bytes(key: str) -> Optional[int]:
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


def peer_weights(module: nn.Module) -> dict[str, Tensor]:
    """A peer layer's q, k, v and output projections under timm's names (`qkv`, `proj`), so that exact attention
    with the peer's own weights is its reference, as zoo's weights are zoo's.

    performer-pytorch and linformer keep `to_q`, `to_k`, `to_v`, `to_out`; nystrom-attention a fused `to_qkv` and
    `to_out[0]`. reformer-pytorch shares one projection between queries and keys: it has no such reference.
    """
    layer = getattr(module, "layer", module)
    if hasattr(layer, "to_qkv"):
        inputs, output = [layer.to_qkv], layer.to_out[0]
    elif all(hasattr(layer, name) for name in ("to_q", "to_k", "to_v")):
        inputs, output = [layer.to_q, layer.to_k, layer.to_v], layer.to_out
    else:
        raise ValueError(f"{type(layer).__name__} has no separate q / k / v projections to copy into exact attention")
    if any(linear.bias is not None for linear in inputs):
        raise ValueError(f"{type(layer).__name__} has q / k / v biases; the exact reference has none")
    weights = {"qkv.weight": torch.cat([linear.weight for linear in inputs]), "proj.weight": output.weight}
    return weights if output.bias is None else {**weights, "proj.bias": output.bias}


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


def _failure(error: BaseException) -> dict[str, str]:
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
    except Exception as error:
        return {**record, **_failure(error), "elapsed_s": round(time.perf_counter() - start, 3)}
    try:
        record["rel_error"], record["error_rows"] = relative_error(module, x, settings, options)
    except Exception as error:
        record.update(rel_error=None, rel_error_message=_failure(error)["message"])
    return {**record, "elapsed_s": round(time.perf_counter() - start, 3)}


def run_config(config: dict[str, Any], timeout: float, isolate: bool = True) -> dict[str, Any]:
    """One configuration in a fresh subprocess -> its record, `wall_s` added; failures are recorded, not raised.

    `isolate=False` runs it in this process instead (quick checks; its memory peaks include this process's).
    """
    head = {"variant": config["variant"], "length": config["length"], "options": config["options"]}
    start = time.perf_counter()
    if not isolate:
        threads = torch.get_num_threads()
        try:
            return {**measure(config), "wall_s": round(time.perf_counter() - start, 3)}
        finally:
            torch.set_num_threads(threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(config["settings"]["threads"]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH"))))
    command = [sys.executable, "-m", "zoo.benchmark", "--single", json.dumps(config)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        wall = round(time.perf_counter() - start, 3)
        return {**head, "status": "timeout", "message": f"killed after {timeout:g} s", "wall_s": wall}
    wall = round(time.perf_counter() - start, 3)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return {**json.loads(lines[-1]), "wall_s": wall}
    tail = " | ".join(proc.stderr.strip().splitlines()[-5:])[-1000:]
    if proc.returncode < 0:
        hint = " (the kernel's out-of-memory killer?)" if proc.returncode == -signal.SIGKILL else ""
        message = f"killed by {signal.Signals(-proc.returncode).name}{hint}; {tail}"
    else:
        message = f"exit code {proc.returncode} without a result; {tail}"
    return {**head, "status": "crashed", "message": message, "wall_s": wall}


def stop_reason(record: dict[str, Any], max_seconds: float) -> Optional[str]:
    """Why longer sequences of this variant are not tried after `record`, or None."""
    if record["status"] in STOPPING:
        return f"{record['status']} at N={record['length']:,}"
    # the child's own time: interpreter start-up is the same at every length
    took = record.get("elapsed_s", record.get("wall_s", 0.0))
    if took > max_seconds:
        return f"N={record['length']:,} took {took:.3g} s > max-seconds {max_seconds:g}"
    return None


def _sweep_variants(variants: list[str]) -> tuple[list[str], list[str]]:
    """Sweep order (softmax, projections, then as asked) and notes on peers that are not installed."""
    names = list(dict.fromkeys(variants))
    ordered = [v for v in ("softmax",) if v in names] + [PROJECTIONS]
    ordered += [v for v in names if v not in ordered]
    kept, notes = [], []
    for name in ordered:
        module = PEERS.get(name[len(PEER_PREFIX):]) if name.startswith(PEER_PREFIX) else None
        if module is not None and importlib.util.find_spec(module) is None:
            notes.append(f"{name} not timed: {module} is not installed (pip install {name[len(PEER_PREFIX):]})")
        else:
            kept.append(name)
    return kept, notes


def metadata(settings: Settings, names: list[str], **extra: Any) -> dict[str, Any]:
    """Device, package versions, settings and date of a sweep; `extra` added as is."""
    versions = {"python": platform.python_version(), "torch": torch.__version__, "zoo": __version__}
    for package in ["timm", "einops", "numpy"] + [n[len(PEER_PREFIX):] for n in names if n.startswith(PEER_PREFIX)]:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    cuda = settings.device == "cuda"
    meta = {
        "device": settings.device,
        "device_name": device_name(settings.device),
        "versions": versions,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": asdict(settings),
        "head_dim": settings.dim // settings.heads,
        "cpu_count": os.cpu_count(),
        "memory": "CUDA allocator peak" if cuda else "peak resident set (VmHWM)",
    }
    if cuda:
        meta.update(cuda=torch.version.cuda, flash_sdp_enabled=torch.backends.cuda.flash_sdp_enabled())
    return {**meta, **extra}


def run_sweep(
    variants: list[str],
    lengths: list[int],
    out_dir: Path | str,
    settings: Optional[Settings] = None,
    *,
    options: Optional[dict[str, dict[str, Any]]] = None,
    max_seconds: float = 120.0,
    timeout: Optional[float] = None,
    command: Optional[str] = None,
    isolate: bool = True,
    merge: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Time every variant, and `projections`, at every length; writes the report to `out_dir` and returns it.

    With `merge`, the records of an earlier sweep in `out_dir` (same settings) are kept, except those this sweep
    measures again, so a few variants can be re-measured without repeating the whole sweep.

    Lengths run in increasing order. After a configuration that runs out of memory, times out (`timeout`, default
    10 x `max_seconds`), crashes, or takes longer than `max_seconds`, the longer ones of that variant are recorded
    as skipped. An unknown variant, or one without a causal mode in a causal sweep, is an error at every length.
    """
    settings = settings or Settings()
    options = options or {}
    timeout = 10 * max_seconds if timeout is None else timeout
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length {length!r} must be an integer >= 1")
    lengths = sorted(set(lengths))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names, notes = _sweep_variants(variants)
    fitted = [n for n in names if "max_seq_len" in _own_options(n) and "max_seq_len" not in options.get(n, {})]
    if fitted:
        notes.append(f"max_seq_len set to each length N for {', '.join(fitted)}")
    meta = metadata(
        settings, names, command=command or " ".join(sys.argv), lengths=lengths, options=options,
        max_seconds=max_seconds, timeout=timeout, isolated=isolate, notes=notes,
    )
    earlier = _earlier_records(out_dir, meta, {(name, length) for name in names for length in lengths}) if merge else []
    results: dict[str, Any] = {"metadata": meta, "records": earlier, "summary": {}}
    for note in notes:
        log(note)
    for name in names:
        try:
            check_variants([name])
            problem = None if _supports_causal(name) or not settings.causal else f"{name!r} has no causal mode"
        except ValueError as error:
            problem = str(error)
        stop = None
        for length in lengths:
            if problem or stop:
                status, message = ("error", f"ValueError: {problem}") if problem else ("skipped", stop)
                record = {"variant": name, "length": length, "options": options.get(name, {}), "status": status}
                record["message"] = message
            else:
                config = single_config(name, length, settings, options.get(name), budget_s=max_seconds)
                record = run_config(config, timeout, isolate)
                stop = stop_reason(record, max_seconds)
            record["date"] = meta["date"]
            results["records"].append(record)
            log(_describe(record))
            (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    results["summary"] = summarize(results["records"])
    write_report(results, out_dir)
    return results


def _earlier_records(out_dir: Path, meta: dict[str, Any], remeasured: set[tuple[str, int]]) -> list[dict[str, Any]]:
    """The records of the sweep saved in `out_dir` that this one does not measure again (for `merge`)."""
    path = out_dir / "results.json"
    if not path.is_file():
        return []
    earlier = json.loads(path.read_text())
    if earlier["metadata"]["settings"] != meta["settings"]:
        raise ValueError(
            f"cannot merge into {path}: its settings {earlier['metadata']['settings']} differ from {meta['settings']}"
        )
    date = earlier["metadata"]["date"]
    kept = [r for r in earlier["records"] if (r["variant"], r["length"]) not in remeasured]
    meta["merged_from"] = [*earlier["metadata"].get("merged_from", []), earlier["metadata"]["command"]]
    meta["lengths"] = sorted({*meta["lengths"], *earlier["metadata"]["lengths"]})
    # the packages of both sweeps (peers measured only in the earlier one included)
    meta["versions"] = {**earlier["metadata"]["versions"], **meta["versions"]}
    return [{"date": date, **record} for record in kept]


def _describe(record: dict[str, Any]) -> str:
    where = f"{record['variant']} N={record['length']}"
    if record["status"] != "ok":
        return f"{where}: {record['status']}: {record.get('message', '')}"
    error = "n/a" if record.get("rel_error") is None else f"{record['rel_error']:.2e}"
    return (
        f"{where}: fwd+bwd {record['fwd_bwd_s']:.4g} s, fwd {record['fwd_s']:.4g} s, peak {record['peak_mib']:.0f} MiB "
        f"(+{record['extra_mib']:.0f}), rel error {error} [{record['wall_s']:.1f} s]"
    )


def fit_slope(
    lengths: list[int], times: list[float], low: int = SLOPE_RANGE[0], high: int = SLOPE_RANGE[1]
) -> Optional[float]:
    """Least-squares slope of log(time) against log(length) over lengths in [low, high]; None below 2 lengths."""
    pairs = zip(lengths, times, strict=True)
    points = [(math.log(n), math.log(t)) for n, t in pairs if low <= n <= high and t is not None and t > 0]
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return covariance / sum((x - mean_x) ** 2 for x, _ in points)


def find_crossover(
    times: dict[int, float], baseline: dict[int, float], baseline_failed: Optional[dict[int, str]] = None
) -> dict[str, Any]:
    """The length from which `times` beats `baseline`, log-log interpolated between measured lengths.

    `times`, `baseline`: length -> seconds, where measured; `baseline_failed`: length -> status where the baseline
    did not run (out of memory, skipped): the variant wins there. -> `{"length": float or None, "text": str}`.
    """
    baseline_failed = baseline_failed or {}
    previous = None
    for n in sorted(times):
        if n in baseline_failed:
            return {"length": float(n), "text": f"<= {n:,} (softmax: {baseline_failed[n]} at {n:,})"}
        if n not in baseline:
            continue
        ratio = times[n] / baseline[n]
        if ratio < 1 and previous is None:
            return {"length": float(n), "text": f"<= {n:,} (faster at every length measured)"}
        if ratio < 1:
            n0, r0 = previous
            log_n = math.log(n0) - math.log(r0) * (math.log(n) - math.log(n0)) / (math.log(ratio) - math.log(r0))
            return {"length": math.exp(log_n), "text": f"~{math.exp(log_n):,.0f}"}
        previous = (n, ratio)
    if previous is None:
        return {"length": None, "text": "not measured"}
    return {"length": None, "text": f"> {previous[0]:,} (slower at every length measured)"}


def _series(records: list[dict[str, Any]], name: str, key: str) -> dict[int, float]:
    return {
        r["length"]: r[key] for r in records if r["variant"] == name and r["status"] == "ok" and r.get(key) is not None
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: the fitted slope of forward + backward time, and the crossover against softmax."""
    names = list(dict.fromkeys(r["variant"] for r in records))
    softmax = _series(records, "softmax", "fwd_bwd_s")
    failed = {r["length"]: r["status"] for r in records if r["variant"] == "softmax" and r["status"] != "ok"}
    failed = {n: status for n, status in failed.items() if status in (*STOPPING, "skipped")}
    summary = {}
    for name in names:
        times = _series(records, name, "fwd_bwd_s")
        lengths = sorted(times)
        summary[name] = {
            "slope": fit_slope(lengths, [times[n] for n in lengths]),
            "slope_lengths": [n for n in lengths if SLOPE_RANGE[0] <= n <= SLOPE_RANGE[1]],
        }
        if name not in ("softmax", PROJECTIONS) and "softmax" in names:
            summary[name]["crossover"] = find_crossover(times, softmax, failed)
    return summary


_SHORT = {"oom": "OOM", "timeout": "timeout", "crashed": "crash", "skipped": "skip", "error": "error"}


def _table(names: list[str], lengths: list[int], cell: Callable[[str, int], str], extra=None) -> list[str]:
    """Markdown table, variant rows x length columns; `extra`: (title, variant -> str) for a last column."""
    header = ["variant", *(f"{n:,}" for n in lengths)] + ([extra[0]] if extra else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        cells = [f"`{name}`", *(cell(name, n) for n in lengths)] + ([extra[1](name)] if extra else [])
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def write_markdown(results: dict[str, Any], path: Path) -> None:
    meta, records, summary = results["metadata"], results["records"], results["summary"]
    settings = meta["settings"]
    names = list(dict.fromkeys(r["variant"] for r in records))
    lengths = sorted({r["length"] for r in records})
    by = {(r["variant"], r["length"]): r for r in records}

    def value(key: str, fmt: str) -> Callable[[str, int], str]:
        def cell(name: str, n: int) -> str:
            record = by.get((name, n), {"status": ""})
            if record["status"] != "ok":
                return _SHORT.get(record["status"], record["status"])
            return "n/a" if record.get(key) is None else format(record[key], fmt)

        return cell

    def ratio(numerator: str, denominator: str) -> Callable[[str, int], str]:
        def cell(name: str, n: int) -> str:
            a, b = by.get((numerator or name, n), {}), by.get((denominator or name, n), {})
            return f"{a['fwd_bwd_s'] / b['fwd_bwd_s']:.3g}" if a.get("status") == b.get("status") == "ok" else ""

        return cell

    def slope(name: str) -> str:
        fitted = summary.get(name, {}).get("slope")
        return "" if fitted is None else f"{fitted:.2f}"

    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    lines = [
        f"# Attention benchmark: {meta['device_name']}",
        "",
        f"{meta['date']}; {versions}.",
        (
            f"Batch {settings['batch']}, dim {settings['dim']}, {settings['heads']} heads x {meta['head_dim']}, "
            f"{settings['dtype']}, {'causal' if settings['causal'] else 'non-causal'}, threads: {settings['threads']}; "
            f"the whole module (qkv and proj included); median of {settings['repeats']} runs after "
            f"{settings['warmup']} warm-up; each configuration in "
            f"{'a fresh process' if meta['isolated'] else 'the sweep process'}. Command: `{meta['command']}`"
        ),
        *[f"Merged with the earlier records of `{command}`." for command in meta.get("merged_from", [])],
        "",
        "## Forward + backward time (s)",
        "",
        (
            "Gradients w.r.t. the parameters and the input. Slope: least-squares fit of log time against log N over "
            f"{SLOPE_RANGE[0]:,} <= N <= {SLOPE_RANGE[1]:,}."
        ),
        "",
        *_table(names, lengths, value("fwd_bwd_s", ".4g"), ("slope", slope)),
        "## Forward time (s), under torch.no_grad",
        "",
        *_table(names, lengths, value("fwd_s", ".4g")),
        f"## Peak memory, forward + backward (MiB): {meta['memory']}",
        "",
        *_table(names, lengths, value("peak_mib", ".0f")),
        "## Memory above the baseline before the run, forward + backward (MiB)",
        "",
        *_table(names, lengths, value("extra_mib", ".0f")),
        f"## Relative error against exact softmax ({settings['error_rows']} sampled query rows)",
        "",
        (
            "||out - exact|| / ||exact||, exact: float32 softmax attention with the variant's qkv / proj weights. A "
            "variant that forms its keys differently (reformer's shared QK) differs by construction, not only by "
            "approximation."
        ),
        "",
        *_table(names, lengths, value("rel_error", ".2e")),
    ]
    if "softmax" in names:
        lines += ["## Speedup against softmax (softmax's forward + backward time / the variant's)", ""]
        lines += _table(names, lengths, ratio("softmax", ""))
        lines += ["## Crossover against softmax (forward + backward)", ""]
        if meta["device"] == "cuda" and settings["dtype"] in ("bf16", "fp16"):
            lines += ["softmax runs through SDPA, which takes its flash kernel at this dtype.", ""]
        lines += ["| variant | crossover N |", "|---|---|"]
        lines += [f"| `{n}` | {summary[n]['crossover']['text']} |" for n in names if "crossover" in summary.get(n, {})]
        lines += [""]
    lines += ["## Time relative to projections (forward + backward time / that of the projections alone)", ""]
    lines += _table(names, lengths, ratio("", PROJECTIONS))
    lines += _peer_tables(names, lengths, by)
    failures = [r for r in records if r["status"] != "ok" or r.get("rel_error_message")]
    if failures or meta.get("notes"):
        lines += ["## Failures, skips and notes", ""]
        for r in failures:
            message = r.get("message") or f"relative error: {r['rel_error_message']}"
            lines.append(f"- `{r['variant']}` N={r['length']:,}: {r['status']}: {message}")
        lines += [f"- {note}" for note in meta.get("notes", [])] + [""]
    path.write_text("\n".join(lines))


def _peer_tables(names: list[str], lengths: list[int], by: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """Each measured peer against its zoo variant: speedup (the peer's forward + backward time / ours) and peak
    memory, ours / the peer's."""
    pairs = [(PEER_VARIANTS[n[len(PEER_PREFIX):]], n) for n in names if n.startswith(PEER_PREFIX)]
    pairs = [(ours, peer) for ours, peer in pairs if ours in names]
    if not pairs:
        return []

    def cell(ours: str, peer: str, n: int) -> str:
        a, b = by.get((ours, n), {}), by.get((peer, n), {})
        if a.get("status") != "ok" or b.get("status") != "ok":
            return ""
        return f"{b['fwd_bwd_s'] / a['fwd_bwd_s']:.2f}x, {a['peak_mib']:.0f} / {b['peak_mib']:.0f} MiB"

    lines = [
        "## Against the peer packages",
        "",
        "Per length: speedup (the peer's forward + backward time / zoo's), then peak memory, zoo's / the peer's.",
        "",
        "| zoo variant | peer | " + " | ".join(f"{n:,}" for n in lengths) + " |",
        "|" + "---|" * (len(lengths) + 2),
    ]
    for ours, peer in pairs:
        lines.append(f"| `{ours}` | `{peer}` | " + " | ".join(cell(ours, peer, n) for n in lengths) + " |")
    return lines + [""]


def plot(results: dict[str, Any], out_dir: Path) -> None:
    """`time.png` (forward + backward, forward) and `memory.png` (peak, above baseline) against N, log-log."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    records, meta = results["records"], results["metadata"]
    names = list(dict.fromkeys(r["variant"] for r in records))
    lengths = sorted({r["length"] for r in records})
    # 20 distinct colours (the default cycle repeats after 10); peers dotted with crosses, beside zoo's own
    palette = matplotlib.colormaps["tab20"].colors
    style = {name: {"color": palette[i % len(palette)], "marker": "o"} for i, name in enumerate(names)}
    style.update({name: {**style[name], "linestyle": ":", "marker": "x"} for name in names if name.startswith(PEER_PREFIX)})
    style.update({"softmax": {"color": "black", "marker": "o"}, PROJECTIONS: {"color": "gray", "linestyle": "--", "marker": "o"}})
    panels = {
        "time.png": (("fwd_bwd_s", "forward + backward (s)"), ("fwd_s", "forward (s)")),
        "memory.png": (("peak_mib", "peak memory (MiB)"), ("extra_mib", "memory above the baseline (MiB)")),
    }
    settings = meta["settings"]
    title = f"{meta['device_name']}: batch {settings['batch']}, dim {settings['dim']}, {settings['heads']} heads, "
    for filename, pair in panels.items():
        figure = Figure(figsize=(14, 5.2), layout="constrained")
        axes = figure.subplots(1, 2)
        for axis, (key, label) in zip(axes, pair, strict=True):
            for name in names:
                points = sorted((n, v) for n, v in _series(records, name, key).items() if v > 0)
                if points:
                    axis.plot(*zip(*points), label=name, **style[name])
            axis.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel=label)
            axis.set_xticks(lengths, [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths])
            axis.xaxis.set_minor_formatter(NullFormatter())
            axis.grid(True, which="both", alpha=0.3)
        figure.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize="small")
        figure.suptitle(title + settings["dtype"] + (f"; memory: {meta['memory']}" if filename == "memory.png" else ""))
        figure.savefig(out_dir / filename, dpi=110)


def write_report(results: dict[str, Any], out_dir: Path | str) -> None:
    """`results.json`, `results.md`, `time.png` and `memory.png` in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    write_markdown(results, out_dir / "results.md")
    plot(results, out_dir)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Run one benchmark configuration; prints its record as JSON.")
    parser.add_argument("--single", required=True, metavar="JSON", help="a configuration from single_config()")
    args = parser.parse_args(argv)
    print(json.dumps(measure(json.loads(args.single))), flush=True)


if __name__ == "__main__":
    main()
