"""The quickstart study's section of docs/results/cpu.md (zoo_bench.results_pages): the test top-1 over the seeds'
full runs and each run's cells, against numbers worked out here from a made-up JSON."""

from zoo_bench.results_pages import _quickstart


def record(setting, seed, steps, step_s, top1, wall=100.0, cpu=50.0):
    return {
        "setting": setting, "seed": seed, "max_steps": steps, "steps": steps, "train_wall_s": wall,
        "train_cpu_s": cpu, "step_s": step_s, "threads": "threads: 1 intra-op (2 cores - 1 loader worker; ...)",
        "load_before": 1.0, "load_after": 2.0, "test_top1": top1,
    }  # fmt: skip


def test_the_section_gives_the_seeds_mean_and_sample_spread_and_each_timing_against_the_policy():
    data = {
        "protocol": {
            "recipe": "recipes/quickstart.yaml", "cores": 2, "trivial_baseline_top1": 0.1, "timing_steps": 30,
            "settings": {"policy": "the policy", "busy": "beside a busy process"},
        },
        "records": [
            record("policy", 0, 400, 1.0, 0.70), record("policy", 1, 400, 1.0, 0.80),
            record("policy", 2, 400, 1.0, 0.75),
            record("policy", 0, 30, 0.5, 0.20), record("busy", 0, 30, 1.1, 0.20),
        ],
    }  # fmt: skip
    lines = _quickstart(data)
    # mean 75.0 %, sample standard deviation of 70, 80, 75: 5.0; the 30-step runs are not seeds of the claim
    assert "Test top-1 % over seeds 0, 1, 2: 75.0 ± 5.0 (mean ± std; chance 10)." in lines[0]
    rows = [line.split(" | ") for line in lines if line.startswith("| policy") or line.startswith("| busy")]
    assert [row[6] for row in rows] == ["", "", "", "1.00x", "2.20x"]  # 1.1 s / 0.5 s
    assert [row[7] for row in rows][-1] == "1 intra-op"
    assert "- `busy`: beside a busy process" in lines
