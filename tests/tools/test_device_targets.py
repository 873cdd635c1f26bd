"""The device targets beside the check, on the CPU at toy sizes: `make device-train` (its command, run in this process)
trains each attention of a comparison for the same wall time and writes its validation curve, the Trainer's own
evaluations, and which attention reached softmax's final metric first;
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
from zoo_bench.device_report import reached
from zoo_bench.device_train import GROUPS, RUNS, SEG_RUNS, plan

REPO = Path(__file__).resolve().parents[2]


def test_device_train_plans_the_image_segmentation_and_long_comparisons():
    runs = plan("cpu")
    by_group = {group: [run.name for run in runs if run.group == group] for group in GROUPS}
    assert by_group["vit_1024"] == list(RUNS)
    assert by_group["seg_1024"] == ["seg_softmax_1024", *SEG_RUNS]
    # the long part's runs of the device check, each beside softmax (linear beside a softmax recipe)
    assert by_group["genomes"] == ["genomes_softmax", "genomes"]
    assert by_group["lra_listops"] == ["lra_listops", "lra_listops_linear"]
    assert by_group["lra_pathx"] == ["lra_pathx", "lra_pathx_linear"]
    for run in runs:
        softmax = next(item for item in runs if item.name == run.softmax)
        assert softmax.group == run.group
    assert "model.attention.name=softmax" in next(run for run in runs if run.name == "seg_softmax_1024").overrides
    # on CUDA the recipes' own sizes: no toy override, and genomes at the check's 64 kb window
    cuda = {run.name: run for run in plan("cuda")}
    assert "model.img_size=224" not in cuda["seg_window2d_1024"].overrides
    assert "data.options.window=65536" in cuda["genomes"].overrides
    with pytest.raises(ValueError, match="unknown comparison 'vit'.*vit_1024"):
        plan("cpu", ("vit",))


def _curve(*points):
    return [{"train_s": t, "step": i + 1, "val": v} for i, (t, v) in enumerate(points)]


def test_the_first_to_reach_softmax_final_metric_is_named_with_its_time():
    common = {"status": "ok", "softmax": "s", "metric": "top1", "higher_is_better": True}
    items = [
        {**common, "run": "s", "val": 0.8, "curve": _curve((30, 0.5), (60, 0.8), (90, 0.8))},
        {**common, "run": "w", "val": 0.85, "curve": _curve((30, 0.7), (60, 0.81), (90, 0.85))},
        {**common, "run": "p", "val": 0.6, "curve": _curve((30, 0.2), (60, 0.4), (90, 0.6))},
    ]
    race = reached(items)
    assert race["target"] == 0.8 and race["times"] == {"s": 60, "w": 60, "p": None}
    # a tie goes to softmax; one step earlier and the window wins
    assert race["first"] == "s"
    items[1]["curve"][0]["val"] = 0.8
    assert reached(items)["first"] == "w" and reached(items)["times"]["w"] == 30
    # a loss: lower is better
    curves = {"s": ((30, 2.0), (60, 1.0), (90, 0.9)), "w": ((30, 1.5), (60, 0.8), (90, 0.7)), "p": ((90, 1.2),)}
    losses = [{**item, "higher_is_better": False, "val": curves[item["run"]][-1][1]} for item in items]
    losses = [{**item, "curve": _curve(*curves[item["run"]])} for item in losses]
    assert reached(losses)["times"] == {"s": 90, "w": 60, "p": None} and reached(losses)["first"] == "w"
    assert reached(items[1:]) is None


def test_device_train_writes_each_run_curve_as_its_evaluations_scored(tmp_path, monkeypatch):
    seconds, groups = 0.5, ("seg_1024", "lra_listops")
    command = [
        "make", "-n", "-s", "device-train", "DEVICE=cpu", f"DEVICE_OUT={tmp_path}", f"DEVICE_TRAIN_SECONDS={seconds}",
        "DEVICE_VAL_SAMPLES=8", "DEVICE_TRAIN_POINTS=2", f"DEVICE_TRAIN_GROUPS={' '.join(groups)}",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    line = " ".join(proc.stdout.replace("\\\n", " ").split())
    arguments = (
        f"--device cpu --out {tmp_path} --seconds {seconds} --val-samples 8 --points 2 --groups {' '.join(groups)}"
    )
    assert f"-m zoo_bench.device_train {arguments}" in line
    # the command make runs, in this process: a fresh interpreter would import again what this one holds
    monkeypatch.setattr(sys, "argv", ["device_train.py", *arguments.split()])
    device_train.main()
    reset_accelerate()
    results = json.loads((tmp_path / "device_train.json").read_text())
    planned = [run.name for run in plan("cpu") if run.group in groups]
    assert [record["run"] for record in results["runs"]] == planned
    report = (tmp_path / "device_train.md").read_text()
    for record in results["runs"]:
        assert record["status"] == "ok", record
        # the run ends at the first optimizer step past its time, then is evaluated on the validation samples
        assert record["train_s"] >= seconds and record["first_step_s"] <= record["train_s"]
        assert record["steps"] >= 1 and record["samples"] == 2 * record["steps"]
        assert record["samples_per_s"] == pytest.approx(record["samples"] / record["train_s"], rel=1e-2)
        assert record["metric"] == ("miou" if record["group"] == "seg_1024" else "top1")
        # the curve is the Trainer's own evaluations (metrics.jsonl): one per mark passed, the last the run's end
        rows = [json.loads(row) for row in (tmp_path / "runs" / f"{record['run']}.metrics.jsonl").open()]
        assert [(p["step"], p["val"]) for p in record["curve"]] == [
            (r["step"], r[f"val_{record['metric']}"]) for r in rows
        ]
        assert rows[-1]["step"] == record["steps"] and record["curve"][-1]["val"] == record["val"]
        times = [point["train_s"] for point in record["curve"]]
        assert times == sorted(times) and times[-1] == pytest.approx(record["train_s"], abs=0.01)
        assert all(seconds / 2 <= time_s < seconds for time_s in times[:-1])
        # top-1 over 8 samples: a count of them over 8
        if record["metric"] == "top1":
            assert record["val"] * 8 == pytest.approx(round(record["val"] * 8), abs=1e-5)
        assert f"| {record['run']} | " in report
    for group in groups:
        # the first to reach softmax's final metric, from the evaluations' rows alone
        items = [record for record in results["runs"] if record["group"] == group]
        target = items[0]["val"]
        first = min(
            (next(p["train_s"] for p in item["curve"] if p["val"] >= target), order, item["run"])
            for order, item in enumerate(items)
            if any(p["val"] >= target for p in item["curve"])
        )
        assert (
            f"validation {items[0]['metric']} ({target:.4f}, `{items[0]['run']}`): **{first[2]}**, at {first[0]:.1f} s"
            in report
        )
        assert (tmp_path / f"device_train_{group}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{group}](device_train_{group}.png)" in report


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


def _race_run(run, attention, points, group="vit_1024", softmax="vit_softmax_1024"):
    curve = _curve(*points)
    return {
        "run": run, "attention": attention, "group": group, "softmax": softmax, "status": "ok", "metric": "top1",
        "higher_is_better": True, "val": curve[-1]["val"], "curve": curve,
    }  # fmt: skip


def test_the_cards_and_choose_page_read_a_committed_gpu_run_or_name_its_command(tmp_path, monkeypatch):
    from zoo_bench import _results, cards, choose

    monkeypatch.setattr(_results, "GPU_QUALITY", (str(tmp_path / "none.json"),))
    assert cards._gpu_quality([], "window2d") is None
    assert choose._gpu_quality() == [
        "Not measured; `make device-train DEVICE_OUT=benchmarks/<gpu>` measures it on a GPU."
    ]
    runs = [
        _race_run("vit_softmax_1024", "softmax", ((30, 0.5), (60, 0.7), (90, 0.8))),
        _race_run("vit_window2d_global_1024", "window2d", ((30, 0.6), (60, 0.82), (90, 0.85))),
        _race_run("vit_performer_1024", "performer", ((30, 0.3), (60, 0.5), (90, 0.6))),
    ]
    committed = tmp_path / "device_train.json"
    committed.write_text(json.dumps({"device_name": "GPU X", "seconds": 90, "runs": runs}))
    monkeypatch.setattr(_results, "GPU_QUALITY", (str(committed),))
    # the window reached softmax's final 0.8 at 60 s, softmax itself at 90 s: 1.5x its pace
    fact = cards._gpu_quality([], "window2d")
    assert fact.value == pytest.approx(1.5) and "reached at 60 s (softmax 90 s)" in fact.text
    assert cards._gpu_quality([], "performer").value == 0.0
    assert "the reference, top1 0.800 at 90 s" in cards._gpu_quality([], "softmax").text
    assert "1.50x softmax's pace" in cards.pick_this_when("window2d", {"GPU quality per minute": fact})
    (line,) = choose._gpu_quality()
    assert "`vit_window2d_global_1024` first" in line and "`vit_performer_1024` (performer) never" in line
