"""The fused kernels compiled for an H100 / H200 (sm_90) without a GPU (`zoo_bench.kernel_resources`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoo_bench import kernel_resources

ROOT = Path(__file__).resolve().parents[2]
triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this triton ships no CUDA backend to compile with")
def test_the_largest_backward_kernels_fit_sm90_shared_memory():
    """The two backward kernels that hold the most (performer's keys, hedgehog's queries), compiled at their default
    layouts in a fresh process (the suite's kernels are interpreted), each within sm_90's 227 KB of shared memory.
    With 256 features whole (`favor=32:8::0`), or hedgehog's 128 in tiles of 64 rows, triton 3.8 asks for 256 KB
    and 241 KB: those launches fail on the GPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ZOO_FUSED_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tools")])
    kernels = ["--kernels", "_key_backward_kernel", "_query_backward_kernel"]
    command = [sys.executable, "-m", "zoo_bench.kernel_resources", "--maps", "performer", "hedgehog", *kernels]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| performer")]
    rows += [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| hedgehog")]
    assert len(rows) == 4, result.stdout
    for row in rows:
        assert 0 < int(row[-1]) <= kernel_resources.SHARED_LIMIT[90], row
