"""The device check (tools/device_check.py, `make device-check`) on the CPU at toy sizes, so the GPU path never rots
between GPU runs: every part runs and writes its report, every shipped 1024-px recipe trains and is compared with
softmax, the sweep runs at both batch sizes, the compiled and long runs are recorded, a part that breaks or runs out
of time leaves the others' results, and the summary derives crossovers and speedups from the records."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import compiled_flex, reset_accelerate

from zoo.attention import _flex, list_attentions
from zoo.config import RecipeError
from zoo_bench import device_check, device_parts, device_runs
from zoo_bench.device_check import PARTS, Report, bench_summary, part_budget, profile_for, run_device_check
from zoo_bench.device_runs import FIRST, StandIn, stand_in_data, vit_runs

REPO = Path(__file__).resolve().parents[2]
VIT_RECIPES = sorted(path.stem for path in (REPO / "recipes").glob("vit_*_1024.yaml"))


class _ItemClock(device_parts.Clock):
    """The CPU profile's budgets counted in items, not seconds, so that what runs never depends on how fast or busy
    the machine is: a budget under a second (correctness, flex) lets one item through, any other every item."""

    def over(self) -> bool:
        return self.seconds <= 1.0 and len(self.laps) >= 1


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory) -> tuple[Path, dict]:
    """The device check on the CPU profile, in this process, with the budgets counted in items (`_ItemClock`):
    correctness and flex cut to their first items, every training run and the sweep's kernel families at both
    batch sizes let through; FlexAttention compiled on the suite's backend (`helpers.compiled_flex`)."""
    out = tmp_path_factory.mktemp("device_check")
    flex = compiled_flex()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(device_parts, "Clock", _ItemClock)
        patch.setattr(_flex, "_compiled_flex", lambda: flex)
        run_device_check("cpu", out, PARTS)
    reset_accelerate()
    return out, json.loads((out / "device_check.json").read_text())


def test_make_target_runs_the_tool_on_the_cpu_profile(tmp_path):
    command = ["make", "-n", "-s", "device-check", "DEVICE=cpu", f"DEVICE_OUT={tmp_path}", "DEVICE_SCALE=2"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    line = " ".join(proc.stdout.replace("\\\n", " ").split())
    assert f"tools/device_check.py --device cpu --out {tmp_path} --budget-scale 2" in line


def test_every_part_runs_on_the_cpu(cpu_check):
    out, results = cpu_check
    assert list(results["parts"]) == list(PARTS)
    for name, part in results["parts"].items():
        assert part["status"] == "done", (name, part.get("message"))
        assert part["items"], f"{name} ran no item"
    for name in ("correctness", "flex", "train", "long"):
        assert results["parts"][name]["failed"] == [], name
    assert all(item["status"] == "ok" for item in results["parts"]["bench"]["items"])
    report = (out / "device_check.md").read_text()
    assert all(f"## {name} (done" in report for name in PARTS)
    assert {"results.json", "results.md", "time.png", "memory.png"} <= {p.name for p in out.iterdir()}


def test_every_shipped_1024_px_recipe_trains_and_is_compared_with_softmax(cpu_check):
    out, results = cpu_check
    train = results["parts"]["train"]
    assert "skipped_for_time" not in train
    runs = {item["run"]: item for item in train["items"]}
    assert set(VIT_RECIPES) <= set(runs)
    assert runs["vit_softmax_1024"]["vs_softmax"] == 1.0
    for stem in VIT_RECIPES:
        item = runs[stem]
        assert item["ok"] and item["recipe"] == f"recipes/{stem}.yaml", item
        assert item["data"] == "real" and item["samples_per_s"] > 0
        # run eagerly (named, as a recipe may compile by itself), but docs/choose.md's command is the recipe's own
        assert "compile" not in item and not any(o.startswith("train.compile") for o in item["overrides"])
        # the ratio is the two measured rates', not a number of its own
        assert item["vs_softmax"] == pytest.approx(
            item["samples_per_s"] / runs["vit_softmax_1024"]["samples_per_s"], rel=1e-2
        )
    # softmax first, then the GPU work's families in their order (a recipe's layout variants right after it); the
    # 2048-px runs last, against softmax at 2048
    order = [item["run"] for item in train["items"]]
    for variant, (stem, overrides) in device_runs.VARIANTS.items():
        siblings = [other for other, (of, _) in device_runs.VARIANTS.items() if of == stem]
        start = order.index(stem) + 1
        assert order[start : start + len(siblings)] == siblings
        assert runs[variant]["ok"] and runs[variant]["recipe"] == f"recipes/{stem}.yaml", runs[variant]
        assert set(overrides) <= set(runs[variant]["overrides"])
    order = [run for run in order if run not in device_runs.VARIANTS]
    first = [f"vit_{name}_1024" for name in FIRST if f"vit_{name}_1024" in runs]
    assert order[: len(first)] == first and order[-2:] == ["vit_softmax_2048", "vit_window2d_global_2048"]
    assert (
        runs["vit_softmax_2048"]["vs_softmax"] == 1.0
        and runs["vit_softmax_2048"]["tokens"] > runs["vit_softmax_1024"]["tokens"]
    )
    assert all(value is not None for value in train["ratios"].values())
    table = (out / "device_check.md").read_text().split("## train")[1].split("## bench")[0]
    for stem in order:
        assert f"| {stem} | " in table, stem


def test_the_naflex_recipe_trains_at_native_size_beside_its_square_recipe(cpu_check):
    """recipes/naflex_*_1024.yaml train at the CPU's NaFlex toy sizes, after the 1024-px recipes and before the
    2048-px ones, their tokens/s (valid tokens only, within the sample budget) over the square recipe's."""
    out, results = cpu_check
    items = results["parts"]["train"]["items"]
    runs, order = {item["run"]: item for item in items}, [item["run"] for item in items]
    stems = sorted(path.stem for path in (REPO / "recipes").glob("naflex_*_1024.yaml"))
    assert "naflex_linear_1024" in stems
    toy = profile_for("cpu").naflex_overrides
    for stem in stems:
        item = runs[stem]
        assert item["ok"] and item["recipe"] == f"recipes/{stem}.yaml" and set(toy) <= set(item["overrides"]), item
        square = runs[item["square"]]
        assert item["square"] == "vit_" + stem.removeprefix("naflex_") and square["ok"]
        assert order.index(stem) > order.index(item["square"]) and order.index(stem) < order.index("vit_softmax_2048")
        # at most 196 patches a sample (data.options.max_tokens) and 4 register tokens
        assert 0 < item["tokens"] <= 196 + 4 and 0 <= item["padding_share"] < 1
        assert item["tokens_per_s"] == pytest.approx(item["batch_size"] * item["tokens"] / item["step_s"], rel=2e-2)
        assert item["vs_square"] == pytest.approx(item["tokens_per_s"] / square["tokens_per_s"], rel=1e-2)
    table = (out / "device_check.md").read_text().split("## train")[1].split("## bench")[0]
    assert all(f"| {stem} | " in table for stem in stems)


def test_a_family_without_a_recipe_runs_as_the_softmax_recipe_with_its_attention_swapped(cpu_check):
    _, results = cpu_check
    runs = {item["run"]: item for item in results["parts"]["train"]["items"]}
    for name in FIRST:
        if f"vit_{name}_1024" not in VIT_RECIPES and name in list_attentions():
            item = runs[f"vit_{name}_1024"]
            assert item["ok"] and item["attention"] == name and item["recipe"] == "recipes/vit_softmax_1024.yaml"


def test_the_sweep_runs_at_batch_1_and_8(cpu_check):
    out, results = cpu_check
    bench = results["parts"]["bench"]
    for batch in (1, 8):
        timed = {item["variant"] for item in bench["items"] if item["batch"] == batch}
        assert {"softmax", "linear"} <= timed, batch
    assert set(bench["summary_by_batch"]) == {"1", "8"}
    assert "batch 8: speedup" in (out / "device_check.md").read_text()
    batch8 = json.loads((out / "batch8" / "results.json").read_text())
    assert batch8["metadata"]["settings"]["batch"] == 8 and batch8["records"]


def test_compiled_runs_name_their_compile_time_and_eager_rate(cpu_check):
    _, results = cpu_check
    compiled = results["parts"]["compile"]["items"]
    assert [item["run"] for item in compiled] == [
        f"vit_{name}_1024" for name in device_runs.COMPILED if f"vit_{name}_1024" in vit_runs()
    ]
    for item in compiled:
        if item["ok"]:
            assert item["compile_s"] >= 0 and item["vs_eager"] > 0 and "Dynamo off" in item["compile"]
        else:
            # a torch or zoo without train.compile: the run's failure, with the reason
            assert "train.compile" in item["message"], item


def test_long_recipes_run_beside_softmax(cpu_check):
    _, results = cpu_check
    runs = {item["run"]: item for item in results["parts"]["long"]["items"]}
    assert list(runs) == [
        "genomes", "genomes_softmax", "lra_listops", "lra_listops_linear", "lra_pathx", "lra_pathx_linear"
    ]  # fmt: skip
    assert runs["genomes"]["attention"] == "linear" and runs["genomes_softmax"]["attention"] == "softmax"
    assert runs["genomes_softmax"]["vs_softmax"] == runs["lra_listops"]["vs_softmax"] == 1.0
    assert runs["genomes"]["tokens"] == 512 and runs["lra_pathx"]["tokens"] == 32 * 32
    for name in ("genomes", "lra_listops_linear", "lra_pathx_linear"):
        twin = runs[name]["twin"]
        assert runs[name]["vs_softmax"] == pytest.approx(
            runs[name]["tokens_per_s"] / runs[twin]["tokens_per_s"], rel=1e-2
        )


def test_a_part_out_of_time_names_what_it_did_not_run(cpu_check):
    out, results = cpu_check
    correctness = results["parts"]["correctness"]
    ran = [item["variant"] for item in correctness["items"]]
    # the budget lets the first item through (`_ItemClock`): the others, every registered variant after it in the
    # registry's order, are named as not run, and the report says so
    assert ran == list_attentions()[:1]
    assert correctness["skipped_for_time"] == list_attentions()[1:]
    report = (out / "device_check.md").read_text()
    assert f"Not run (time budget): {', '.join(list_attentions()[1:])}." in report


def test_the_clock_stops_a_part_whose_typical_item_would_end_past_its_budget(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(device_parts.time, "perf_counter", lambda: now[0])
    clock = device_parts.Clock(20.0)
    assert not clock.over()
    # (item seconds, spent after it, the median item so far): over once their sum passes 20
    for seconds, spent, median in [(2, 2, 2), (2, 4, 2), (10, 14, 2), (3, 17, 2.5), (2, 19, 2)]:
        now[0] += seconds
        clock.lap()
        assert clock.spent() == spent
        # after the 10 s item the last item's time would have stopped the part (14 + 10 > 20); the median does not
        assert clock.over() is (spent + median > 20), (seconds, spent)
    assert clock.over()


def test_a_failing_part_is_reported_and_the_next_part_still_runs(tmp_path, monkeypatch):
    def broken(report: Report, profile) -> None:
        with part_budget(report, "correctness", 1.0):
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


def test_a_compiled_run_torch_cannot_make_is_a_failed_item_not_a_failed_part(tmp_path, monkeypatch):
    def no_compile_option(recipe, overrides, steps, *, compiled=None):
        raise RecipeError("recipes/x.yaml: train.compile: unknown key (did you mean 'clip_grad'?)")

    monkeypatch.setattr(device_runs, "train_record", no_compile_option)
    report = Report(tmp_path, {"parts": {}})
    device_runs.run_compile(report, profile_for("cpu"))
    part = report.results["parts"]["compile"]
    assert part["status"] == "done" and part["failed"] == [item["run"] for item in part["items"]]
    assert all("train.compile: unknown key" in item["message"] for item in part["items"])
    assert "train.compile: unknown key" in (tmp_path / "device_check.md").read_text()


def test_a_set_this_machine_cannot_build_is_timed_on_a_stand_in_of_its_shape(monkeypatch):
    from zoo.config import load_recipe
    from zoo.train import parts

    def missing(recipe, split):
        raise FileNotFoundError("ragout-examples not found")

    monkeypatch.setattr(parts, "build_split", missing)
    recipe = load_recipe(REPO / "recipes" / "genomes.yaml", ["data.options.window=300", "data.train_samples=5"])
    notes = []
    with stand_in_data(notes):
        split = parts.build_split(recipe, "train")
    assert isinstance(split, StandIn) and len(split) == 5 and split.num_classes == 4
    sample = split[3]
    assert sample["tokens"].shape == (300,) and sample["mask"].all() and int(sample["label"]) == 3
    # nucleotide ids A, C, G, T, N (3..7): the DNA tokenizer's, no special token
    assert 3 <= int(sample["tokens"].min()) and int(sample["tokens"].max()) <= 7
    assert notes == [
        "train: random tokens of the set's shape and vocabulary (FileNotFoundError: ragout-examples not found)"
    ]
    listops = load_recipe(REPO / "recipes" / "lra_listops.yaml")
    with stand_in_data(notes), pytest.raises(FileNotFoundError):
        parts.build_split(load_recipe(REPO / "recipes" / "vit_softmax_1024.yaml"), "train")
    with stand_in_data(notes):
        assert parts.build_split(listops, "val")[0]["tokens"].shape == (2000,)


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
def test_cli_refuses_cuda_without_a_gpu(tmp_path, monkeypatch, capsys):
    # the script as `python tools/device_check.py` runs it (its `run_cli` included), in this process: a fresh
    # interpreter would import again torch and all of zoo, which this one holds
    script = REPO / "tools" / "device_check.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--device", "cuda", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --device cuda was asked for, but torch.cuda.is_available() is False: use --device cpu"
    ]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "asked,warm,expected",
    [
        (5, [9.0, 0.2], 5),  # ten fit in 2 s: the steps asked
        (5, [9.0, 0.6], 4),  # 2 s / 0.6 s: four
        (5, [9.0, 3.5], 2),  # reformer's steps on an H200: the floor of two
        (1, [9.0, 3.5], 1),  # never more than asked
        (5, [], 5),  # one warm-up step (the compiling one) or none: nothing to go by
    ],
)
def test_a_slow_run_times_fewer_steps(asked, warm, expected):
    assert device_runs.timed_steps(asked, warm[1:]) == expected
