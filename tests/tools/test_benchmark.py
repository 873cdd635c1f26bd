"""tools/zoo_bench (tools/benchmark.py): a tiny sweep end to end, failures recorded, slope and crossover fits."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from PIL import Image
from torch import nn

from zoo.attention import attention_options, get_attention, list_attentions
from zoo_bench import measure, peers, report, sweep

SETTINGS = measure.Settings(dim=64, heads=2, repeats=1, warmup=1, threads=1)
LENGTHS = (128, 256)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    # in this process: a fresh interpreter per configuration costs seconds, checked once below
    out = tmp_path_factory.mktemp("bench")
    results = sweep.run_sweep(
        ["no_such_attention", "softmax", "projections"], list(LENGTHS), out, SETTINGS, max_seconds=60, isolate=False
    )
    return out, results


def _records(out, variant):
    records = json.loads((out / "results.json").read_text())["records"]
    return {r["length"]: r for r in records if r["variant"] == variant}


def test_sweep_records_times_memory_and_error(swept):
    out, _ = swept
    for variant in ("softmax", "projections"):
        records = _records(out, variant)
        assert sorted(records) == list(LENGTHS)
        for record in records.values():
            assert record["status"] == "ok", record
            assert record["fwd_s"] > 0 and record["fwd_bwd_s"] > 0
            assert record["peak_mib"] > 0 and record["peak_mib"] >= record["baseline_mib"]
            assert record["error_rows"] == min(SETTINGS.error_rows, record["length"])
    # exact attention against itself; identity attention is far from it
    assert all(r["rel_error"] < 1e-5 for r in _records(out, "softmax").values())
    assert all(r["rel_error"] > 0.1 for r in _records(out, "projections").values())


def test_unknown_variant_is_recorded_and_the_sweep_goes_on(swept):
    out, results = swept
    failed = _records(out, "no_such_attention")
    assert sorted(failed) == list(LENGTHS)
    assert all(r["status"] == "error" and "no_such_attention" in r["message"] for r in failed.values())
    assert "no_such_attention" in (out / "results.md").read_text()
    assert results["metadata"]["versions"]["torch"]


def markdown_tables(markdown: str) -> dict[str, dict[str, dict[str, str]]]:
    """{section heading: {first cell: {column heading: cell}}} of every table in a report."""
    tables, heading = {}, None
    for block in markdown.split("\n## ")[1:]:
        heading, _, body = block.partition("\n")
        rows = [
            [cell.strip() for cell in line.strip("|").split("|")] for line in body.splitlines() if line[:2] == "| "
        ]  # no "|---|"
        if rows:
            columns = rows[0]
            tables[heading] = {row[0]: dict(zip(columns[1:], row[1:], strict=True)) for row in rows[1:]}
    return tables


def test_report_tables_are_the_json_records(swept):
    out, _ = swept
    results = json.loads((out / "results.json").read_text())
    tables = markdown_tables((out / "results.md").read_text())
    # section (its heading's start) -> the cell of one record, read from the JSON alone
    by = {(r["variant"], r["length"]): r for r in results["records"]}
    fields = {
        "Forward + backward time (s)": lambda r: format(r["fwd_bwd_s"], ".4g"),
        "Forward time (s)": lambda r: format(r["fwd_s"], ".4g"),
        "Peak memory": lambda r: format(r["peak_mib"], ".0f"),
        "Memory above the baseline": lambda r: format(r["extra_mib"], ".0f"),
        "Relative error": lambda r: format(r["rel_error"], ".2e"),
        "Speedup against softmax": lambda r: format(by["softmax", r["length"]]["fwd_bwd_s"] / r["fwd_bwd_s"], ".3g"),
        "Time relative to projections": lambda r: format(
            r["fwd_bwd_s"] / by["projections", r["length"]]["fwd_bwd_s"], ".3g"
        ),
    }
    for start, cell in fields.items():
        (table,) = [rows for heading, rows in tables.items() if heading.startswith(start)]
        assert set(table) == {"`softmax`", "`projections`", "`no_such_attention`"}, start
        for (variant, length), record in by.items():
            # a failed record: its status where its own value stands, nothing in a ratio
            failed = "" if start.startswith(("Speedup", "Time relative")) else "error"
            want = cell(record) if record["status"] == "ok" else failed
            assert table[f"`{variant}`"][f"{length:,}"] == want, (start, variant, length)
    # slopes are fitted over 4,096 <= N <= 65,536 only: none at 128 and 256
    assert {row["slope"] for row in tables["Forward + backward time (s)"].values()} == {""}
    # the crossover of a variant that never ran, and no crossover row for softmax or the projections
    assert tables["Crossover against softmax (forward + backward)"] == {
        "`no_such_attention`": {"crossover N": "not measured"}
    }
    # two panels each, log-log, 14 x 5.2 in at 110 dpi
    for name in ("time.png", "memory.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert Image.open(out / name).size == (1540, 572)


def test_peer_table_compares_each_peer_with_its_variant(swept, tmp_path):
    out, results = swept
    ours = [dict(r, variant="local", fwd_bwd_s=1.0, peak_mib=100.0) for r in _records(out, "softmax").values()]
    peer = [dict(r, variant="peer:local-attention", fwd_bwd_s=2.5, peak_mib=400.0) for r in ours]
    report.write_markdown({**results, "records": [*results["records"], *ours, *peer]}, tmp_path / "r.md")
    section = (tmp_path / "r.md").read_text().split("## Against the peer packages")[1]
    row = next(line for line in section.splitlines() if line.startswith("| `local`"))
    assert row.count("2.50x, 100 / 400 MiB") == len(LENGTHS)
    assert "peer packages" not in (out / "results.md").read_text()


class ExactPeer(nn.Module):
    """Exact attention with a peer package's parameter names: to_q / to_k / to_v / to_out (performer-pytorch,
    linformer) or, fused, to_qkv / to_out[0] (nystrom-attention)."""

    def __init__(self, dim: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.heads, self.fused = heads, fused
        if fused:
            self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
            self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.0))
        else:
            self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
            self.to_out = nn.Linear(dim, dim)

    def forward(self, x):
        qkv = self.to_qkv(x).chunk(3, -1) if self.fused else (self.to_q(x), self.to_k(x), self.to_v(x))
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads) for t in qkv)
        return self.to_out(rearrange(F.scaled_dot_product_attention(q, k, v), "b h n d -> b n (h d)"))


@pytest.mark.parametrize("fused", [False, True])
def test_a_peer_is_measured_against_exact_attention_with_its_own_weights(fused):
    torch.manual_seed(0)
    peer = peers.PeerAttention(ExactPeer(SETTINGS.dim, SETTINGS.heads, fused), causal=False)
    x = torch.randn(1, 50, SETTINGS.dim)
    error, rows = measure.relative_error(peer, x, SETTINGS, {})
    assert error < 1e-5 and rows == 50
    # a layer whose projections are not where a peer keeps them
    with pytest.raises(ValueError, match="no separate q / k / v"):
        measure.relative_error(peers.PeerAttention(nn.Linear(4, 4), causal=False), x, SETTINGS, {})


@pytest.mark.slow
def test_fresh_process_records_a_result_and_a_timeout():
    config = measure.single_config("projections", 64, SETTINGS)
    record = sweep.run_config(config, timeout=300)
    assert record["status"] == "ok", record
    assert record["fwd_bwd_s"] > 0 and record["peak_mib"] > 0 and record["wall_s"] > 0
    killed = sweep.run_config(config, timeout=0.01)
    assert killed["status"] == "timeout" and killed["variant"] == "projections"


def test_a_failing_configuration_is_recorded():
    record = measure.measure(measure.single_config("performer", 64, SETTINGS, {"nb_feature": 8}))
    assert record["status"] == "error" and "nb_feature" in record["message"]


def test_stop_reason():
    assert sweep.stop_reason({"status": "ok", "length": 4096, "wall_s": 3.0}, max_seconds=10) is None
    assert "took 30 s" in sweep.stop_reason({"status": "ok", "length": 4096, "wall_s": 30.0}, max_seconds=10)
    assert "oom" in sweep.stop_reason({"status": "oom", "length": 4096}, max_seconds=10)


def test_fit_slope_recovers_the_exponent():
    lengths = [1024, 4096, 8192, 16384, 65536, 131072]
    # outside [4096, 65536] the points are off the power law and must not count
    times = [1.0 if n in (1024, 131072) else 3e-9 * n**1.7 for n in lengths]
    assert report.fit_slope(lengths, times) == pytest.approx(1.7)
    assert report.fit_slope([1024, 4096], [1.0, 2.0]) is None


def test_crossover_is_interpolated_between_measured_lengths():
    lengths = [256, 512, 1024, 2048, 4096]
    linear = {n: 1e-6 * n for n in lengths}
    quadratic = {n: 1e-9 * n * n for n in lengths}
    crossover = report.find_crossover(linear, quadratic)
    assert crossover["length"] == pytest.approx(1000.0)
    slower = {n: 2 * t for n, t in quadratic.items()}
    never = report.find_crossover(slower, quadratic)
    assert never["length"] is None and never["text"].startswith("> 4,096")
    failed = report.find_crossover({4096: 1.0}, {}, {4096: "oom"})
    assert failed["length"] == 4096 and "oom" in failed["text"]


def test_options_are_parsed_and_checked():
    assert sweep.parse_options(["performer.nb_features=128", "performer.kernel=relu"], ["performer"]) == {
        "performer": {"nb_features": 128, "kernel": "relu"}
    }
    with pytest.raises(ValueError, match="'nb_feature'.*did you mean 'nb_features'"):
        sweep.parse_options(["performer.nb_feature=1"], ["performer"])
    with pytest.raises(ValueError, match="VARIANT.KEY=VALUE"):
        sweep.parse_options(["nb_features=1"], ["performer"])
    with pytest.raises(ValueError, match="'sofmax'.*did you mean 'softmax'"):
        sweep.check_variants(["sofmax"])


def test_missing_peer_is_a_note(monkeypatch):
    monkeypatch.setitem(peers.PEERS, "linformer", "zoo_no_such_module")
    names, notes = sweep._sweep_variants(["softmax", "peer:linformer"])
    assert names == ["softmax", "projections"]
    assert len(notes) == 1 and "zoo_no_such_module is not installed" in notes[0]


def test_max_seq_len_follows_the_length():
    names = [name for name in list_attentions() if "max_seq_len" in attention_options(name)]
    assert names, "no registered variant has a max_seq_len option: this test checks nothing"
    assert measure.length_options(names[0], 8192, {})["max_seq_len"] == 8192
    assert measure.length_options(names[0], 8192, {"max_seq_len": 4096})["max_seq_len"] == 4096


def test_merge_keeps_earlier_records_and_replaces_the_remeasured(tmp_path):
    def run(variants, lengths, **kw):
        return sweep.run_sweep(variants, lengths, tmp_path, SETTINGS, max_seconds=60, isolate=False, **kw)

    first = run(["softmax"], [64, 128])
    merged = run(["linear"], [128], merge=True)
    pairs = [(r["variant"], r["length"]) for r in merged["records"]]
    assert sorted(pairs) == sorted(
        [("softmax", 64), ("softmax", 128), ("projections", 64), ("projections", 128), ("linear", 128)]
    )
    kept = next(r for r in merged["records"] if (r["variant"], r["length"]) == ("softmax", 64))
    assert kept["fwd_s"] == next(r for r in first["records"] if (r["variant"], r["length"]) == ("softmax", 64))["fwd_s"]
    assert "Merged with" in (tmp_path / "results.md").read_text()
    with pytest.raises(ValueError, match="cannot merge"):
        sweep.run_sweep(
            ["linear"],
            [64],
            tmp_path,
            measure.Settings(dim=32, heads=2, repeats=1, warmup=1),
            isolate=False,
            merge=True,
        )


def test_flash_kernel_tiles_prints_one_row_per_block_shape(monkeypatch, capsys):
    import runpy

    script = Path(__file__).parents[2] / "tools" / "dev" / "flash_kernel_tiles.py"
    monkeypatch.setattr(
        "sys.argv", [str(script), "--length", "1024", "--heads", "1", "--repeats", "1", "--threads", "1"]
    )
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    rows = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "x" in line.split("|")[1]
    ]
    shapes = [row.split("|")[1].strip() for row in rows[1:]]
    assert len(shapes) == 18 and shapes[0] == "64 x 64" and shapes[-1] == "512 x 1024"
    assert all(float(cell) > 0 for row in rows[1:] for cell in row.strip("| ").split(" | ")[2:])


GRID_VARIANTS = [name for name in list_attentions() if measure.needs_grid(name)]


@pytest.mark.parametrize("name", GRID_VARIANTS)
def test_a_grid_variant_is_measured_on_a_square_grid(name):
    # the class's small test window (window 4, kernel 3) on an 8 x 8 grid: local, so far from exact attention
    small = {k: v for k, v in get_attention(name).test_options.items() if k not in ("grid_size", "num_prefix_tokens")}
    record = measure.measure(measure.single_config(name, 64, SETTINGS, small))
    assert record["status"] == "ok", record
    assert record["options"] == {
        **measure.BENCH_OPTIONS.get(name, {}),
        **small,
        "grid_size": [8, 8],
        "num_prefix_tokens": 0,
    }
    assert record["fwd_bwd_s"] > 0 and record["peak_mib"] > 0 and record["error_rows"] == 64
    assert record["rel_error"] > 1e-2


@pytest.mark.parametrize("name", sorted(measure.BENCH_OPTIONS))
def test_the_benchmark_window_covering_the_grid_is_exact(name):
    # 23 x 23 covers a 16 x 16 grid: the error against exact attention is the float error
    record = measure.measure(measure.single_config(name, 256, SETTINGS))
    assert record["status"] == "ok", record
    assert record["options"]["grid_size"] == [16, 16] and record["rel_error"] < 1e-5


def test_a_length_that_is_not_a_square_is_an_error_for_a_grid_variant(tmp_path):
    with pytest.raises(ValueError, match=r"N=1,000 is not a square, the nearest: N=961 \(31 x 31\) and N=1,024"):
        measure.length_options("window2d", 1000, {})
    with pytest.raises(ValueError, match=r"N=70 less num_prefix_tokens=1 = 69 .* N=65 \(1 \+ 8 x 8\) and N=82"):
        measure.length_options("neighborhood", 70, {"num_prefix_tokens": 1})
    assert measure.length_options("neighborhood", 65, {"num_prefix_tokens": 1})["grid_size"] == [8, 8]
    # in a sweep the length is recorded as an error and the square lengths, longer ones too, still run
    results = sweep.run_sweep(
        ["window2d"], [48, 64], tmp_path, SETTINGS, options={"window2d": {"window": 4}}, isolate=False
    )
    records = _records(tmp_path, "window2d")
    assert records[48]["status"] == "error" and "N=49 (7 x 7)" in records[48]["message"]
    assert records[64]["status"] == "ok" and records[64]["options"]["window"] == 4
    notes = results["metadata"]["notes"]
    assert any(note.startswith("window2d: the N tokens as a square patch grid") for note in notes)
    assert "window2d: 4 x 4 windows = 16 keys per query" in (tmp_path / "results.md").read_text()
    # a merge keeps the earlier notes beside its own
    merged = sweep.run_sweep(["local"], [64], tmp_path, SETTINGS, isolate=False, merge=True)
    assert set(notes) < set(merged["metadata"]["notes"])
    assert "local: window 256 each side = 513 keys per query" in merged["metadata"]["notes"]
    assert merged["metadata"]["options"]["window2d"] == {"window": 4}
