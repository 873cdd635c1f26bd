"""zoo.data._cache.cache_lock: another process cannot take a cache entry's lock while one holds it, and takes it
once it is released (filelock, on every platform); an unwritable cache folder locks nothing."""

import subprocess
import sys

from zoo.data._cache import cache_lock

# another process trying the lock for 0.2 s: prints "held" when it times out, "free" when it gets it
PROBE = """
import sys
from filelock import FileLock, Timeout
try:
    with FileLock(sys.argv[1], timeout=0.2):
        print("free")
except Timeout:
    print("held")
"""


def probe(lock_path) -> str:
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(lock_path)], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_the_lock_keeps_another_process_out_until_released(tmp_path):
    entry = tmp_path / "cache" / "data.npz"
    lock_path = tmp_path / "cache" / "data.npz.lock"
    with cache_lock(entry):
        assert probe(lock_path) == "held"
    assert probe(lock_path) == "free"


def test_an_unwritable_cache_folder_locks_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    ran = []
    with cache_lock(blocker / "sub" / "data.npz"):
        ran.append(True)
    assert ran == [True]
