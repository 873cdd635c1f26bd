"""The recall grid (tools/zoo_bench/recall.py): the runs it asks for, resuming, the per-cell rule (the learning rate
with the best mean validation accuracy, its test accuracy), failures that stop a variant's longer cells, the state
formulas, and a report that marks unrun cells. Training is replaced by a stand-in; one real tiny sweep is `slow`."""

import json
import runpy
import sys
from pathlib import Path

import pytest
from helpers import sweep_runs_here

from zoo_bench import recall, recall_report, recall_speed
from zoo_bench.recall import Variant, cell_data, parse_variant, run_recall, state_size, summarize_cells
from zoo_bench.recall_report import goals, write_markdown
from zoo_bench.sweep import run_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "recall_mqar_quick.yaml"


class FakeTrainer:
    """Stands in for `train_and_test`: an accuracy from (variant, length, width, lr), a failure where asked."""

    def __init__(self, fail: set[tuple[str, int]] = frozenset()):
        self.calls, self.fail = [], fail

    def __call__(self, recipe_path, recipe, variant, seed, budget_steps, run_dir, *, options, timeout, extra):
        sets = dict(item.split("=", 1) for item in extra)
        length, width, lr = int(sets["data.options.seq_len"]), int(sets["model.embed_dim"]), float(sets["optim.lr"])
        self.calls.append((variant, length, width, seed, lr, sets["task"], options))
        run_dir.mkdir(parents=True, exist_ok=True)
        if (variant, length) in self.fail:
            return {"variant": variant, "seed": seed, "status": "oom", "message": "out of memory"}
        # lr 3e-3 is best on validation, lr 1e-3 would look better on test: the rule must pick by validation
        val = 0.9 if lr == 3e-3 else 0.5
        test = (0.8 if lr == 3e-3 else 0.95) - 0.01 * seed
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": budget_steps, "val_top1": val}) + "\n")
        return {"variant": variant, "seed": seed, "status": "ok", "test": {"top1": test}, "train_wall_s": 1.0}


@pytest.fixture
def fake(monkeypatch):
    trainer = FakeTrainer()
    monkeypatch.setattr(recall, "train_and_test", trainer)
    return trainer


@pytest.fixture
def undrawn(monkeypatch):
    """The report without its figure: drawing one costs more than the rest of a test, and only the report test
    draws one."""
    monkeypatch.setattr(recall_report, "plot", lambda results, path: None)


def sweep(tmp_path, **kwargs):
    settings = {"variants": ["softmax", "linformer:k=8"], "lengths": [16, 32], "widths": [32], "seeds": [0, 1]}
    settings["lrs"] = [1e-3, 3e-3]
    return run_recall(RECIPE, tmp_path / "out", budget_steps=2, runs_dir=tmp_path / "runs", **{**settings, **kwargs})


@pytest.mark.usefixtures("undrawn")
def test_every_run_of_the_grid_with_its_cell_settings(tmp_path, fake):
    sweep(tmp_path)
    assert len(fake.calls) == 2 * 2 * 2 * 2
    softmax = [call for call in fake.calls if call[0] == "softmax"]
    # causal where the variant has a causal mode, bidirectional otherwise; linformer gets the cell's length
    assert {call[5] for call in softmax} == {"causal_token_classification"}
    assert {call[5] for call in fake.calls if call[0] == "linformer"} == {"token_classification"}
    assert {(call[1], call[6]["max_seq_len"]) for call in fake.calls if call[0] == "linformer"} == {(16, 16), (32, 32)}
    assert cell_data(128) == {"seq_len": 128, "vocab_size": 256, "num_kv_pairs": 16}
    assert cell_data(64) == {"seq_len": 64, "vocab_size": 128, "num_kv_pairs": 8}
    # a fixed number of pairs at every length: the long-length protocol (recall over distance)
    assert cell_data(4096, 8) == {"seq_len": 4096, "vocab_size": 8192, "num_kv_pairs": 8}


@pytest.mark.usefixtures("undrawn")
def test_parallel_runs_give_the_same_records(tmp_path, fake):
    serial = sweep(tmp_path / "serial")
    parallel = sweep(tmp_path / "parallel", jobs=3)

    def runs(results):
        return sorted((r["label"], r["length"], r["seed"], r["lr"], r["test"]["top1"]) for r in results["records"])

    assert runs(parallel) == runs(serial) and len(runs(serial)) == 16


@pytest.mark.usefixtures("undrawn")
def test_resumes_where_it_stopped(tmp_path, fake):
    sweep(tmp_path, seeds=[0])
    first = len(fake.calls)
    results = sweep(tmp_path)
    assert len(fake.calls) == 2 * first and len(results["records"]) == 2 * first
    sweep(tmp_path)
    assert len(fake.calls) == 2 * first
    # a later, smaller sweep keeps the plan of the earlier ones
    results = sweep(tmp_path, variants=["performer"], lengths=[16], seeds=[0], lrs=[3e-3])
    assert results["protocol"]["plan"]["variants"] == ["softmax", "linformer(k=8)", "performer"]
    assert results["protocol"]["plan"]["lengths"] == [16, 32]
    with pytest.raises(ValueError, match="budget_steps=2.*this one has 3"):
        run_recall(RECIPE, tmp_path / "out", variants=["softmax"], lengths=[16], widths=[32], budget_steps=3)


@pytest.mark.usefixtures("undrawn")
def test_no_run_starts_after_stop_after_and_the_sweep_resumes_from_there(tmp_path, fake):
    said, small = [], {"variants": ["softmax"], "lengths": [16], "seeds": [0]}
    assert sweep(tmp_path, stop_after=0, log=said.append, **small)["records"] == [] and fake.calls == []
    assert said[-1] == "stopped after 0 s: 2 runs not started; run the same command to resume"
    assert len(sweep(tmp_path, stop_after=60, jobs=2, **small)["records"]) == 2
    with pytest.raises(ValueError, match="stop_after must be a number of seconds >= 0, got -1"):
        sweep(tmp_path, stop_after=-1)


@pytest.mark.usefixtures("undrawn")
def test_a_cell_takes_the_lr_best_on_validation_and_reports_its_test(tmp_path, fake):
    results = sweep(tmp_path)
    cell = summarize_cells(results["records"])[("softmax", 16, 32)]
    assert cell["lr"] == 3e-3 and cell["per_seed"] == [0.8, 0.79]
    assert cell["top1"] == pytest.approx(0.795) and cell["top1_std"] == pytest.approx(0.00707, abs=1e-4)


@pytest.mark.usefixtures("undrawn")
def test_a_failure_skips_the_longer_lengths_of_that_width(tmp_path, monkeypatch):
    trainer = FakeTrainer(fail={("softmax", 16)})
    monkeypatch.setattr(recall, "train_and_test", trainer)
    results = sweep(tmp_path, variants=["softmax"])
    statuses = {(r["length"], r["status"]) for r in results["records"]}
    # the first failure stops that length's other seeds and lrs, and the longer lengths
    assert statuses == {(16, "oom"), (16, "skipped"), (32, "skipped")}
    assert len(trainer.calls) == 1
    assert "oom" in (tmp_path / "out" / "recall.md").read_text()


def test_report_marks_unrun_cells_and_states_the_goals(tmp_path, fake):
    drawn = []

    def plot(results, path):
        drawn.append(len(results["records"]))
        draw(results, path)

    draw = recall_report.plot
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recall_report, "plot", lambda results, path: None)
        sweep(tmp_path, variants=["softmax"], lengths=[16])
        patch.setattr(recall_report, "plot", plot)
        sweep(tmp_path, variants=["softmax", "performer"], lengths=[16], seeds=[0], lrs=[3e-3])
    # drawn once, after the sweep's one run: the end of the sweep does not draw the same figure again
    assert drawn == [5] and (tmp_path / "out" / "recall.png").stat().st_size > 0
    # a plan larger than what ran: performer at length 32 never ran
    results = json.loads((tmp_path / "out" / "recall.json").read_text())
    results["protocol"]["plan"]["lengths"] = [16, 32]
    write_markdown(results, tmp_path / "recall.md")
    text = (tmp_path / "recall.md").read_text()
    assert "| performer | yes | 0.800 | not run |" in text
    assert "softmax >= 0.99 at every cell (Zoology Figure 2): not reached; lowest 0.795" in text
    # the whole default grid is shown: a default variant and length no run reached read "not run"
    assert "| local(window=64) | yes | not run | not run | not run |" in text and "L=512" in text


def test_goals_read_the_measured_cells():
    ok = {"status": "ok"}
    cells = {
        ("softmax", 128, 64): {**ok, "top1": 0.999, "top1_std": None},
        ("linear", 128, 64): {**ok, "top1": 0.88, "top1_std": None},
        ("performer", 128, 64): {**ok, "top1": 0.02, "top1_std": None},
        ("local(window=8)", 128, 64): {**ok, "top1": 0.3, "top1_std": None},
        ("local(window=32)", 128, 64): {**ok, "top1": 0.7, "top1_std": None},
    }
    text = "\n".join(goals(cells, [label for label, _, _ in cells]))
    assert "softmax 0.999, linear 0.880, performer 0.020" in text
    assert "softmax >= 0.99 at every cell (Zoology Figure 2): reached" in text
    assert "performer far below elu+1 linear (Based Figure 3): reached" in text
    assert "rising with its window (Based Figure 2): reached: L=128 d=64: w=8: 0.300, w=32: 0.700" in text
    assert "length 512, width 128 (all but softmax, softmax1, synthesizer): not run." in text
    cells[("local(window=32)", 128, 64)]["top1"] = 0.1
    assert "not reached everywhere" in "\n".join(goals(cells, []))


def test_the_far_goal_names_the_best_sub_quadratic_variant_and_the_best_with_a_bounded_state():
    ok = {"status": "ok", "top1_std": None}
    cells = {
        ("softmax", 512, 128): {**ok, "top1": 1.0},
        ("synthesizer", 512, 128): {**ok, "top1": 0.95},
        ("reformer(bucket_size=16)", 512, 128): {**ok, "top1": 0.99},
        ("linear", 512, 128): {**ok, "top1": 0.2},
        ("local(window=64)", 512, 128): {**ok, "top1": 0.3},
    }
    text = "\n".join(goals(cells, []))
    # reformer is sub-quadratic but keeps every key and value; a window's state does not grow with L
    assert "(all but softmax, softmax1, synthesizer): reached: reformer(bucket_size=16) 0.990; " in text
    assert "with a state that does not grow with L: not reached: local(window=64) 0.300." in text


def test_state_formulas():
    # d = 64, 2 heads of 32: softmax 2 N d; a window 2 (w + 1) d; elu+1 linear h e (e + 1); performer h m (e + 1)
    assert state_size(Variant("softmax"), 128, 64, 2) == 2 * 128 * 64
    assert state_size(parse_variant("local:window=16"), 128, 64, 2) == 2 * 17 * 64
    assert state_size(Variant("linear"), 512, 64, 2) == 2 * 32 * 33
    assert state_size(parse_variant("performer:nb_features=64"), 512, 64, 2) == 2 * 64 * 33
    assert state_size(parse_variant("linformer:k=32"), 16, 64, 2) == 2 * 16 * 64
    assert all(state_size(parse_variant(text), 128, 64, 2) for text in recall.DEFAULT_VARIANTS)
    assert set(recall.STATE_FORMULAS) >= {parse_variant(text).name for text in recall.DEFAULT_VARIANTS}


def test_variant_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="unknown attention 'lineer'"):
        parse_variant("lineer")
    with pytest.raises(ValueError, match="attention 'local' has no option 'windw'"):
        parse_variant("local:windw=3")
    with pytest.raises(ValueError, match="option 'window' is not KEY=VALUE"):
        parse_variant("local:window")
    assert parse_variant("local:window=16").label == "local(window=16)"


@pytest.mark.slow
@pytest.mark.usefixtures("undrawn")
def test_a_real_tiny_sweep(tmp_path, monkeypatch, capsys):
    # the command line and its run (tools/train.py --test) in this process: a fresh interpreter would import again
    # torch and all of zoo, which this one holds (tests/tools/test_leaderboard.py launches the runs' fresh processes)
    sweep_runs_here(monkeypatch)
    main = runpy.run_path(str(ROOT / "tools" / "recall.py"))["main"]
    monkeypatch.chdir(ROOT)
    out, runs = tmp_path / "out", tmp_path / "runs"
    command = ["tools/recall.py", "--variants", "softmax", "--lengths", "16", "--widths", "16", "--seeds", "0"]
    command += ["--lrs", "3e-3", "--budget-steps", "2", "--out", str(out), "--runs-dir", str(runs)]
    monkeypatch.setattr(sys, "argv", command)
    main()
    (record,) = json.loads((out / "recall.json").read_text())["records"]
    assert record["status"] == "ok", record
    # the record's numbers are the run's own: its test in eval.json, its last validation in metrics.jsonl
    run_dir = runs / "softmax_L16_d16_s0_lr0.003"
    tested = json.loads((run_dir / "eval.json").read_text())["metrics"]
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert record["test"]["top1"] == tested["top1"] and record["val_top1"] == logged[-1]["val_top1"]
    assert record["steps"] == 2 and logged[-1]["step"] == 2
    report = (out / "recall.md").read_text()
    assert f"| softmax | 16 | 16 | 0.003 | [0] | [0.003] | {tested['top1']:.3f} |" in report
    # the saved sweep's variants timed (in this process: a child per configuration costs an interpreter start)
    monkeypatch.setattr(recall_speed, "run_config", lambda config, timeout: run_config(config, timeout, isolate=False))
    monkeypatch.setattr(sys, "argv", ["tools/recall.py", "--speed", "--speed-length", "64", "--out", str(out)])
    main()
    (timed,) = json.loads((out / "recall_speed.json").read_text())["records"]
    assert (timed["label"], timed["status"], timed["length"]) == ("softmax", "ok", 64)
    # the recall-speed table: no cell at L=128 d=64 for its recall; tokens/s is 64 tokens over the measured time
    row = f"| softmax | not run | {timed['fwd_bwd_s']:.3g} | {64 / timed['fwd_bwd_s']:,.0f} | no recall cell |"
    assert "## Recall against throughput" in (out / "recall.md").read_text() and row in (out / "recall.md").read_text()
    assert "wrote" in capsys.readouterr().out
