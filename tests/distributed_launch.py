"""The suite's one torchrun launch (tests/distributed_worker.py on two CPU processes), made once per pytest session
for the tests that read its runs: tests/train/test_replicas.py, tests/train/test_fsdp.py and
tests/convert/test_convert_tool.py (through the `distributed_runs` fixture of tests/conftest.py). A launch pays
three processes' imports (torch, timm, torchmetrics and zoo in torchrun's agent and each of its two workers) before
any run starts, so one launch for the three files, rather than one each, pays them once.

The launch starts as soon as collection ends (`start`, from tests/conftest.py's `pytest_collection_finish`), in a
thread of one process, so that its two processes run beside the tests rather than while a worker waits for them:
under pytest-xdist the first worker to claim it (a file made with O_EXCL in the folder that the session's workers
share, the parent of each one's basetemp). The thread holds a file lock there while the launch runs and writes its
result, `launch.json` last; a test that asks (`shared_launch`) waits on the lock, then reads it, or makes the launch
itself where none was started. Without xdist the session's basetemp holds it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock
from helpers import conversion_inputs, fsdp_recipe_file

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"
# far above what the launch takes on idle cores: a machine shared with other jobs may run it several times slower
TIMEOUT = 1200
MARKER = re.compile(r"^=== (.+) ===$", flags=re.MULTILINE)  # distributed_worker.MARKER
# the thread `start` made the launch in, in the process that claimed it
_starter: threading.Thread | None = None
# the launch's torchrun process while it runs
_running: set[subprocess.Popen] = set()


@dataclass(frozen=True)
class Launch:
    """What the launch left: its runs' files under `folder` (tests/distributed_worker.py's OUT), its exit status
    (None: killed after TIMEOUT s), and its stdout and stderr."""

    folder: Path
    returncode: int | None
    stdout: str
    stderr: str

    def runs(self, stream: str) -> dict[str, str]:
        """The run names in the order they started -> what followed each one's marker on `stream` (`stdout`,
        `stderr`)."""
        parts = MARKER.split(getattr(self, stream))
        return dict(zip(parts[1::2], parts[2::2], strict=True))

    def output(self, run: str) -> str:
        """What run `run` printed: on stdout, then on stderr."""
        return self.runs("stdout").get(run, "") + self.runs("stderr").get(run, "")

    def check(self, job: str, context: str = "") -> None:
        """Fail unless every run of `job` (those named `<job> ...`) ended well: a later run started, or the launch
        ended with status 0 (the last job's `end_processes()`). The message names the run that stopped the launch
        (`context` after it) and gives the tail of its stderr."""
        started = list(self.runs("stderr"))
        mine = [index for index, name in enumerate(started) if name.split()[0] == job]
        if mine and (self.returncode == 0 or mine[-1] < len(started) - 1):
            return
        status = f"was killed after {TIMEOUT} s" if self.returncode is None else f"exited {self.returncode}"
        where = f"in its run '{started[-1]}'" if started else "before its first run"
        tail = self.runs("stderr")[started[-1]] if started else self.stderr
        problem = "did not finish" if mine else "did not run"
        raise AssertionError(
            f"{job} {problem}: the torchrun launch of {WORKER.name} {status} {where}{context}:\n{tail[-5000:]}"
        )


def launch(folder: Path) -> Launch:
    """tests/distributed_worker.py on two CPU processes, its inputs and outputs under `folder` (emptied first); the
    result also in folder/launch.json."""
    return run(prepare(folder), folder)


def prepare(folder: Path) -> list[str]:
    """The launch's inputs under `folder` (emptied first), and its command line."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "inputs").mkdir(parents=True)
    conversion = conversion_inputs(folder / "inputs")
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER),
        str(folder), str(fsdp_recipe_file(folder / "inputs")), str(conversion["weights"]), str(conversion["recipe"]),
    ]  # fmt: skip


def run(command: list[str], folder: Path) -> Launch:
    """The launch, its result written to folder/launch.json. The GPU is hidden from its processes: on a machine with
    one, each would take cuda:<rank> (cuda:1 does not exist on one GPU). Only a subprocess and files: safe in a
    thread beside the tests (the inputs, which draw from torch's global generator, are `prepare`d before)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    pipe = subprocess.PIPE
    with subprocess.Popen(command, cwd=ROOT, stdout=pipe, stderr=pipe, text=True, env=env) as proc:
        _running.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            proc.terminate()
            stdout, stderr = proc.communicate()
            returncode = None
        finally:
            _running.discard(proc)
    result = {"returncode": returncode, "stdout": stdout, "stderr": stderr}
    (folder / "launch.json").write_text(json.dumps(result))
    return Launch(folder, **result)


def finish(interrupted: bool) -> None:
    """At the end of this process's session: wait for a launch it started, which another xdist worker may still be
    about to read (a worker whose own tests are done ends before the others), so that no torchrun outlives pytest
    or loses its pipes half way; an interrupted session ends it instead (SIGTERM, which torchrun passes on to its
    workers)."""
    if interrupted:
        for proc in list(_running):
            proc.terminate()
    if _starter is not None:
        _starter.join()


def _shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every xdist worker of this session sees (the session's basetemp without xdist)."""
    basetemp = tmp_path_factory.getbasetemp()
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def _made_or_make(shared: Path) -> Launch:
    """Under the lock: the launch already made, read from its files, or made now."""
    folder = shared / "distributed_launch"
    with FileLock(shared / "distributed_launch.lock"):
        if (folder / "launch.json").is_file():
            return Launch(folder, **json.loads((folder / "launch.json").read_text()))
        return launch(folder)


def start(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Start the launch in a thread of this process, unless another process of the session claimed it first. The
    lock is taken here, and released by the thread once the launch's files are written."""
    shared = _shared(tmp_path_factory)
    try:
        os.close(os.open(shared / "distributed_launch.claim", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    lock = FileLock(shared / "distributed_launch.lock", thread_local=False)
    lock.acquire()
    folder = shared / "distributed_launch"
    if (folder / "launch.json").is_file():
        lock.release()
        return
    command = prepare(folder)

    def make() -> None:
        try:
            run(command, folder)
        finally:
            lock.release()

    global _starter
    _starter = threading.Thread(target=make, name="distributed-launch", daemon=True)
    _starter.start()


def shared_launch(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """The session's launch: made by `start`'s thread (in this process: waited for here, as a second lock in the
    thread that took the first would deadlock) or, where none started, by the first caller of any xdist worker;
    read by the others."""
    if _starter is not None:
        _starter.join()
    return _made_or_make(_shared(tmp_path_factory))
