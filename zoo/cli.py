"""Shared plumbing for the `tools/` command lines: user errors become one line on stderr and exit code 2."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

__all__ = ["run_cli"]

# Errors that mean "the input is wrong", not "zoo is broken": shown without a traceback.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, ImportError)


def run_cli(main: Callable[[], object]) -> None:
    """Run `main`; a user error prints `error: ...` and exits 2 (set ZOO_DEBUG=1 for the traceback)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # accelerate logs every file of every checkpoint at INFO
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    try:
        main()
    except USER_ERRORS as error:
        if os.environ.get("ZOO_DEBUG"):
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
