"""The device targets beside the check, on the CPU at toy sizes: `make device-train` (its command, run in this process)
trains each attention for the same wall time and reports its validation top-1 beside its speed and steps;
`make device-site` installs carried wheels where the device targets find them; tools/device_check.py takes its time
budgets and a kernel profile's layouts as options, and writes everything into one folder."""

import importlib.util
import json
import os
import subprocess
import sys
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
    # the command make runs, in this process: a fresh interpreter would import again what this one holds
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
    """A wheel of one module, `siteprobe`, as a carried package would be."""
    folder.mkdir()
    path = folder / "siteprobe-0.1-py3-none-any.whl"
    info = "siteprobe-0.1.dist-info"
    files = {
        "siteprobe.py": "VALUE = 1\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: siteprobe\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(name, text)
    return path


def _make(*arguments: str) -> str:
    proc = subprocess.run(["make", "-s", *arguments], cwd=REPO, capture_output=True, text=True, check=True)
    return " ".join(proc.stdout.replace("\\\n", " ").split())


def test_carried_wheels_install_into_the_site_the_device_targets_put_first(tmp_path):
    _wheel(tmp_path / "wheels")
    site = tmp_path / "site"
    variables = [f"DEVICE_WHEELS={tmp_path / 'wheels'}", f"DEVICE_SITE={site}", f"CHECK_PY={sys.executable}"]
    _make("device-site", *variables)
    assert (site / "siteprobe.py").is_file()
    line = _make("-n", "device-check", "DEVICE=cpu", "DEVICE_OUT=out", *variables)
    assert f"PYTHONPATH={site}:.:tools" in line
    # no site: the path is the checkout's alone
    assert "PYTHONPATH=.:tools " in _make("-n", "device-check", "DEVICE=cpu", f"DEVICE_SITE={tmp_path / 'none'}")


def test_make_passes_budgets_and_a_profiled_layout_to_the_check():
    line = _make(
        "-n", "device-check", "DEVICE=cpu", "DEVICE_BUDGETS=train=3 bench=4", "DEVICE_FUSED_CONFIG_FROM=p.json"
    )
    assert "--budget train=3 --budget bench=4 --fused-config-from p.json" in line
    assert "-m dev.kernel_profile --device cpu --out d" in _make("-n", "device-profile", "DEVICE=cpu", "DEVICE_OUT=d")


def _device_check_cli():
    spec = importlib.util.spec_from_file_location("device_check_cli", REPO / "tools" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_budgets_name_a_part_and_a_positive_number():
    cli = _device_check_cli()
    assert cli.parse_budgets(["train=300", "bench=1.5"]) == {"train": 300.0, "bench": 1.5}
    for item, says in (("trian=3", "unknown part 'trian'"), ("train=x", "a number"), ("train=0", "> 0")):
        with pytest.raises(ValueError, match=says):
            cli.parse_budgets([item])


def test_a_kernel_profile_chooses_the_layout_unless_one_is_set(tmp_path, monkeypatch):
    cli = _device_check_cli()
    profile = tmp_path / "kernel_profile.json"
    profile.write_text(json.dumps({"cases": [], "fastest_config": "elu=64:8"}))
    monkeypatch.delenv("ZOO_FUSED_CONFIG", raising=False)
    cli.use_profiled_config(str(profile))
    assert os.environ["ZOO_FUSED_CONFIG"] == "elu=64:8"
    monkeypatch.setenv("ZOO_FUSED_CONFIG", "favor=32:8")
    cli.use_profiled_config(str(profile))
    assert os.environ["ZOO_FUSED_CONFIG"] == "favor=32:8"
    monkeypatch.delenv("ZOO_FUSED_CONFIG")
    with pytest.raises(ValueError, match="no such file"):
        cli.use_profiled_config(str(tmp_path / "missing.json"))


@pytest.mark.slow
def test_the_check_records_the_profiled_layout_and_honours_a_budget(tmp_path):
    """The command a GPU machine runs, end to end on the CPU: one part, its budget given, the profile's layout."""
    profile = tmp_path / "kernel_profile.json"
    profile.write_text(json.dumps({"cases": [], "fastest_config": "elu=64:8"}))
    env = {k: v for k, v in os.environ.items() if k != "ZOO_FUSED_CONFIG"}
    command = [
        sys.executable, "tools/device_check.py", "--device", "cpu", "--out", str(tmp_path / "out"),
        "--parts", "correctness", "--budget", "correctness=2", "--fused-config-from", str(profile),
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads((tmp_path / "out" / "device_check.json").read_text())
    assert check["parts"]["correctness"]["status"] == "done"
    assert check["parts"]["correctness"]["budget_s"] == 2
    assert check["environment"]["ZOO_FUSED_CONFIG"] == "elu=64:8"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["device_check.json", "device_check.md"]
