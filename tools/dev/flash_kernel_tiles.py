#!/usr/bin/env python
"""Time PyTorch's CPU flash-attention kernel alone on batches of equal query / key blocks, the calls the windowed
variants are made of (`zoo/attention/_kernels/flash_parts.py`): forward and backward, full and causal, GFLOP/s.
It shows the floor under `local`, `dilated`, `longformer`, `bigbird` and `banded_conv` on this machine, and
whether a causal block is cheaper than a full one (with torch 2.14 it is only when the keys span more than one
512-key tile).

    tools/dev/flash_kernel_tiles.py --length 16384 --threads 2 > benchmarks/cpu/flash_kernel.md
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

forward_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
backward_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

SHAPES = [(64, 64), (64, 256), (64, 512), (128, 128), (128, 512), (256, 256), (256, 512), (256, 1024), (512, 1024)]


def best_ms(op, *args, repeats: int, **kwargs) -> float:
    """The best time of `op(*args, **kwargs)` over `repeats` runs after one warm-up, in ms."""
    op(*args, **kwargs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        op(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=16384, help="queries in all (blocks x block length)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up; the best is kept")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    h, d = args.heads, args.head_dim
    print(f"# CPU flash-attention kernel, {platform.processor() or platform.machine()}\n")
    print(f"torch {torch.__version__}, {args.threads} threads, {args.length} queries in blocks, {h} heads x {d}, fp32;")
    print(f"best of {args.repeats} after a warm-up. GFLOP/s counts the full block (4 n m d per head forward,")
    print("2.5x that backward), so a causal block that skips work shows a higher rate.\n")
    print("| queries x keys per block | causal | forward (ms) | backward (ms) | forward GFLOP/s | backward GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for queries, keys in SHAPES:
        blocks = args.length // queries
        # [blocks, h, length, d] laid out as [blocks, length, h, d], as the q/k/v sliced from a fused projection
        q, k, v = (torch.randn(blocks, n, h, d).transpose(1, 2) for n in (queries, keys, keys))
        flops = 4 * blocks * h * queries * keys * d / 1e9
        for causal in (False, True):
            out, lse = forward_op(q, k, v, 0.0, causal, scale=d**-0.5)
            grad = torch.randn_like(out)
            fwd = best_ms(forward_op, q, k, v, 0.0, causal, scale=d**-0.5, repeats=args.repeats)
            bwd = best_ms(backward_op, grad, q, k, v, out, lse, 0.0, causal, scale=d**-0.5, repeats=args.repeats)
            print(
                f"| {queries} x {keys} | {'yes' if causal else 'no'} | {fwd:.1f} | {bwd:.1f} | "
                f"{flops / fwd * 1000:.0f} | {2.5 * flops / bwd * 1000:.0f} |"
            )


if __name__ == "__main__":
    main()
