"""The fused kernels compiled for an H100 / H200 (sm_90) without a GPU (`dev.kernel_resources`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dev import kernel_resources

ROOT = Path(__file__).resolve().parents[2]
triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
# the kernels that hold the most at the shipped maps' defaults: performer's keys, hedgehog's queries
LARGEST = (("performer", "_key_backward_kernel"), ("hedgehog", "_query_backward_kernel"))
# what an H200 compiled the same kernels with (triton 3.6, at the layouts that are the defaults now)
H200_PROFILE = ROOT / "benchmarks" / "nvidia-h200" / "chunked" / "kernel_profile.json"
H200_LAYOUTS = {"performer": "favor=64:8:bf16:64", "hedgehog": "hedgehog=32:8:bf16:0"}


@pytest.mark.skipif(not PTXAS.exists(), reason="this triton ships no CUDA backend to compile with")
def test_the_largest_backward_kernels_fit_sm90_shared_memory():
    """`LARGEST`, compiled at their default layouts in a fresh process (the suite's kernels are interpreted), each
    within sm_90's 227 KB of shared memory, and each asking for the bytes the H200 compiled it with: the launch's
    arguments are specialised as triton's launcher specialises them (unspecialised, performer's key backward asks
    for several times the H200's). With 256 features whole in three pipeline stages the request passes sm_90's
    limit (benchmarks/cpu/kernel_resources_sm90.md): that launch fails on the GPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ZOO_FUSED_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tools")])
    code = (
        "import json, sys\nfrom dev.kernel_resources import resources\n"
        f"print(json.dumps([resources(m, 90, (k,))[0]._asdict() for m, k in {LARGEST!r}]))"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert [row["kernel"] for row in found] == [kernel for _, kernel in LARGEST]
    on_h200 = {case["config"]: case["resources"] for case in json.loads(H200_PROFILE.read_text())["cases"]}
    for (name, kernel), row in zip(LARGEST, found, strict=True):
        assert 0 < row["shared"] <= kernel_resources.SHARED_LIMIT[90], row
        assert row["shared"] == on_h200[H200_LAYOUTS[name]][kernel]["shared"], row
