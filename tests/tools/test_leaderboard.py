"""tools/leaderboard.py: every variant x seed trained and tested in fresh processes, failures as rows, resume."""

import json
import math
import runpy
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from zoo_bench import leaderboard, leaderboard_report

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "ucr_acsf1_quick.yaml"
VARIANTS = ["softmax", "linformer"]
# linformer's projections cannot be built this short (k=256 keys out of 8): the variant that fails
FAILING = ["--option", "linformer.max_seq_len=8"]
FAILING_OPTIONS = {"linformer": {"max_seq_len": 8}}


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """The command line end to end: a cheap variant and one that cannot be built, 2 steps, one seed. The command line
    runs in this process (a fresh interpreter would spend 10 s importing what this one holds); each run is
    tools/train.py in a fresh process, as always."""
    root = tmp_path_factory.mktemp("board")
    main = runpy.run_path(str(ROOT / "tools" / "leaderboard.py"))["main"]
    command = ["tools/leaderboard.py", str(RECIPE), "--variants", *VARIANTS, *FAILING, "--budget-steps", "2"]
    command += ["--out", str(root / "out"), "--runs-dir", str(root / "runs")]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        patch.setattr(sys, "argv", command)
        main()
    return root


def _saved(root: Path) -> dict:
    return json.loads((root / "out" / "leaderboard_ucr_acsf1_quick.json").read_text())


@pytest.mark.slow
def test_every_variant_gets_its_test_accuracy_time_and_memory(board):
    results = _saved(board)
    records = {r["variant"]: r for r in results["records"]}
    assert sorted(records) == sorted(VARIANTS)
    record = records["softmax"]
    assert record["status"] == "ok", record
    assert record["seed"] == 0 and record["run_dir"] == str(board / "runs" / "softmax_seed0")
    # the record's numbers are the run's own files: its test in eval.json, the steps and rates in metrics.jsonl
    tested = json.loads((board / "runs" / "softmax_seed0" / "eval.json").read_text())
    logged = (board / "runs" / "softmax_seed0" / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in logged if line.strip()]
    assert record["test"] == {k: v for k, v in tested["metrics"].items() if isinstance(v, int | float)}
    assert record["test"]["samples"] == 100
    assert record["eval_wall_s"] == tested["wall_s"] and record["steps"] == logged[-1]["step"] == 2
    assert record["samples_per_s"] == round(statistics.median(r["samples_per_s"] for r in logged), 2)
    assert record["train_wall_s"] > 0 and record["peak_mib"] > 50
    assert results["protocol"]["budget_steps"] == 2 and results["protocol"]["seeds"] == [0]
    markdown = (board / "out" / "leaderboard_ucr_acsf1_quick.md").read_text()
    assert "2 optimizer steps per run" in markdown and "train.max_steps=2" in markdown
    # the table's score: test accuracy in percent, from eval.json
    assert f"| 1 | `softmax` | {100 * tested['metrics']['top1']:.2f} | 1/1 |" in markdown
    # each variant beside its LRA family's row, a failed one too; a non-LRA task is compared on LRA's average
    assert "| Transformer | 54.39 |" in markdown and "| Linformer | 51.36 |" in markdown
    png = (board / "out" / "leaderboard_ucr_acsf1_quick.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_failing_variant_gets_its_row_with_the_reason(board):
    failed = next(r for r in _saved(board)["records"] if r["variant"] == "linformer")
    assert failed["status"] == "error"
    assert "k=256 must be <= max_seq_len=8" in failed["message"]
    markdown = (board / "out" / "leaderboard_ucr_acsf1_quick.md").read_text()
    assert "| `linformer` | failed: error |" in markdown
    assert "- `linformer` seed 0: error: " in markdown


def test_an_unknown_variant_is_refused_before_any_run(tmp_path, monkeypatch):
    monkeypatch.setattr(leaderboard, "train_and_test", lambda *args, **kwargs: pytest.fail("a run started"))
    with pytest.raises(ValueError, match=r"unknown attention 'perfomer' \(did you mean 'performer'"):
        leaderboard.run_leaderboard(RECIPE, tmp_path, variants=["softmax", "perfomer"], budget_steps=2)


@pytest.mark.slow
def test_a_stopped_sweep_resumes_where_it_stopped(board, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(board / "out", out)
    saved = _saved(board)
    # as if the sweep had stopped before softmax's run
    saved["records"] = [r for r in saved["records"] if r["variant"] != "softmax"]
    (out / "leaderboard_ucr_acsf1_quick.json").write_text(json.dumps(saved))
    # the stopped sweep's report names what it has not reached, out of every seed it was asked for
    stopped = json.loads(json.dumps(saved))
    stopped["protocol"]["seeds"] = [0, 1]
    leaderboard_report.write_report(stopped, tmp_path / "stopped")
    assert "| - | `softmax` | not run | 0/2 |" in (tmp_path / "stopped" / "leaderboard_ucr_acsf1_quick.md").read_text()
    ran = []

    def fake_run(recipe_path, recipe, variant, seed, budget_steps, run_dir, *, options, timeout, extra=()):
        ran.append((variant, seed))
        assert extra == ()
        test = {"top1": 0.5, "samples": 100}
        return {
            "variant": variant,
            "seed": seed,
            "options": options,
            "status": "ok",
            "test": test,
            "steps": 2,
            "train_wall_s": 1.0,
            "peak_mib": 100.0,
            "samples_per_s": 10.0,
        }

    monkeypatch.setattr(leaderboard, "train_and_test", fake_run)
    results = leaderboard.run_leaderboard(
        RECIPE, out, variants=VARIANTS, options=FAILING_OPTIONS, budget_steps=2, seeds=2, runs_dir=tmp_path
    )
    assert ran == [("softmax", 0), ("softmax", 1)]
    # a variant that failed is not tried again with another seed
    skipped = [r for r in results["records"] if r["variant"] == "linformer" and r["seed"] == 1]
    assert skipped[0]["status"] == "skipped" and "seed 0 failed (error)" in skipped[0]["message"]
    assert len(results["records"]) == 4
    with pytest.raises(ValueError, match="budget_steps=2, this one has 3"):
        leaderboard.run_leaderboard(
            RECIPE, out, variants=VARIANTS, options=FAILING_OPTIONS, budget_steps=3, runs_dir=tmp_path
        )
    # overrides for every run are part of the protocol: such a sweep never resumes a plain one
    smaller = ("data.batch_size=4",)
    with pytest.raises(ValueError, match=r"sets=\[\], this one has \['data.batch_size=4'\]"):
        leaderboard.run_leaderboard(
            RECIPE, out, variants=VARIANTS, options=FAILING_OPTIONS, budget_steps=2, runs_dir=tmp_path, extra=smaller
        )


def test_overrides_for_every_run_reach_each_run_and_are_checked_first(tmp_path, monkeypatch):
    seen = []

    def fake_run(recipe_path, recipe, variant, seed, budget_steps, run_dir, *, options, timeout, extra=()):
        seen.append(extra)
        return {"variant": variant, "seed": seed, "options": options, "status": "error", "message": "stop"}

    monkeypatch.setattr(leaderboard, "train_and_test", fake_run)
    monkeypatch.setattr(leaderboard_report, "write_report", lambda results, out_dir: None)
    extra = ("data.batch_size=4",)
    results = leaderboard.run_leaderboard(RECIPE, tmp_path, variants=["softmax"], budget_steps=2, extra=extra)
    assert seen == [extra] and results["protocol"]["sets"] == ["data.batch_size=4"]
    assert results["protocol"]["run"].endswith("seed=S data.batch_size=4")
    # a later seed alone, for a second process to run beside the first
    later = leaderboard.run_leaderboard(RECIPE, tmp_path / "later", variants=["softmax"], budget_steps=2, first_seed=1)
    assert [r["seed"] for r in later["records"]] == [1] and later["protocol"]["seeds"] == [1]
    with pytest.raises(ValueError, match="no_such_key"):
        leaderboard.run_leaderboard(RECIPE, tmp_path, variants=["softmax"], budget_steps=2, extra=("no_such_key=1",))


def _record(variant, seed, top1=None, status="ok"):
    record = {"variant": variant, "seed": seed, "status": status, "train_wall_s": 2.0, "peak_mib": 10.0}
    return {**record, "test": {"top1": top1}} if top1 is not None else {**record, "message": "boom"}


def test_summary_ranks_by_mean_over_seeds_with_failures_last():
    records = [
        _record("linear", 0, 0.50),
        _record("linear", 1, 0.70),
        _record("softmax", 0, 0.80),
        _record("softmax", 1, None, status="nan"),
        _record("performer", 0, None, status="oom"),
    ]
    rows = leaderboard_report.summarize(records, ["performer", "linear", "softmax"])
    assert [row["variant"] for row in rows] == ["softmax", "linear", "performer"]
    softmax, linear, performer = rows
    assert softmax["score"] == pytest.approx(80.0) and softmax["spread"] is None and softmax["finished"] == 1
    assert linear["score"] == pytest.approx(60.0) and linear["spread"] == pytest.approx(math.sqrt(200))
    assert performer["score"] is None and performer["failures"][0]["status"] == "oom"


def test_lra_rows_follow_the_task_and_the_family():
    column = leaderboard_report.lra_column
    assert column("lra_listops_quick") == "ListOps" and column("lra_pathfinder32") == "Pathfinder"
    assert column("lra_pathx") == "Path-X" and column("splice_quick") == "avg"
    assert leaderboard_report.lra_value("performer", "Pathfinder") == "77.05"
    assert leaderboard_report.lra_value("softmax", "Path-X") == "fail"
    assert leaderboard_report.lra_value("gau", "ListOps") == "-"


def test_a_nan_loss_fails_the_run(tmp_path):
    (tmp_path / "train_summary.json").write_text(json.dumps({"steps": 2}))
    lines = [{"step": 1, "train_loss": 1.0, "val_loss": 1.0}, {"step": 2, "train_loss": float("nan")}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)))
    record = leaderboard.read_run(tmp_path)
    assert record["status"] == "nan" and record["message"] == "train_loss is nan at step 2"


def test_a_run_the_engine_stopped_on_a_nan_loss_is_a_nan_row(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("epoch 1\nerror: zoo.train.loop.NonFiniteError: non-finite loss (nan) at step 135 (epoch 1)\n")
    reason = leaderboard._reason(log, 1)
    assert reason["status"] == "nan" and reason["message"].startswith("zoo.train.loop.NonFiniteError: non-finite loss")


def test_the_recipes_own_options_stay_with_its_own_variant():
    recipe = {"model": {"attention": {"name": "performer", "options": {"nb_features": 64}}}}
    own = leaderboard.overrides(recipe, "performer", 1, 5, {})
    assert own == ["model.attention.name=performer", "train.max_steps=5", "train.epochs=5", "seed=1"]
    other = leaderboard.overrides(recipe, "linformer", 0, 5, {"max_seq_len": 2048})
    assert other[-2:] == ["model.attention.options={}", "model.attention.options.max_seq_len=2048"]
    layout = leaderboard.overrides(recipe, "window2d", 0, 5, {}, ("model.global_blocks=[1]",))
    assert layout[-1] == "model.global_blocks=[1]"


def test_default_variants_are_those_that_serve_the_task():
    from zoo import list_attentions
    from zoo.attention import get_attention

    def needs_grid(name):
        return getattr(get_attention(name), "needs_grid", False)

    assert leaderboard.default_variants("classification", "vit") == list_attentions()
    flat = leaderboard.default_variants("classification", "sequence")
    assert flat == [name for name in list_attentions() if not needs_grid(name)]
    causal = leaderboard.default_variants("causal_lm", "sequence")
    assert causal == [name for name in flat if get_attention(name).supports_causal] and "softmax" in causal
