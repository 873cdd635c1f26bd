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
def test_performer_backward_fits_sm90_shared_memory():
    """256 random features: the key backward, the kernel that holds the most, compiled in a fresh process (the
    suite's kernels are interpreted) within sm_90's 227 KB of shared memory. Whole (`favor=32:8::0`), triton 3.8
    asks for 256 KB there, and the launch would fail on the GPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ZOO_FUSED_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tools")])
    command = [sys.executable, "-m", "zoo_bench.kernel_resources", "--maps", "performer"]
    result = subprocess.run([*command, "--kernels", "_key_backward_kernel"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("| performer | _key_backward_kernel"))
    shared = int(row.strip("| ").split(" | ")[-1])
    assert 0 < shared <= kernel_resources.SHARED_LIMIT[90]
