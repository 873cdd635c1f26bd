"""Recall against throughput (tools/zoo_bench/recall_speed.py): each variant timed with its recall options and its
causal mode, the frontier of (recall, throughput), and the report's goal line, table and plot."""

import json

import pytest

from zoo_bench import recall, recall_speed, sweep
from zoo_bench.measure import Settings
from zoo_bench.recall_report import _label_offsets, write_report
from zoo_bench.recall_speed import frontier, measure_speed, throughputs

TINY = Settings(dim=32, heads=2, threads=1, repeats=1, warmup=0, error_rows=8)


@pytest.fixture
def in_process(monkeypatch):
    """The timing in this process (a child per configuration costs an interpreter start each)."""
    configs = []

    def run(config, timeout):
        configs.append(config)
        return sweep.run_config(config, timeout, isolate=False)

    monkeypatch.setattr(recall_speed, "run_config", run)
    return configs


def test_frontier_keeps_the_points_nothing_beats_on_both():
    points = {"a": (1.0, 10.0), "b": (0.8, 100.0), "c": (0.5, 50.0), "d": (0.8, 100.0), "e": (0.1, 1000.0)}
    # c is beaten by b on both; b and d tie, neither beats the other; slowest (most recall) first
    assert frontier(points) == ["a", "b", "d", "e"]
    assert frontier({"x": (0.5, 5.0)}) == ["x"]


def test_labels_of_neighbouring_points_take_separate_lines():
    points = {"softmax": (1.0, 2555.0), "softmax1": (1.0, 2600.0), "bigbird": (1.0, 9102.0), "linear": (0.82, 12708.0)}
    offsets = _label_offsets(points)
    assert offsets["softmax"] != offsets["softmax1"]
    assert offsets["bigbird"] == offsets["linear"] == 3


def test_each_variant_is_timed_with_its_recall_options_and_causal_mode(tmp_path, in_process):
    labels = ["softmax", "local(window=4)", "linformer(k=8)", "softmax"]
    speed = measure_speed(labels, tmp_path, length=32, settings=TINY)
    assert [r["label"] for r in speed["records"]] == ["softmax", "local(window=4)", "linformer(k=8)"]
    assert all(r["status"] == "ok" for r in speed["records"])
    by_variant = {config["variant"]: config for config in in_process}
    assert by_variant["local"]["options"]["window"] == 4
    assert by_variant["linformer"]["options"] == {"k": 8, "max_seq_len": 32}
    causal = {name: config["settings"]["causal"] for name, config in by_variant.items()}
    assert causal == {"softmax": True, "local": True, "linformer": False}
    saved = json.loads((tmp_path / "recall_speed.json").read_text())
    rates = throughputs(saved)
    assert rates["softmax"] == pytest.approx(32 / saved["records"][0]["fwd_bwd_s"])


def test_a_grown_sweep_times_only_its_new_variants(tmp_path, in_process):
    measure_speed(["softmax", "local(window=4)"], tmp_path, length=32, settings=TINY)
    in_process.clear()
    speed = measure_speed(["softmax", "local(window=4)", "linear"], tmp_path, length=32, settings=TINY)
    assert [config["variant"] for config in in_process] == ["linear"]
    assert [r["label"] for r in speed["records"]] == ["softmax", "local(window=4)", "linear"]
    in_process.clear()
    # another length is another measurement: every variant again
    measure_speed(["softmax"], tmp_path, length=16, settings=TINY)
    assert [config["variant"] for config in in_process] == ["softmax"]


def _recall_record(label: str, top1: float, seed: int) -> dict:
    record = {"label": label, "variant": recall.parse_variant(recall.variant_spec(label)).name, "length": 128}
    record.update(width=64, lr=3e-3, seed=seed, status="ok", test={"top1": top1}, val_top1=top1, train_wall_s=1.0)
    return record


def test_the_report_names_the_frontier(tmp_path):
    accuracy = {"softmax": 1.0, "linear": 0.8, "performer": 0.05, "local(window=8)": 0.01}
    seconds = {"softmax": 2.0, "linear": 0.5, "performer": 0.25, "local(window=8)": 0.125}
    records = [_recall_record(label, top1, seed) for label, top1 in accuracy.items() for seed in (0, 1)]
    proto = {"recipe": "r.yaml", "model": {"num_heads": 2}, "budget_steps": 1, "batch_size": 1, "grid": "g"}
    results = {"protocol": {**proto, "cell_rule": "c", "plan": {}}, "records": records}
    meta = {"length": 1024, "settings": {"batch": 1, "dim": 512, "heads": 8, "dtype": "fp32", "threads": 2}}
    meta.update(command="tools/recall.py --speed", device_name="cpu", date="today", causal="as recall")
    meta["settings"]["repeats"] = 3
    speed_records = [{"label": k, "length": 1024, "status": "ok", "fwd_bwd_s": s} for k, s in seconds.items()]
    speed_records.append({"label": "synthesizer", "length": 1024, "status": "oom", "message": "out of memory"})
    (tmp_path / "recall_speed.json").write_text(json.dumps({"metadata": meta, "records": speed_records}))
    write_report(results, tmp_path)
    text = (tmp_path / "recall.md").read_text()
    # performer (0.05 at 4,096 tok/s) is beaten by nothing faster; local(window=8) is the fastest
    named = "softmax (1.000, 512 tok/s), linear (0.800, 2,048 tok/s), performer (0.050, 4,096 tok/s)"
    assert f"variants on it named: {named}, local(window=8) (0.010, 8,192 tok/s)" in text
    assert "| linear | 0.800 ± 0.000 | 0.5 | 2,048 | yes |" in text
    assert "| synthesizer | not run | oom: out of memory | - | - |" in text
    assert (tmp_path / "recall_frontier.png").stat().st_size > 0


def test_recall_ties_at_the_shown_precision():
    ok = {("a", 128, 64): {"status": "ok", "top1": 0.99985}, ("b", 128, 64): {"status": "ok", "top1": 0.99984}}
    speed = {"metadata": {"settings": {"batch": 1}}, "records": []}
    speed["records"] = [{"label": k, "length": 100, "status": "ok", "fwd_bwd_s": s} for k, s in (("a", 2), ("b", 1))]
    points = recall_speed.frontier_points(ok, speed, (128, 64))
    # a's recall is higher only beyond the shown decimals: b, as accurate and faster, is the frontier alone
    assert frontier(points) == ["b"]
