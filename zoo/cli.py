"""Shared plumbing for the `tools/` command lines: every error a user can cause is one line on stderr.

- A user error (a bad recipe, path, data file, checkpoint or weights file, a full disk, a missing package, a loss
  that turned NaN, out of GPU memory) prints `error: <what and where>` and exits 2.
- Anything else is a bug in zoo: one line saying so and where its traceback was written, exit 1.
- Ctrl-C prints `interrupted` and exits 130; a training run stopped by its first SIGINT or SIGTERM after saving
  (`zoo.train._interrupt.TrainingInterrupted`) prints what it saved and how to resume, and exits 130 or 143.

`--debug` on the command line (or `ZOO_DEBUG=1`) prints the full traceback of every error instead. Once a tool
knows its run directory it calls `log_to(run_dir / "train.log")`: log records and the traceback of every error go
there too, whatever the flags. Errors raised in a DataLoader worker (which torch re-raises wrapped in a message of
the worker's traceback) are reported by their original message and type.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from ._validate import first_line

__all__ = ["USER_ERRORS", "add_overrides", "log_to", "one_line", "run_cli"]

# Errors that mean "the input or the machine is wrong", not "zoo is broken": shown as one line. ValueError covers
# zoo's own (RecipeError, WeightsError, CheckpointError, ImageError, NonFiniteError); OSError a missing file, a
# permission, a full disk.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError)
# Raised by torch; a user's batch size or model size, not a bug.
_USER_ERROR_NAMES = ("OutOfMemoryError",)
_WORKER_MARK = "Original Traceback (most recent call last):"
# The last line of a traceback: `package.module.SomeError: message`
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.*)$")

_log_file: Path | None = None


def add_overrides(parser: argparse.ArgumentParser, help: str, dest: str = "overrides") -> None:
    """The tools' `--set KEY=VALUE ...` (repeatable, values read as YAML) into `args.<dest>`, a list."""
    parser.add_argument("--set", dest=dest, nargs="+", action="extend", default=[], metavar="KEY=VALUE", help=help)


def log_to(path: str | Path) -> Path:
    """Also write log records, and the traceback of any error, to `path` (a process other than the first of a
    multi-process run writes `<stem>.rank<N><suffix>` beside it). Returns the file used."""
    global _log_file
    path = Path(path)
    rank = int(os.environ.get("RANK", "0") or 0)
    if rank:
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger(__name__).info("command: %s", " ".join(sys.argv))
    _log_file = path
    return path


def one_line(error: BaseException) -> str:
    """The first line of `error`'s message (of the original error for one re-raised from a DataLoader worker)."""
    text = str(error).strip()
    if _WORKER_MARK in text:
        found = _worker_error(text)
        if found is not None:
            text = found[1].strip()
    if isinstance(error, KeyError) and text.startswith(("'", '"')):
        text = text[1:-1]
    return first_line(ValueError(text), type(error).__name__)


def _worker_error(text: str) -> tuple[str, str] | None:
    """`(type name, message)` of the error a DataLoader worker's traceback ends with."""
    for line in reversed(text[text.index(_WORKER_MARK) :].splitlines()):
        found = _EXCEPTION_LINE.match(line.strip())
        if found and not line.startswith(" "):
            return found.group(1), found.group(2)
    return None


def _is_user_error(error: BaseException) -> bool:
    if isinstance(error, USER_ERRORS) or type(error).__name__ in _USER_ERROR_NAMES:
        return True
    text = str(error)
    found = _worker_error(text) if _WORKER_MARK in text else None
    # torch re-raises a worker's error as RuntimeError when its class takes other arguments (ImageError)
    return found is not None and _names_user_error(found[0])


def _names_user_error(name: str) -> bool:
    """Whether the exception class `name` (`pkg.module.Class` or a builtin) is one of USER_ERRORS."""
    module, _, cls = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module or "builtins"), cls, None)
    except ImportError:
        return False
    return isinstance(found, type) and (issubclass(found, USER_ERRORS) or cls in _USER_ERROR_NAMES)


def _write_traceback(error: BaseException) -> Path | None:
    """The traceback of `error` appended to the log file (a new file in the temp folder without one)."""
    try:
        if _log_file is not None:
            path = _log_file
            handle = path.open("a", encoding="utf-8")
        else:
            fd, name = tempfile.mkstemp(prefix="zoo-error-", suffix=".log")
            path, handle = Path(name), os.fdopen(fd, "w", encoding="utf-8")
        with handle:
            handle.write(f"command: {' '.join(sys.argv)}\n")
            traceback.print_exception(error, file=handle)
        return path
    except OSError:
        # a full disk or a read-only folder: the one-line message still goes out
        return None


def _debug() -> bool:
    return "--debug" in sys.argv[1:] or os.environ.get("ZOO_DEBUG", "") not in ("", "0")


def run_cli(main: Callable[[], object]) -> None:
    """Run `main`; a user error prints `error: ...` and exits 2, a bug prints one line naming the file that holds
    its traceback and exits 1 (`--debug` or ZOO_DEBUG=1: the traceback itself)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # accelerate logs every file of every checkpoint at INFO
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    try:
        main()
    except KeyboardInterrupt as error:
        if _log_file is not None:
            _write_traceback(error)
        if _debug():
            raise
        print(str(error) or "interrupted", file=sys.stderr)
        sys.exit(getattr(error, "exit_code", 130))
    except Exception as error:
        user = _is_user_error(error)
        # a bug's traceback is always kept; a user error's only in the run's log (no temporary file per typo)
        logged = _write_traceback(error) if _log_file is not None or not user else None
        if _debug():
            raise
        if user:
            hint = " (lower data.batch_size or the model size)" if "OutOfMemoryError" in type(error).__name__ else ""
            print(f"error: {one_line(error)}{hint}", file=sys.stderr)
            sys.exit(2)
        where = f"its traceback is in {logged}" if logged else "rerun with --debug for its traceback"
        print(
            f"error: internal error, a bug in zoo ({type(error).__name__}: {one_line(error)}); {where}", file=sys.stderr
        )
        sys.exit(1)
