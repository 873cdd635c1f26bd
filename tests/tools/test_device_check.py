"""The device check (tools/device_check.py, `make device-check`) on the CPU at toy sizes, so the GPU path never rots
between leases: every part runs and writes its report, a part that breaks or runs out of time leaves the others'
results, and the summary derives crossovers and speedups from the records."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zoo_bench import device_check
from zoo_bench.device_check import PARTS, Report, bench_summary, run_device_check

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory) -> tuple[Path, dict]:
    """`make device-check DEVICE=cpu` at a twentieth of the CPU budgets: each part's first items run."""
    out = tmp_path_factory.mktemp("device_check")
    command = ["make", "-s", "device-check", "DEVICE=cpu", f"DEVICE_OUT={out}", "DEVICE_SCALE=0.05"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, json.loads((out / "device_check.json").read_text())


def test_make_target_runs_every_part_on_the_cpu(cpu_check):
    out, results = cpu_check
    assert list(results["parts"]) == list(PARTS)
    for name, part in results["parts"].items():
        assert part["status"] == "done", (name, part.get("message"))
        assert part["items"], f"{name} ran no item"
    for name in ("correctness", "flex"):
        assert results["parts"][name]["failed"] == []
    assert all(item["status"] == "ok" for item in results["parts"]["train"]["items"])
    assert all(item["status"] == "ok" for item in results["parts"]["bench"]["items"])
    report = (out / "device_check.md").read_text()
    assert all(f"## {name} (done" in report for name in PARTS)
    assert {"results.json", "results.md", "time.png", "memory.png"} <= {p.name for p in out.iterdir()}


def test_a_part_out_of_time_names_what_it_did_not_run(cpu_check):
    _, results = cpu_check
    correctness = results["parts"]["correctness"]
    ran = [item["variant"] for item in correctness["items"]]
    assert ran and correctness["skipped_for_time"], "a twentieth of the budget cannot cover every variant"
    assert not set(ran) & set(correctness["skipped_for_time"])


def test_a_failing_part_is_reported_and_the_next_part_still_runs(tmp_path, monkeypatch):
    def broken(report: Report, profile) -> None:
        with device_check._budget(report, "correctness", 1.0):
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")

    monkeypatch.setitem(device_check._RUNNERS, "correctness", broken)
    monkeypatch.setitem(device_check._RUNNERS, "bench", lambda report, profile: report.part("bench"))
    results = run_device_check("cpu", tmp_path, ("correctness", "bench"))
    assert results["parts"]["correctness"]["status"] == "failed"
    assert (
        results["parts"]["correctness"]["message"]
        == "RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    assert "bench" in json.loads((tmp_path / "device_check.json").read_text())["parts"]
    assert "## correctness (failed: RuntimeError" in (tmp_path / "device_check.md").read_text()


def _record(variant: str, length: int, seconds: float) -> dict:
    return {"variant": variant, "length": length, "status": "ok", "fwd_bwd_s": seconds}


def test_bench_summary_gives_the_crossover_and_the_speedup_at_the_longest_shared_length():
    records = [_record("softmax", n, t) for n, t in ((1024, 1.0), (4096, 4.0), (16384, 16.0))]
    records += [_record("linear", n, t) for n, t in ((1024, 2.0), (4096, 2.0))]
    summary = bench_summary(records)
    assert summary["linear"]["speedup"] == {"length": 4096, "x": 2.0}
    assert 1024 < summary["linear"]["crossover"]["length"] < 4096
    assert "speedup" not in summary["softmax"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cli_refuses_cuda_without_a_gpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, "tools/device_check.py", "--device", "cuda", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": f"{REPO}:{REPO / 'tools'}", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --device cuda was asked for, but torch.cuda.is_available() is False: use --device cpu"
    ]
