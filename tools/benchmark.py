#!/usr/bin/env python
"""Time attention variants against sequence length: forward and forward + backward time, peak memory, relative
error against exact attention, the log-log slope of time against N; writes results.json, results.md, time.png
and memory.png to --out (default benchmarks/<device>: benchmarks/cpu, benchmarks/nvidia-h100-80gb-hbm3). The
measuring, sweeping and reporting live in tools/zoo_bench/ (found beside this script; not part of `import zoo`).

    tools/benchmark.py --device cpu --threads 2                     # every variant, 1K to 64K: the speed targets
    tools/benchmark.py --variants softmax performer --lengths 1024 4096 --repeats 1
    tools/benchmark.py --device cuda --dtype bf16 --lengths 1024 4096 16384 65536 131072 --peers
    tools/benchmark.py --variants performer --option performer.nb_features=128 --causal
    tools/benchmark.py --variants local window2d neighborhood --option window2d.window=16

The 2-D variants (window2d, neighborhood) take N tokens as a sqrt(N) x sqrt(N) patch grid without prefix tokens
(a length that is not a square is an error for them) and 23 x 23 = 529 keys per query, about local's 513.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from zoo.attention import list_attentions
from zoo.cli import run_cli
from zoo_bench.machine import default_device, device_slug
from zoo_bench.measure import DTYPES, PROJECTIONS, Settings
from zoo_bench.peers import PEER_PREFIX, PEERS
from zoo_bench.sweep import DEFAULT_LENGTHS, check_variants, parse_options, run_sweep


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--variants",
        nargs="+",
        metavar="NAME",
        help="registered variants, `projections` or peer:<package> (default: every registered "
        "variant); `projections` (qkv + proj, attention = identity) is always measured",
    )
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=int,
        default=list(DEFAULT_LENGTHS),
        metavar="N",
        help="sequence lengths; squares for the 2-D variants (default: %(default)s)",
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available, else cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in every configuration")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument(
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="VARIANT.KEY=VALUE",
        help="a variant option, value read as YAML, e.g. performer.nb_features=256 (repeatable)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=120.0,
        help="once a configuration takes longer, longer sequences of that variant are skipped; "
        "a configuration stops repeating after this long (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, help="kill a configuration after this many seconds (default: 10 x --max-seconds)"
    )
    parser.add_argument(
        "--peers",
        "--compare-peers",
        action="store_true",
        help="also time the peer packages that are installed: " + ", ".join(PEER_PREFIX + name for name in PEERS),
    )
    parser.add_argument("--causal", action="store_true", help="causal attention (variants without it: error)")
    parser.add_argument("--out", help="output directory (default: benchmarks/<device name>)")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the earlier results in --out (same settings) except those measured again",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = args.device or default_device()
    settings = Settings(
        batch=args.batch,
        dim=args.dim,
        heads=args.heads,
        dtype=args.dtype,
        device=device,
        threads=args.threads,
        repeats=args.repeats,
        warmup=args.warmup,
        causal=args.causal,
    )
    variants = list(args.variants or list_attentions())
    if args.peers:
        variants += [PEER_PREFIX + name for name in PEERS if PEER_PREFIX + name not in variants]
    check_variants(variants)
    options = parse_options(args.options, [*variants, PROJECTIONS])
    out = Path(args.out) if args.out else Path("benchmarks") / device_slug(device)
    command = shlex.join(["tools/benchmark.py", *sys.argv[1:]])
    run_sweep(
        variants,
        args.lengths,
        out,
        settings,
        options=options,
        max_seconds=args.max_seconds,
        timeout=args.timeout,
        command=command,
        merge=args.merge,
        log=print,
    )
    print(f"wrote {out}/results.json, results.md, time.png and memory.png")


if __name__ == "__main__":
    run_cli(main)
