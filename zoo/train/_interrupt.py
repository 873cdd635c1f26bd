"""Ctrl-C and SIGTERM during training: the first one finishes the current optimizer step, writes `checkpoints/last`
and stops the run (`TrainingInterrupted`); a second one stops it at once.

A cluster's scheduler sends SIGTERM before it kills a job, and a user presses Ctrl-C: either way the steps since the
last checkpoint are worth keeping. The handler only records the signal; the Trainer reads it at the end of every
optimizer step (`StopSignals.requested`), where the weights, the optimizer and the loader's place are consistent, so
that `--resume` continues exactly where an uninterrupted run would be. Under several processes the request is
all-reduced, so every process stops after the same step (a terminal's Ctrl-C reaches all of them, a scheduler's
SIGTERM perhaps one). Handlers are installed only in the main thread (Python allows no other) and the previous ones
are put back when training ends.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator

__all__ = ["SIGNALS", "StopSignals", "TrainingInterrupted"]

_logger = logging.getLogger(__name__)

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """The run stopped on a signal after a step, once `checkpoints/last` held that step; `exit_code` is the shell's
    status for that signal (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + int(signum)


class StopSignals:
    """A context in which SIGINT and SIGTERM ask the run to stop after its current step; a second signal raises
    KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            self._restore()
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: stopped at once, nothing saved")
        self.received = signum
        # stderr at once (the log handler may buffer): the user sees that the key press was taken
        print(
            f"\n{signal.Signals(signum).name}: finishing this step, then saving checkpoints/last "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def requested(self, accelerator: Accelerator) -> int | None:
        """The signal that asked this run to stop, on any process (a collective under several processes: every
        process calls it after every optimizer step), else None."""
        if accelerator.num_processes == 1:
            return self.received
        signum = torch.tensor([self.received or 0], device=accelerator.device)
        dist.all_reduce(signum, op=dist.ReduceOp.MAX)
        return int(signum.item()) or None
