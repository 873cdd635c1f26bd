"""The launch plan of one fused call: tile rows, warps, feature chunks, the products' precision and the constants
the kernels take, from the shapes, the feature map, the GPU's shrink level and `ZOO_FUSED_CONFIG`.

`ZOO_FUSED_CONFIG` (read on every call, so a new setting takes effect): `rows:warps[:dot[:chunk]]` for every
feature map, or per map, `elu=64:4,favor=32:8:bf16` (the names of `Feature`, lower case): tile rows, warps, for
half-precision inputs the products' precision (tf32, or bf16 operands with fp32 sums; empty for
`default_precision`'s), and the feature columns a kernel holds at once (a power of two from 16, or 0 for all;
HEDGEHOG's chunks are its two halves whatever the number), for a sweep (`tools/dev/kernel_configs.py`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import typing

import torch
from torch import Tensor

from ..._features import Feature

__all__ = ["SHRINK_LEVELS", "Config", "Plan", "ceil_div", "config_override", "default_precision", "plan_for", "pow2"]

CONFIG_ENV = "ZOO_FUSED_CONFIG"
_DOT_PRECISIONS = ("tf32", "bf16")
# Feature columns a FAVOR or RELU kernel holds at once past 64 features: whole, 256 random features need one pipeline
# stage to fit sm_90's shared memory (`tools/dev/kernel_resources.py`), and 64 at a time ran faster on an H200
# (benchmarks/nvidia-h200/chunked/kernel_profile.md). HEDGEHOG's 2 x 64 stay whole, as the H200 timed them, unless
# `ZOO_FUSED_CONFIG` asks for halves (benchmarks/cpu/kernel_resources_sm90.md: its shared memory and stack either way).
_CHUNK = 64

# What a plan gives up, level by level, when a kernel asks for more shared memory than the GPU has (`launch.fitted`):
# pipelining (one stage: each loaded tile buffered once), then the features whole (64 columns at a time, hedgehog
# by halves), then half the rows of a tile, twice. Which GPUs need which level: benchmarks/cpu/kernel_resources_sm90.md.
SHRINK_LEVELS = 4


def pow2(x: int) -> int:
    """The power of two at or above x, at least 16 (`tl.dot`'s smallest side); in Python, as triton's
    `next_power_of_2` is a jitted function whose every call from Python goes through a launcher."""
    return max(16, 1 << (x - 1).bit_length())


def ceil_div(a: int, b: int) -> int:
    # triton.cdiv is a jitted function: from Python each call goes through its launcher's argument handling
    return -(-a // b)


def _programs(device: torch.device) -> int:
    """Programs to keep the device busy: four per multiprocessor on a GPU; a few in the interpreter."""
    if device.type != "cuda":
        return 4
    return 4 * _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


class Config(typing.NamedTuple):
    """A `ZOO_FUSED_CONFIG` entry: tile rows, warps, the products' precision (None: the default) and feature
    columns per chunk (None: the default; 0: all at once)."""

    rows: int
    warps: int
    dot: str | None = None
    chunk: int | None = None


def config_override(kind: int) -> Config | None:
    """The `ZOO_FUSED_CONFIG` entry for feature map `kind` (see the module docstring), None where it has none."""
    text = os.environ.get(CONFIG_ENV, "")
    for entry in filter(None, text.split(",")):
        name, _, config = entry.rpartition("=")
        if name in ("", Feature(kind).name.lower()):
            return _parse_config(entry, config)
    return None


def _parse_config(entry: str, config: str) -> Config:
    parts = config.split(":")
    rows = warps = chunk = None
    with contextlib.suppress(ValueError, IndexError):
        rows, warps = int(parts[0]), int(parts[1])
        chunk = int(parts[3]) if len(parts) > 3 else None
    dot = (parts[2] or None) if len(parts) > 2 else None
    chunk_ok = len(parts) < 4 or (chunk is not None and (chunk == 0 or (chunk >= 16 and chunk & (chunk - 1) == 0)))
    if warps is None or len(parts) > 4 or dot not in (None, *_DOT_PRECISIONS) or not chunk_ok:
        raise ValueError(
            f"{CONFIG_ENV} entry {entry!r} is not rows:warps[:dot[:chunk]] (dot one of "
            f"{', '.join(_DOT_PRECISIONS)} or empty, chunk 0 or a power of two from 16), e.g. 64:4, favor=32:8:bf16 "
            "or favor=64:4::64"
        )
    return Config(rows, warps, dot, chunk)


def default_precision(dtype: torch.dtype) -> str:
    """The products' operands: exact fp32 for fp32 inputs; bf16 (fp32 sums) for bf16 inputs, as FlashAttention
    multiplies its bf16 probabilities, faster than tf32 for every map on an H200
    (`benchmarks/nvidia-h200/chunked/kernel_profile.md`); tf32 for fp16 inputs, whose 10-bit mantissa bf16 would
    cut."""
    if dtype == torch.float32:
        return "ieee"
    return "bf16" if dtype == torch.bfloat16 else "tf32"


class Plan:
    """Block sizes, split counts, feature chunks and the constants of one call; `level` (0 to `SHRINK_LEVELS`)
    shrinks what the kernels hold, for GPUs with less shared memory."""

    def __init__(self, q: Tensor, v: Tensor, features: int, kind: int, eps: float, level: int = 0) -> None:
        self._build(tuple(q.shape), v.shape[-1], q.dtype, q.device, features, kind, eps, level)

    def _build(self, shape: tuple, e: int, dtype: torch.dtype, device: torch.device, features: int, kind: int,
               eps: float, level: int) -> None:  # fmt: skip
        b, h, n, d = shape
        self.h, self.n, self.d, self.e, self.r = h, n, d, e, features
        self.block_d, self.block_e = pow2(d), pow2(self.e)
        override = config_override(kind) or Config(0, 0)
        default_chunk = _CHUNK if kind in (Feature.FAVOR, Feature.RELU) else 0
        self._chunk(kind, default_chunk if override.chunk is None else override.chunk)
        # The `[w, c]` feature tile and the `[c, e]` state chunk share the registers and shared memory with the
        # accumulators: past 64 feature columns at once (hedgehog's 2 x 64 whole), 64 rows overflow sm_90's shared
        # memory in the query backward and 32 fit (benchmarks/cpu/kernel_resources_sm90.md)
        self.block_n = 64 if self.block_c <= 64 else 32
        # Chunked kernels carry x, dx and dv across the chunks: 8 warps halve each thread's share, which keeps the
        # backward kernels from spilling to the stack (benchmarks/cpu/kernel_resources_sm90.md)
        self.warps = 4 if self.block_c * self.block_e <= 64 * 64 and self.chunks == 1 else 8
        self.prec = default_precision(dtype)
        if override.rows:
            self.block_n, self.warps = override.rows, override.warps
            if override.dot and self.prec != "ieee":
                self.prec = override.dot
        # 256 features at once: three pipeline stages ask for more shared memory than an H200 has, one fits
        self.stages = 1 if self.block_c >= 256 or level >= 1 else None
        if level >= 2 and self.chunks == 1 and self.block_c > 32:
            self._chunk(kind, min(_CHUNK, self.block_c // 2))
        if level >= 3:
            self.block_n = max(16, self.block_n >> (level - 2))
        n_tiles = ceil_div(n, self.block_n)
        splits = max(1, min(n_tiles, _programs(device) // (b * h)))
        self.tiles = ceil_div(n_tiles, splits)
        self.splits = ceil_div(n_tiles, self.tiles)
        self.n_tiles = n_tiles
        self.kind = kind
        self.hsq_scale = 0.5 * d**-0.5
        # FAVOR and RELU project x d^-1/4 (so that phi(q).phi(k) estimates exp(q.k / sqrt(d)))
        self.proj_scale = d**-0.25 if kind in (Feature.FAVOR, Feature.RELU) else 1.0
        self.log_half_r = 0.5 * math.log(features)
        self.floor = eps / math.sqrt(features) if kind == Feature.FAVOR else eps

    def _chunk(self, kind: int, chunk: int) -> None:
        """Feature chunks of `chunk` columns (`block_c` wide, `stride` apart, `width` of them real) where the features
        are wider; HEDGEHOG's two halves (each one softmax); ELU's features (x's columns) whole."""
        block_r = pow2(self.r)
        self.chunks, self.block_c, self.chunk_stride, self.chunk_width = 1, block_r, block_r, block_r
        if kind == Feature.ELU or chunk == 0 or chunk >= block_r:
            return
        if kind == Feature.HEDGEHOG:
            half = self.r // 2
            self.chunks, self.block_c, self.chunk_stride, self.chunk_width = 2, pow2(half), half, half
        else:
            self.chunks, self.block_c = ceil_div(self.r, chunk), chunk
            self.chunk_stride = self.chunk_width = chunk

    def blocks(self) -> dict:
        """The kernels' block constexprs and launch options."""
        return {
            "BLOCK_N": self.block_n,
            "BLOCK_D": self.block_d,
            "BLOCK_E": self.block_e,
            "BLOCK_C": self.block_c,
            "PREC": self.prec,
            "num_warps": self.warps,
            **({"num_stages": self.stages} if self.stages else {}),
        }

    def constants(self) -> tuple:
        return self.h, self.n, self.d, self.e, self.r, self.chunk_stride, self.chunk_width

    def scalars(self) -> tuple:
        return self.hsq_scale, self.floor, self.log_half_r, self.proj_scale


@functools.lru_cache(maxsize=256)
def _cached_plan(shape: tuple, e: int, dtype: torch.dtype, device: torch.device, features: int, kind: int,
                 eps: float, level: int, config: str) -> Plan:  # fmt: skip
    """The `Plan` of one call's shapes and `ZOO_FUSED_CONFIG` (`config`, so that a new setting takes effect): built
    once, as a layer asks for it twice a step and building one costs the host more than launching a kernel."""
    del config
    built = Plan.__new__(Plan)
    built._build(shape, e, dtype, device, features, kind, eps, level)
    return built


def plan_for(q: Tensor, v: Tensor, features: int, kind: int, eps: float, level: int) -> Plan:
    """The (cached) `Plan` of a call on queries `q: [b, h, n, d]` and values `v: [b, h, n, e]`."""
    config = os.environ.get(CONFIG_ENV, "")
    return _cached_plan(tuple(q.shape), v.shape[-1], q.dtype, q.device, features, kind, eps, level, config)
