"""The worker of tests/train/test_fsdp.py, launched by torchrun on two CPU processes: the four runs of tools/train.py
that the tests read, one after another in this one launch, so that the imports of torch, timm and zoo (about 11 s of
CPU in each of torchrun's three processes) are paid once rather than once per run.

    python -m torch.distributed.run --nproc_per_node 2 tests/train/fsdp_worker.py RECIPE ROOT

Under each strategy (`ddp`, then `fsdp` with `model.grad_checkpointing=true`) the recipe trains 2 steps into
ROOT/<strategy>, then resumes (`--resume`) to step 4. Each run is tools/train.py's own command line: its `main()`
under `run_cli`, with `sys.argv` as a user types it. Between runs accelerate's state is forgotten and the log file
that the run's `log_to` attached (with `run_cli`'s stderr handler) is closed and detached, as a fresh process would
have none. `main()` ends with `end_processes()`, which leaves the process group and exits: the first three runs see a
stand-in that only waits for the other process and flushes, the last one the real call, so the launch ends as a
user's does (status 0 after the last checkpoint).

Before each run process 0 prints `=== <strategy> <first|second> ===` on stdout and on stderr (`MARKER`), so that the
test can tell each run's output apart.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "tools" / "train.py"
# torchrun runs this file as a script: sys.path[0] is tests/train. `helpers` lives in tests/ (pytest's pythonpath),
# and tools/ is sys.path[0] when a user runs tools/train.py.
for folder in (ROOT / "tools", ROOT / "tests"):
    sys.path.insert(0, str(folder))

from helpers import reset_accelerate  # noqa: E402

MARKER = "=== {strategy} {part} ==="
# the strategies in order, with their extra overrides
STRATEGIES = (("ddp", ()), ("fsdp", ("model.grad_checkpointing=true",)))


def plan(recipe: Path, root: Path) -> list[tuple[str, str, list[str]]]:
    """`(strategy, "first" | "second", tools/train.py's arguments)` of each run, in order."""
    runs = []
    for strategy, extra in STRATEGIES:
        settings = [f"train.distributed={strategy}", *extra]
        output = ["--output", str(root / strategy)]
        runs.append((strategy, "first", [str(recipe), *output, "--set", "train.max_steps=2", *settings]))
        runs.append((strategy, "second", [str(recipe), *output, "--resume", "--set", "train.max_steps=4", *settings]))
    return runs


def load_train():
    """tools/train.py as a module (not `__main__`: nothing runs on import)."""
    spec = importlib.util.spec_from_file_location("zoo_train_cli", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for_the_others() -> None:
    """`end_processes()` without the exit: every process waits for the others, then flushes its output."""
    if dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()


def main(recipe: Path, root: Path) -> None:
    train = load_train()
    end_processes = train.end_processes
    first_process = int(os.environ.get("RANK", "0") or 0) == 0
    runs = plan(recipe, root)
    for index, (strategy, part, args) in enumerate(runs):
        # the last run ends the launch as tools/train.py does
        train.end_processes = end_processes if index == len(runs) - 1 else wait_for_the_others
        if first_process:
            for stream in (sys.stdout, sys.stderr):
                print(MARKER.format(strategy=strategy, part=part), file=stream, flush=True)
        reset_accelerate()
        logger = logging.getLogger()
        handlers = logger.handlers[:]
        sys.argv = [str(TRAIN), *args]
        train.run_cli(train.main)
        for handler in logger.handlers[:]:
            if handler not in handlers:
                logger.removeHandler(handler)
                handler.close()
    # not reached: the last run's end_processes() exits
    raise RuntimeError("tools/train.py's main() returned after its last run")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
