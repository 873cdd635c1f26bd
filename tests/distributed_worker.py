"""The suite's one torchrun launch, on two CPU processes: the distributed runs that tests/train/test_replicas.py,
tests/train/test_fsdp.py and tests/convert/test_convert_tool.py read, one after another in the same two processes,
so that the imports of torch, timm, torchmetrics and zoo (in each of torchrun's three processes) are paid once
rather than once per test file. tests/distributed_launch.py starts it once per pytest session.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_worker.py \\
        OUT FSDP_RECIPE TEACHER STUDENT_RECIPE

The runs, in order, each named by its marker (`job` first):
- `replicas`: every shipped recipe at CPU size under ddp and fsdp, the processes' states compared
  (tests/replica_worker.py); the records in OUT/replicas.json;
- `convert`: tools/convert.py converts TEACHER (timm weights) to hedgehog at 64 px with STUDENT_RECIPE, 2 + 2 steps,
  into OUT/convert;
- `train ddp first`, `train ddp second`, `train ddp straight`, then the same three of fsdp: tools/train.py trains
  FSDP_RECIPE under each strategy (fsdp with `model.grad_checkpointing=true`) 2 steps into OUT/train/<strategy>, stops,
  then resumes (`--resume`) to step 4; `straight` trains to step 4 without stopping, into OUT/train/<strategy>_straight.

A tool's run is its own command line: its `main()` under `run_cli`, with `sys.argv` as a user types it. Before each
run accelerate's state is forgotten; after it the log files that the run's `log_to` attached (and `run_cli`'s stderr
handler) are closed and detached, as a fresh process would have none. tools/train.py's `main()` ends with
`end_processes()`, which leaves the process group and exits (tools/convert.py's too): every run but the last sees a
stand-in that only waits for the other process and flushes, the last one (a train run) the real call, so the
launch ends as a user's does (status 0 after the last checkpoint).

Before each run process 0 prints `=== <run> ===` (`MARKER`) on stdout and on stderr, and the processes wait for each
other, so that the tests can tell each run's output apart, and which run a crash stopped.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
# torchrun runs this file as a script: sys.path[0] is tests/ (helpers, replica_worker); tools/ is sys.path[0] when a
# user runs tools/train.py
sys.path.insert(0, str(ROOT / "tools"))

import replica_worker  # noqa: E402
from helpers import reset_accelerate  # noqa: E402

from zoo import cli  # noqa: E402

MARKER = "=== {} ==="
# the strategies of the train runs, in order, with their extra overrides
TRAIN_STRATEGIES = (("ddp", ()), ("fsdp", ("model.grad_checkpointing=true",)))


def load_tool(name: str) -> ModuleType:
    """tools/<name>.py as a module (not `__main__`: nothing runs on import)."""
    spec = importlib.util.spec_from_file_location(f"zoo_{name}_cli", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for_the_others() -> None:
    """`end_processes()` without the exit: every process waits for the others, then flushes its output."""
    if dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()


def run_tool(tool: ModuleType, args: list[str | Path]) -> None:
    """`python tools/<tool>.py ARGS` in this process; an error exits it, as it would the tool's process."""
    reset_accelerate()
    logger = logging.getLogger()
    handlers = logger.handlers[:]
    sys.argv = [tool.__file__, *map(str, args)]
    tool.run_cli(tool.main)
    for handler in logger.handlers[:]:
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    cli._log_file = None


def train_runs(train: ModuleType, recipe: Path, out: Path) -> list[tuple[str, Callable[[], None]]]:
    """`(name, run)` of each tools/train.py run, in order."""
    runs = []
    for strategy, extra in TRAIN_STRATEGIES:
        settings = ["--set", f"train.distributed={strategy}", *extra]
        for part, steps, resume in (("first", 2, []), ("second", 4, ["--resume"]), ("straight", 4, [])):
            folder = out / (f"{strategy}_straight" if part == "straight" else strategy)
            args = [recipe, *resume, "--output", folder, *settings, f"train.max_steps={steps}"]
            runs.append((f"train {strategy} {part}", lambda args=args: run_tool(train, args)))
    return runs


def convert_args(teacher: Path, student: Path, out: Path) -> list[str | Path]:
    """tools/convert.py's arguments: TEACHER to hedgehog at 64 px, 2 + 2 steps, into `out`."""
    return [
        teacher, student, "--attention", "hedgehog", "--img-size", "64", "--set", "data.options.canvas_size=64",
        "--stage1-steps", "2", "--stage2-steps", "2", "--output", out,
    ]  # fmt: skip


def main(out: Path, fsdp_recipe: Path, teacher: Path, student: Path) -> None:
    train, convert = load_tool("train"), load_tool("convert")
    runs = [
        ("replicas", lambda: replica_worker.run(out / "replicas.json")),
        ("convert", lambda: run_tool(convert, convert_args(teacher, student, out / "convert"))),
        *train_runs(train, fsdp_recipe, out / "train"),
    ]
    end_processes = train.end_processes
    # tools/convert.py ends as tools/train.py does; its run is never the last
    convert.end_processes = wait_for_the_others
    first_process = int(os.environ.get("RANK", "0") or 0) == 0
    for index, (name, run) in enumerate(runs):
        # the last run (a train run) ends the launch as tools/train.py does
        train.end_processes = end_processes if index == len(runs) - 1 else wait_for_the_others
        if first_process:
            for stream in (sys.stdout, sys.stderr):
                print(MARKER.format(name), file=stream, flush=True)
        # the other process prints nothing of this run before its marker, nor anything of it after the next one
        wait_for_the_others()
        run()
        wait_for_the_others()
    # not reached: the last run's end_processes() exits
    raise RuntimeError("tools/train.py's main() returned after its last run")


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:5]))
