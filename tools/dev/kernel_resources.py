"""What the fused linear-family kernels ask of a GPU, found without one: registers, spills, shared memory.

`python -m dev.kernel_resources [--arch 90] [--maps performer ...] [--kernels ...] [--level 0]` runs one
forward and backward of the fused op (`zoo.attention._kernels.fused_linear`) on CPU tensors at the shape of the 1024-px
recipes (ViT-S/16: 4,097 tokens, 6 heads of 64, bf16), with each kernel launch recorded instead of run. Every
recorded launch is then compiled by triton's own compiler for `sm_<arch>`, its arguments specialised by triton's
own binder as a launch would (divisibility by 16, integers of 1), and ptxas reports the registers per thread, the
bytes of spill stores and of local memory (the stack frame) per thread, and the kernel's shared memory. A kernel
whose shared memory is over the architecture's limit (227 KB on sm_90, 99 KB on sm_86 / sm_89) fails to launch on
that GPU: the command exits 1, naming it. On a GPU the kernels then launch again at the next shrink level
(`--level`: what such a GPU gets).

Triton's CUDA backend ships ptxas, so this runs on any Linux machine with triton installed, but only with the
kernels compiled, not interpreted: `TRITON_INTERPRET` must be unset. `ZOO_FUSED_CONFIG` applies as in a run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch

# Shared memory a block may use (bytes), by compute capability: sm_80 (A100), sm_86 / sm_89, sm_90 (H100, H200).
SHARED_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
# name -> (`Feature` name, features): the three maps of the shipped recipes, at their widths
MAPS = {"performer": ("FAVOR", 256), "hedgehog": ("HEDGEHOG", 128), "linear": ("ELU", 64)}
KERNELS = (
    "_key_max_kernel",
    "_state_kernel",
    "_output_kernel",
    "_query_backward_kernel",
    "_query_state_grad_kernel",
    "_key_backward_kernel",
    "_key_map_grad_kernel",
)


class Launch(NamedTuple):
    kernel: str
    args: tuple
    kwargs: dict


class Resources(NamedTuple):
    kernel: str
    warps: int
    registers: int
    spilled: int  # bytes of spill stores per thread (ptxas)
    # bytes of local memory per thread (ptxas's stack frame): what the driver reports, and triton's `n_spills` (in
    # `dev.kernel_profile`'s "spills" column) counts in 4-byte words
    stack: int
    shared: int  # bytes per block


class _Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` appends the launch instead of running it."""

    def __init__(self, name: str, launches: list[Launch]) -> None:
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(Launch(self.name, args, kwargs))


@contextlib.contextmanager
def _recorded(fused, launches: list[Launch]) -> Iterator[None]:
    originals = {name: getattr(fused, name) for name in KERNELS}
    for name in KERNELS:
        setattr(fused, name, _Recorder(name, launches))
    try:
        yield
    finally:
        for name, kernel in originals.items():
            setattr(fused, name, kernel)


def record(
    feature_name: str, features: int, shape: tuple[int, int, int, int] = (1, 4097, 6, 64), level: int = 0
) -> list[Launch]:
    """The launches of one forward and backward (the state recomputed in backward) at `shape` (b, n, h, d) and
    shrink `level` (`_kernels.fused_linear.plan.Plan`), one per distinct kernel and compile-time constants."""
    from zoo.attention._kernels.fused_linear import launch as fused

    feature = fused.Feature[feature_name]
    b, n, h, d = shape
    q, k, v = fused.heads(torch.randn(b, n, 3, h, d, dtype=torch.bfloat16))
    proj = {fused.Feature.FAVOR: torch.randn(1, d, features), fused.Feature.HEDGEHOG: torch.randn(h, d, features // 2)}
    proj = proj.get(feature)
    launches: list[Launch] = []
    plan = fused.Plan(q, v, features, int(feature), 1e-4, level)
    with _recorded(fused, launches):
        out, _, _, key_max = fused.forward_with(plan, q, k, v, None, proj, proj, int(feature))
        grad = torch.randn_like(out)
        fused.backward_with(plan, grad, q, k, v, None, proj, proj, out, None, None, key_max, int(feature))
    unique = {(launch.kernel, tuple(sorted(launch.kwargs.items()))): launch for launch in launches}
    return list(unique.values())


def compile_launch(launch: Launch, arch: int) -> Resources:
    """Compile one recorded launch for `sm_<arch>` as a launch on that GPU would, and read ptxas's report of it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from zoo.attention._kernels.fused_linear import launch as fused

    kernel = getattr(fused, launch.kernel)
    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError("the kernels are interpreted here (TRITON_INTERPRET=1): unset it to compile them")
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    # The launcher's own specialisation of these arguments (a pointer or an integer divisible by 16 compiles with
    # that divisibility, an integer 1 as a constant), by triton's own binder: without it ptxas saw unaligned loads
    # and reported far more spills and shared memory than a GPU ran the kernels with
    # (benchmarks/cpu/kernel_resources_sm90.md).
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, dict(launch.kwargs), bound, specialization, options
    )
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    report = _ptxas_report(compiled.asm["ptx"], arch)
    return Resources(
        launch.kernel,
        options.num_warps,
        _reported(r"Used (\d+) registers", report),
        _reported(r"(\d+) bytes spill stores", report),
        _reported(r"(\d+) bytes stack frame", report),
        compiled.metadata.shared,
    )


def _reported(pattern: str, report: str) -> int:
    found = re.search(pattern, report)
    return int(found.group(1)) if found else 0


def _ptxas_report(ptx: str, arch: int) -> str:
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        command = [str(ptxas), "-v", f"--gpu-name=sm_{arch}{suffix}", str(source), "-o", str(Path(folder) / "k.cubin")]
        return subprocess.run(command, capture_output=True, text=True, check=True).stderr


def resources(name: str, arch: int = 90, kernels: tuple[str, ...] = KERNELS, level: int = 0) -> list[Resources]:
    feature_name, features = MAPS[name]
    launches = record(feature_name, features, level=level)
    return [compile_launch(launch, arch) for launch in launches if launch.kernel in kernels]


def main(argv: list[str] | None = None) -> int:
    from zoo.attention._kernels.fused_linear.plan import SHRINK_LEVELS as _SHRINK_LEVELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, choices=sorted(SHARED_LIMIT))
    parser.add_argument("--maps", nargs="+", choices=tuple(MAPS), default=tuple(MAPS))
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=KERNELS, help="default: every one launched")
    parser.add_argument(
        "--level", type=int, default=0, choices=range(_SHRINK_LEVELS + 1), help="the shrink level a smaller GPU gets"
    )
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        parser.error("TRITON_INTERPRET=1 interprets the kernels; unset it to compile them")
    try:
        found_by_map = {name: resources(name, args.arch, tuple(args.kernels), args.level) for name in args.maps}
    except ValueError as error:  # a ZOO_FUSED_CONFIG the kernels refuse: its message names the entry
        parser.error(str(error))
    limit, over = SHARED_LIMIT[args.arch], []
    config = os.environ.get("ZOO_FUSED_CONFIG", "")
    print(f"sm_{args.arch}, level {args.level}, ZOO_FUSED_CONFIG={config!r}, shared limit {limit} bytes")
    print("| map | kernel | warps | registers | spill stores (B) | stack (B) | shared (B) |")
    print("|---|---|---|---|---|---|---|")
    for name, found_all in found_by_map.items():
        for row in found_all:
            cells = (name, row.kernel, row.warps, row.registers, row.spilled, row.stack, row.shared)
            print("| " + " | ".join(map(str, cells)) + " |")
            if row.shared > limit:
                over.append(f"{name} {row.kernel} ({row.shared} bytes)")
    if over:
        print(f"over sm_{args.arch}'s shared memory, these would not launch: {', '.join(over)}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
