"""The quickstart's training time and test top-1 on this machine, behind README's quickstart claim and
`benchmarks/cpu/quickstart.json` (rendered in docs/results/cpu.md).

    PYTHONPATH=tools .venv/bin/python -m zoo_bench.quickstart --out benchmarks/cpu/quickstart.json [--cells ...]

Each cell is `make quickstart`'s two commands (tools/train.py recipes/quickstart.yaml, then tools/eval.py on the test
split) in fresh processes, the recipe unchanged but for its `seed` and, in the timing cells, `train.max_steps`:
- `policy`: zoo's thread policy (zoo.train.threads: the cores less the loader's workers), nothing of ours beside it
  (the machine may be shared: each record keeps the load average before and after); the whole recipe for seeds 0, 1
  and 2 (the test top-1 README quotes), and the first `TIMING_STEPS` steps for the timings below;
- `busy`: the same beside one CPU-bound process (`python -c "while True: pass"`);
- `omp1`: `OMP_NUM_THREADS=1`;
- `torch_default_busy`: torch's own default before the policy (one thread per core: `train.threads` = the cores),
  beside the CPU-bound process.
A record holds the training process's wall and CPU seconds (user + system, its loader workers included), its steady
step time (train_summary.json: the mean step after the first), the threads line it printed and the test top-1
(eval.json). The study resumes from its JSON (zoo_bench._study); `--cells setting:seed:steps ...` runs some cells.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._study import read_saved, run_cells, write_json
from .machine import REPO_ROOT

__all__ = ["CELLS", "main"]

RECIPE = "recipes/quickstart.yaml"
# the timing cells' steps: a step's time is steady after the first, and a shared machine's time is scarce
TIMING_STEPS = 30
FULL = 400
# (setting, seed, steps): the whole recipe for three seeds, then the timings
CELLS: tuple[tuple[str, int, int], ...] = (
    ("policy", 0, FULL),
    ("policy", 1, FULL),
    ("policy", 2, FULL),
    *((setting, 0, TIMING_STEPS) for setting in ("policy", "busy", "omp1", "torch_default_busy")),
)
SETTINGS = {
    "policy": "zoo's thread policy (the cores less the loader's workers), nothing of ours beside it",
    "busy": "zoo's thread policy, beside one CPU-bound process (python -c 'while True: pass')",
    "omp1": "OMP_NUM_THREADS=1",
    "torch_default_busy": "one thread per core (torch's default before the policy), beside one CPU-bound process",
}


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall and CPU seconds of `command` (user + system of that process and the children it waited for: its loader
    workers), and its stderr; a failure raises. The CPU is that process's own (`os.wait4`), not this process's
    children's total, which would count a cell running beside it."""
    tick = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - tick
        err.seek(0)
        stderr = err.read()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {stderr[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, stderr


def run_cell(cell: tuple[str, int, int], runs: Path) -> dict[str, Any]:
    setting, seed, steps = cell
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if setting == "omp1":
        env["OMP_NUM_THREADS"] = "1"
    run_dir = runs / f"{setting}_{seed}_{steps}"
    train = [sys.executable, "tools/train.py", RECIPE, "--output", str(run_dir), "--overwrite", "--set", f"seed={seed}"]
    train += [] if steps == FULL else [f"train.max_steps={steps}"]
    train += [f"train.threads={len(os.sched_getaffinity(0))}"] if setting == "torch_default_busy" else []
    beside = setting in ("busy", "torch_default_busy")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if beside else None
    load_before = os.getloadavg()[0]
    try:
        wall, cpu, stderr = _timed(train, env)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    load_after = os.getloadavg()[0]
    summary = json.loads((run_dir / "train_summary.json").read_text())
    _timed([sys.executable, "tools/eval.py", str(run_dir), "--split", "test"], env)
    test = json.loads((run_dir / "eval.json").read_text())["metrics"]
    found = re.search(r"threads: .*", stderr)
    return {
        "setting": setting,
        "seed": seed,
        "max_steps": steps,
        "train_wall_s": round(wall, 1),
        "train_cpu_s": round(cpu, 1),
        "step_s": summary["step_s"],
        "steps": summary["steps"],
        "threads": found.group(0) if found else None,
        "load_before": round(load_before, 2),
        "load_after": round(load_after, 2),
        "test_top1": test["top1"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/cpu/quickstart.json")
    parser.add_argument("--runs", type=Path, default=REPO_ROOT / "runs/quickstart_study")
    parser.add_argument("--cells", nargs="+", help="setting:seed:steps of the cells to run (default: every cell)")
    parser.add_argument("--jobs", type=int, default=1, help="cells at once (the full runs only: timings run alone)")
    args = parser.parse_args()
    cells = [(c.split(":")[0], int(c.split(":")[1]), int(c.split(":")[2])) for c in args.cells] if args.cells else CELLS
    results = read_saved(args.out) or {
        "protocol": {
            "recipe": RECIPE,
            "command": "tools/train.py recipes/quickstart.yaml --set seed=S, then tools/eval.py RUN --split test",
            "settings": SETTINGS,
            "seeds": "policy: 0, 1, 2 (seed: the model's initialisation and the batches' order; the data fixed)",
            "timing_steps": TIMING_STEPS,
            "tuned": "nothing: the recipe as shipped",
            "trivial_baseline_top1": 0.1,
            "cores": len(os.sched_getaffinity(0)),
            "timing": "train_wall_s / train_cpu_s: the whole tools/train.py process (imports, data generation, the "
            "steps, evaluations); step_s: its mean step after the first; load_before / load_after: the machine's "
            "1-minute load average around it",
        },
        "records": [],
    }
    done = {(r["setting"], r["seed"], r.get("max_steps", FULL)) for r in results["records"]}
    run_cells(
        [cell for cell in cells if cell not in done],
        lambda cell: run_cell(cell, args.runs),
        lambda cell, record: results["records"].append(record),
        lambda: write_json(args.out, results),
        jobs=args.jobs,
    )


if __name__ == "__main__":
    main()
