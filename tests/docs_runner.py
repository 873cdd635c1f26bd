"""The process that runs the code blocks of README.md and docs/*.md for tests/test_docs.py.

It imports torch, timm, zoo and the tools' modules once (the costly part of a start), then forks a child for
every Python block and every `tools/*.py` command, so each runs in a fresh process of its own without paying for
those imports again.
No tensor is computed here before a fork: a child of a process whose OpenMP threads have run hangs at its first
parallel operation. Network access is refused in every child, as in the tests' `no_network` fixture.

Requests are JSON lines on stdin, one answer line each on stdout:
    {"python": CODE, "name": "README.md:80", "cwd": DIR, "log": FILE, "timeout": S}  -> {"rc": 0, "cpu": 1.5}
    {"argv": ["tools/train.py", ...], "cwd": DIR, "log": FILE, "timeout": S}         -> {"rc": 0, "cpu": 2.3}
(`cpu`: the child's CPU seconds, its own children's included).
A child writes its stdout and stderr to `log`; one that runs past `timeout` seconds is killed (rc -14).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _refuse_network(event: str, args) -> None:
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname"):
        raise RuntimeError(f"network access from a documented command: {event}{args}")


def _preload() -> None:
    """Import what the blocks and tools import (nothing is computed)."""
    import matplotlib

    matplotlib.use("Agg")
    sys.path.insert(0, str(TOOLS))
    import timm  # noqa: F401
    import torch  # noqa: F401

    import zoo.convert.model
    import zoo.evaluate
    import zoo.hub.load  # noqa: F401
    import zoo_bench.leaderboard  # noqa: F401

    sys.path.remove(str(TOOLS))


def _child(request: dict) -> int:
    """Run one request in this (forked) process; its exit status."""
    os.chdir(request["cwd"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    signal.alarm(int(request["timeout"]))
    sys.addaudithook(_refuse_network)
    try:
        if "python" in request:
            # as a pasted script sees it: the folder it runs in first on the path
            sys.argv, sys.path[0] = [request["name"]], request["cwd"]
            # a README block run as a script, as a user pastes it
            exec(compile(request["python"], request["name"], "exec"), {"__name__": "__main__"})  # noqa: S102
        else:
            script, *args = request["argv"]
            # as `python tools/x.py` does: the script's folder first on the path
            sys.argv, sys.path[0] = [script, *args], str(Path(script).resolve().parent)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever the block raised (KeyboardInterrupt too) is its failure
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def main() -> None:
    _preload()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_child(request))
        _, status, usage = os.wait4(pid, 0)
        cpu = usage.ru_utime + usage.ru_stime
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "cpu": round(cpu, 2)}), flush=True)


if __name__ == "__main__":
    main()
