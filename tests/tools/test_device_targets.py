"""The device targets beside the check, on the CPU at toy sizes: `make device-train` (its command, run in this process)
trains each attention for the same wall time and reports its validation top-1 beside its speed and steps;
tools/device_lease.sh, the one command a GPU lease runs, installs carried wheels, runs the check and the tests under
their time limits, and leaves at most 8 files no more than two folders down, on a machine without nvidia-smi too."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import reset_accelerate

from zoo_bench import device_train
from zoo_bench.device_train import RUNS

REPO = Path(__file__).resolve().parents[2]


def test_device_train_trains_each_attention_for_the_same_wall_time(tmp_path, monkeypatch):
    seconds = 0.5
    command = [
        "make", "-n", "-s", "device-train", "DEVICE=cpu", f"DEVICE_OUT={tmp_path}", f"DEVICE_TRAIN_SECONDS={seconds}",
        "DEVICE_VAL_SAMPLES=8",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    line = " ".join(proc.stdout.replace("\\\n", " ").split())
    arguments = f"--device cpu --out {tmp_path} --seconds {seconds} --val-samples 8"
    assert f"-m zoo_bench.device_train {arguments}" in line
    # the command make runs, in this process: a fresh interpreter would spend 10 s importing what this one holds
    monkeypatch.setattr(sys, "argv", ["device_train.py", *arguments.split()])
    device_train.main()
    reset_accelerate()
    results = json.loads((tmp_path / "device_train.json").read_text())
    assert [record["run"] for record in results["runs"]] == list(RUNS)
    for record in results["runs"]:
        assert record["status"] == "ok", record
        # the run ends at the first optimizer step past its time, then is evaluated on the validation canvases
        assert record["train_s"] >= seconds and record["first_step_s"] <= record["train_s"]
        assert record["steps"] >= 1 and record["samples"] == 2 * record["steps"]
        assert record["samples_per_s"] == pytest.approx(record["samples"] / record["train_s"], rel=1e-2)
        # top-1 over 8 canvases: a count of them over 8
        assert record["val_samples"] == 8 and 0 <= record["val_top1"] * 8 <= 8
        assert record["val_top1"] * 8 == pytest.approx(round(record["val_top1"] * 8), abs=1e-5)
    report = (tmp_path / "device_train.md").read_text()
    assert "| val top-1 |" in report and all(f"| {run} | " in report for run in RUNS)


def _wheel(folder: Path) -> Path:
    """A wheel of one module, `leaseprobe`, as a carried package would be."""
    folder.mkdir()
    path = folder / "leaseprobe-0.1-py3-none-any.whl"
    info = "leaseprobe-0.1.dist-info"
    files = {
        "leaseprobe.py": "VALUE = 1\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: leaseprobe\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(name, text)
    return path


def _lease(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    variables = {
        "OUT": str(out),
        "DEVICE": "cpu",
        "PYTHON": sys.executable,
        "WHEELS": str(tmp_path / "wheels"),
        "SITE": str(tmp_path / "site"),
        **env,
    }
    proc = subprocess.run(
        ["tools/device_lease.sh"],
        cwd=REPO,
        env={**os.environ, **variables},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    return proc, out


@pytest.mark.slow
def test_the_lease_runs_the_check_and_the_tests_and_returns_at_most_8_files(tmp_path):
    wheel = _wheel(tmp_path / "wheels")
    # a kernel profile's pick (on a GPU the lease's own profile writes it): the check runs with it and records it
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kernel_profile.json").write_text(json.dumps({"cases": [], "fastest_config": "elu=64:8"}))
    proc, out = _lease(
        tmp_path,
        ZOO_FUSED_CONFIG="",
        DEVICE_PARTS="correctness",
        TEST_TIMEOUT="120",
        DEVICE_TEST_ARGS="",
        # a test whose module imports no more than torch: the plumbing is checked, not zoo
        DEVICE_TESTS="tests/test_layers.py::test_a_new_top_level_folder_has_no_layer_until_listed",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    files = [path.relative_to(out) for path in out.rglob("*") if path.is_file()]
    assert sorted(map(str, files)) == [
        "check.tar.gz", "device_check.json", "device_check.md", "kernel_profile.json", "lease.log", "test.log"
    ]  # fmt: skip
    with tarfile.open(out / "check.tar.gz") as archive:
        assert "check/device_check.json" in archive.getnames()
    check = json.loads((out / "device_check.json").read_text())
    assert check["parts"]["correctness"]["status"] == "done"
    assert check["environment"]["ZOO_FUSED_CONFIG"] == "elu=64:8"
    log = (out / "lease.log").read_text()
    assert log == proc.stdout
    assert wheel.name in log and (tmp_path / "site" / "leaseprobe.py").is_file()
    if shutil.which("nvidia-smi") is None:
        assert "no nvidia-smi on this machine" in log
    assert "== device-check: exit status 0" in log and "== device-test: exit status 0" in log
    assert "== device-train: skipped (timeout 0)" in log and log.rstrip().endswith("== lease exit status 0")
    assert "1 passed" in (out / "test.log").read_text()


@pytest.mark.slow
def test_a_step_past_its_time_limit_is_stopped_and_the_lease_says_so(tmp_path):
    proc, out = _lease(tmp_path, CHECK_TIMEOUT="1", TEST_TIMEOUT="0", DEVICE_TEST_ARGS="")
    assert proc.returncode == 1
    log = (out / "lease.log").read_text()
    assert "== device-check: stopped at its limit after" in log and "== device-test: skipped (timeout 0)" in log
    assert log.rstrip().endswith("== lease exit status 1")
    assert not (out / "check").exists()
