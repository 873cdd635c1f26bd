"""zoo's on-disk caches: where they live, writes that readers never see half done, and a lock for builders.

The standard library and filelock (installed with torch; numpy is imported where an array is written):
``zoo/data/_debian.py`` imports this file when the Makefile runs it as a script, outside the package.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from filelock import FileLock

__all__ = ["cache_dir", "cache_lock", "write_atomic", "write_npz_atomic"]

_logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Folder of on-disk caches: ``$ZOO_CACHE``, else ``$XDG_CACHE_HOME/zoo``, else ``~/.cache/zoo``."""
    if os.environ.get("ZOO_CACHE"):
        return Path(os.environ["ZOO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zoo"


def write_atomic(path: Path, write: Callable[[IO[bytes]], Any]) -> bool:
    """Write ``path`` through ``write(file)`` into a temporary file renamed over it, so that a reader (another
    process, a DataLoader worker) never sees half a file. A failure only logs, since a cache is an optimisation:
    returns whether the file was written."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError as err:
        _logger.warning("could not write the cache %s (%s); set ZOO_CACHE to a writable folder", path, err)
        return False
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_npz_atomic(path: Path, **arrays: Any) -> bool:
    """``numpy.savez`` of ``arrays`` to ``path`` through `write_atomic`."""
    import numpy as np

    return write_atomic(path, lambda f: np.savez(f, **arrays))


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` + ``.lock`` while building that cache entry, so that processes building
    the same data at once (data-parallel ranks, a second run) wait for the first and then read its file. Without
    a writable cache folder it locks nothing (each process then builds for itself)."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        # filelock, where fcntl is POSIX only: an OS lock on every platform, released when the process dies
        lock = FileLock(lock_path)
        lock.acquire()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        lock.release()
