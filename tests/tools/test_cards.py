"""docs/cards.md and docs/choose.md (tools/pages.py): one row per registered variant, and one pick per setting,
generated from the committed results alone."""

from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from zoo.attention import _registry, list_attentions
from zoo.attention.softmax import SoftmaxAttention
from zoo_bench import _results, cards

REPO = Path(__file__).resolve().parents[2]


def rows(markdown: str) -> dict[str, list[str]]:
    table = [line for line in markdown.splitlines() if line.startswith("| `")]
    return {line.split("|")[1].strip().strip("`"): [c.strip() for c in line.split("|")[2:-1]] for line in table}


def test_every_registered_variant_has_a_row_and_a_pick_line():
    markdown = cards.cards_markdown()
    assert list(rows(markdown)) == list_attentions()
    assert all(f"- `{name}`: " in markdown for name in list_attentions())
    # each column links its report, or says it is not yet written where its study has not run
    for column in cards.COLUMNS:
        written = (REPO / column.link).exists()
        assert (f"(../{column.link})" in markdown) == written, column.link
        assert (f"{column.link} (not yet written)" in markdown) == (not written), column.link


def test_the_committed_page_is_what_the_committed_results_give():
    _results.load.cache_clear()
    assert (REPO / "docs" / "cards.md").read_text() == cards.cards_markdown(), "run tools/pages.py and commit"


def test_a_new_variant_gets_a_row_of_not_measured(monkeypatch):
    class Throwaway(SoftmaxAttention):
        test_options: ClassVar[dict] = {}

    monkeypatch.setattr(_registry, "_ATTENTIONS", _registry._ATTENTIONS.copy())
    _registry._ATTENTIONS.register("throwaway_card", Throwaway)
    row = rows(cards.cards_markdown())["throwaway_card"]
    assert row == ["not measured"] * len(cards.COLUMNS)
    assert "- `throwaway_card`: no measured strength yet." in cards.cards_markdown()


def _sweep(*records):
    """A recall.json as tools/recall.py writes it: its protocol and run records (seed 0, lr 3e-3 unless given)."""
    base = {"seed": 0, "lr": 3e-3}
    return {"protocol": {"device": "cpu"}, "records": [{**base, "label": r["variant"], **r} for r in records]}


def test_a_failed_run_reads_as_a_failure_not_as_missing():
    record = {"variant": "vq", "status": "oom", "length": 512, "width": 64}
    assert cards._recall([_sweep(record)], "vq").text == "failed (oom)"
    ok = {**record, "status": "ok", "test": {"top1": 0.5}}
    best = {**ok, "label": "vq(codebook_size=64)", "test": {"top1": 0.75}}
    assert cards._recall([_sweep(ok, best, {**ok, "length": 64})], "vq").text == (
        "0.750 at L=512, d=64 vq(codebook_size=64)"
    )


def test_recall_is_read_where_softmax_learned_the_task():
    def run(variant, length, top1):
        return {"variant": variant, "status": "ok", "length": length, "width": 64, "test": {"top1": top1}}

    sweep = _sweep(run("softmax", 128, 1.0), run("softmax", 512, 0.2), run("linear", 128, 0.8), run("linear", 512, 0.0))
    assert cards._recall([sweep], "linear").text == "0.800 at L=128, d=64"
    gpu = {**sweep, "protocol": {"device": "cuda"}}
    assert cards._recall([gpu], "softmax").text == "1.000 at L=128, d=64 (GPU)"


def test_a_length_learned_with_a_longer_budget_is_read_at_that_budget_only():
    def run(variant, length, top1):
        return {"variant": variant, "status": "ok", "length": length, "width": 64, "test": {"top1": top1}}

    short = _sweep(run("softmax", 128, 1.0), run("linear", 128, 0.8), run("linear", 512, 0.0))
    long = _sweep(run("softmax", 512, 1.0), run("reformer", 512, 0.99))
    short["protocol"]["budget_steps"], long["protocol"]["budget_steps"] = 600, 1500
    # softmax learned 512 in 1,500 steps: linear's 600-step run at 512 is not read against that
    assert cards._recall([short, long], "linear").text == "0.800 at L=128, d=64"
    assert cards._recall([short, long], "reformer").text == "0.990 at L=512, d=64, 1,500 steps"
    # read at the longest learnable length, with the longest where it still recalls beside it
    long["records"].append({**long["records"][0], "variant": "linear", "label": "linear", "test": {"top1": 0.01}})
    short["records"].append({**short["records"][1], "length": 64, "test": {"top1": 0.95}})
    short["records"].append({**short["records"][0], "length": 64})
    fact = cards._recall([short, long], "linear")
    assert (fact.text, fact.value) == ("0.010 at L=512, d=64, 1,500 steps; 0.950 at L=64, d=64", 0.01)


@pytest.mark.parametrize(
    "facts,says",
    [
        ({"GPU speed at 64K": cards.Fact("", 16.9)}, "long sequences on a GPU (17x SDPA at 64K)"),
        ({"recall (MQAR)": cards.Fact("", 0.02, "L=256, d=64")}, "not for recall (MQAR 0.02 at L=256, d=64)"),
        ({"ListOps": cards.Fact("", 15.2), "error vs exact at 16K": cards.Fact("", 0.5)}, "did not learn ListOps"),
        ({}, "no measured strength yet"),
    ],
)
def test_pick_this_when_follows_the_rules(facts, says):
    assert says in cards.pick_this_when("any", facts)


def test_the_frontier_column_marks_the_variants_on_it():
    def run(label, top1):
        record = {"variant": label.split("(")[0], "label": label, "status": "ok", "length": 128, "width": 64}
        return {**record, "test": {"top1": top1}}

    sweep = _sweep(run("softmax", 1.0), run("linear", 0.8), run("performer", 0.05), run("local(window=8)", 0.3))
    timed = {"softmax": 2.0, "linear": 0.5, "performer": 1.0, "local(window=8)": 0.25}
    records = [{"label": label, "length": 1024, "status": "ok", "fwd_bwd_s": s} for label, s in timed.items()]
    speed = {"metadata": {"settings": {"batch": 1}}, "records": records}
    # performer is slower than linear and recalls less: off the frontier, the others on it
    assert cards._frontier([sweep, speed], "performer") == cards.Fact("off it: performer 0.050, 1,024 tok/s", 0.0)
    assert cards._frontier([sweep, speed], "local").text == "on it: local(window=8) 0.300, 4,096 tok/s"
    assert cards._frontier([sweep], "local") is None
    assert "on the recall-throughput frontier" in cards.pick_this_when(
        "x", {"recall-speed frontier": cards.Fact("", 1)}
    )


# opposite verdicts: a rule's claim and the claim that undoes it, for the same variant
_OPPOSITES = (("tasks that recall tokens", "not for recall"), ("the most recall at its speed", "not for recall"))


def _every_rule_firing() -> list[dict[str, cards.Fact]]:
    """Synthetic facts: for every column, one value per rule that makes that rule hold, in every combination
    across the columns (so each rule fires beside each other column's rules)."""
    triggers: dict[str, list[float]] = {}
    values = (1e-3, 0.05, 0.3, 0.95, 1.0, 5.0, 11.0, 15.0, 25.0, 40.0, 1024.0, 9e9)
    for rule in cards.RULES:
        value = next(v for v in values if rule.holds(v))
        triggers.setdefault(rule.column, []).append(value)
    grids = [{}]
    for column, options in triggers.items():
        grids = [{**g, column: cards.Fact("", v, "L=9")} for g in grids for v in options]
    return grids


def test_no_variant_gets_contradictory_claims_from_synthetic_results():
    grids = _every_rule_firing()
    assert len(grids) == 16  # two rules each for recall, ListOps, high-res images and 2-D recall
    for facts in grids:
        said = cards.pick_this_when("x", facts)
        for good, bad in _OPPOSITES:
            assert not (good in said and bad in said), (facts, said)
        # one verdict per capability
        fired = [r.capability or r.column for r in cards.RULES if r.says.split(" (")[0].split(" {")[0] in said]
        assert len(fired) == len(set(fired)), said


def test_bigbird_like_facts_give_one_recall_verdict():
    facts = {"recall (MQAR)": cards.Fact("", 0.01, "L=512"), "recall-speed frontier": cards.Fact("", 1.0)}
    assert cards.pick_this_when("bigbird", facts) == "not for recall (MQAR 0.01 at L=512)"


def _timing(variant, length, seconds, spread=0.0):
    times = [seconds * (1 - spread), seconds, seconds * (1 + spread)]
    return {
        "variant": variant,
        "length": length,
        "status": "ok",
        "fwd_bwd_s": seconds,
        "fwd_bwd_times": times,
        "peak_mib": 1024,
    }


def test_faster_only_beyond_the_noise():
    softmax = {n: _timing("softmax", n, s) for n, s in ((4096, 1.0), (16384, 14.1), (65536, 200.0))}
    # softmax1 at 14.5 s against 14.1 s is not faster (nor is 3 % faster): no claim at all
    close = {n: _timing("softmax1", n, r["fwd_bwd_s"] * 0.97) for n, r in softmax.items()}
    assert cards.faster_from(close, softmax) is None
    fact = cards._cpu_time([{"records": [*close.values(), *softmax.values()], "summary": {}}], "softmax1")
    assert "faster" not in fact.text
    # 10 % faster from 16K on, but within a 20 % spread of the repeats at 16K: faster from 64K only
    mine = {
        4096: _timing("linear", 4096, 1.2),
        16384: _timing("linear", 16384, 12.7, 0.1),
        65536: _timing("linear", 65536, 20.0),
    }
    assert cards.faster_from(mine, softmax) == 65536
    mine[16384] = _timing("linear", 16384, 12.7)
    assert cards.faster_from(mine, softmax) == 16384


def _check(name, bf16_ok, fp32_ok=True):
    cases = [
        {"dtype": "fp32", "ok": fp32_ok, "out": 1e-7, "grad_x": 1e-7, "finite": True},
        {"dtype": "bf16", "ok": bf16_ok, "out": 0.02, "grad_x": 0.064, "finite": True},
    ]
    item = {"variant": name, "ok": bf16_ok and fp32_ok, "cases": cases}
    return {"parts": {"correctness": {"items": [item]}}}


def test_a_bf16_only_gap_is_not_a_device_fault():
    # reformer: fp32 agrees with the CPU, bf16 6.4e-2 past the 5e-2 tolerance (the CPU in bf16 gives the same)
    assert cards._gpu_correct([_check("reformer", False)], "reformer") == cards.Fact(
        "yes in fp32; bf16 6.4e-02 past tolerance (rounding, not the device)", 1.0
    )
    assert cards._gpu_correct([_check("x", False, fp32_ok=False)], "x").text == "**no** (bf16 6.4e-02)"
    assert cards._gpu_correct([_check("x", True)], "x").text == "yes (bf16 6.4e-02)"


def test_the_committed_decision_page_is_what_the_committed_results_give():
    from zoo_bench import choose

    _results.load.cache_clear()
    page = choose.choose_markdown()
    assert (REPO / "docs" / "choose.md").read_text() == page, "run tools/pages.py and commit"
    for setting in ("256 px, GPU", "1024 px, GPU", "2048 px, GPU", "256 px, CPU", "1024 px, CPU", "2048 px, CPU"):
        assert f"| {setting} |" in page
    for setting in ("1K tokens", "16K tokens", "64K tokens"):
        assert f"| {setting}, GPU |" in page and f"| {setting}, CPU |" in page
    # every answer names a file it rests on, or says what would measure it
    headers = ("| setting |", "| run |", "|---")
    for line in (row for row in page.splitlines() if row.startswith("|") and not row.startswith(headers)):
        assert "benchmarks/" in line or ("not measured" in line and "`" in line), line


def test_the_decision_page_picks_the_fastest_beyond_the_noise(monkeypatch):
    from zoo_bench import choose

    def item(run, attention, rate):
        recipe = f"recipes/vit_{attention}_1024.yaml"
        return {"run": run, "attention": attention, "tokens": 4097, "samples_per_s": rate, "ok": True, "recipe": recipe}

    check = {
        "device_name": "GPU X",
        "parts": {"train": {"items": [item("s", "softmax", 100.0), item("l", "linear", 104.0)]}},
    }
    monkeypatch.setattr(choose, "GPU_TRAIN", ("a.json",))
    monkeypatch.setattr(choose, "load", lambda path: check)
    # 4 % faster is within the 5 % margin: softmax
    assert choose._gpu_images(4097)[0] == "`softmax`"
    check["parts"]["train"]["items"][1]["samples_per_s"] = 175.0
    pick, why = choose._gpu_images(4097)
    assert (pick, why.split(" (")[0]) == (
        "`linear` (`recipes/vit_linear_1024.yaml`)",
        "1.75x softmax's training samples/s",
    )
    assert "options" not in why  # linear's recipe sets none, and the record kept none


@pytest.mark.parametrize("measured", [None, "other", "same", "gone"])
def test_a_pick_measured_with_other_attention_options_says_so(monkeypatch, measured):
    """The recipe's options now (read from its YAML here) against those the record kept: a pick whose command would
    not run what was timed says so."""
    from zoo_bench import choose

    recipe = "recipes/vit_window2d_global_1024.yaml"
    window = yaml.safe_load((REPO / recipe).read_text())["model"]["attention"]["options"]["window"]
    record = {"run": "w", "attention": "window2d", "tokens": 4097, "samples_per_s": 190.0, "ok": True, "recipe": recipe}
    if measured == "gone":
        record["recipe"] = "recipes/vit_window2d_retired_1024.yaml"
    elif measured is not None:
        record["attention_options"] = {"window": window if measured == "same" else window - 2}
    softmax = {
        **record,
        "run": "s",
        "attention": "softmax",
        "samples_per_s": 100.0,
        "recipe": "recipes/vit_softmax_1024.yaml",
    }
    softmax.pop("attention_options", None)
    check = {"device_name": "GPU X", "parts": {"train": {"items": [softmax, record]}}}
    monkeypatch.setattr(choose, "GPU_TRAIN", ("a.json",))
    monkeypatch.setattr(choose, "load", lambda path: check)
    pick, why = choose._gpu_images(4097)
    assert pick.startswith("`window2d`")
    expected = {
        None: f"The check that measured it kept no attention options; the recipe now sets `window={window}`",
        "other": f"Measured with `window={window - 2}`; the recipe now sets `window={window}`",
        "same": None,
        "gone": "Its recipe, `recipes/vit_window2d_retired_1024.yaml`, is no longer shipped",
    }[measured]
    if expected is None:
        assert "options" not in why and "Measured" not in why, why
    else:
        assert expected in why, why


def test_a_layer_pick_compares_each_variant_with_softmax_in_its_own_file(monkeypatch):
    """Two files are two machines: `local` measured 10x its own file's softmax beats `linear`'s 6.25x in a faster
    machine's file, although linear's 0.8 ms is the shorter time."""
    from zoo_bench import choose

    def record(variant, seconds):
        return {"variant": variant, "length": 65536, "status": "ok", "fwd_bwd_s": seconds}

    files = {
        "h100.json": {"records": [record("softmax", 10.0), record("local", 1.0), record("linear", 4.0)]},
        "h200.json": {"records": [record("softmax", 5.0), record("linear", 0.8)]},
        "cpu.json": {"records": []},
    }
    monkeypatch.setattr(choose, "LAYER_FILES", {"GPU": ("h100.json", "h200.json"), "CPU": ("cpu.json",)})
    monkeypatch.setattr(choose, "load", files.get)
    pick, why = choose._layer("GPU", 65536)
    assert (pick, why) == ("`local`", "10.0x softmax (1e+03 ms) (`h100.json`)")
    files["h200.json"]["records"][1]["fwd_bwd_s"] = 0.4  # 12.5x in its own file
    assert choose._layer("GPU", 65536) == ("`linear`", "12.5x softmax (400 ms) (`h200.json`)")


def test_the_long_recall_answer_states_chance_and_the_softmax_control(monkeypatch):
    from zoo_bench import choose

    def record(label, length, top1):
        test = {"top1": top1}
        return {"label": label, "length": length, "width": 64, "seed": 0, "lr": 3e-3, "status": "ok", "test": test}

    results = {
        "protocol": {"budget_steps": 100},
        "records": [record("softmax", 1024, 0.001), record("linear", 1024, 0.002), record("linear", 4096, 0.0003)],
    }
    monkeypatch.setattr(choose, "RECALL_LENGTHS", ("r.json",))
    monkeypatch.setattr(choose, "load", lambda path: results)
    text = choose._long_recall()
    assert text.startswith("CPU, `r.json`: ")
    # MQAR at vocabulary 2 L: one value in L, so chance is 1 / L
    assert "L=1024 (100 steps; chance 0.0010; softmax did not learn it at this budget" in text
    assert "softmax 0.0010, linear 0.0020; L=4096 (100 steps; chance 0.0002; no softmax control): linear 0.0003" in text
    results["records"][0]["test"]["top1"] = 0.995
    assert "L=1024 (100 steps; chance 0.0010; softmax learned it): softmax 0.9950" in choose._long_recall()


TRAIN = "GPU training at 1024 px"


def test_the_gpu_training_column_reads_the_newest_check_that_trained_the_variant():
    def run(name, attention, rate, tokens=4097):
        return {"run": name, "attention": attention, "tokens": tokens, "samples_per_s": rate, "ok": True}

    older = {"parts": {"train": {"items": [run("vit_softmax_1024", "softmax", 100.0), run("vit_vq_1024", "vq", 50.0)]}}}
    newer = {
        "parts": {
            "train": {
                "items": [
                    run("vit_softmax_1024", "softmax", 200.0),
                    run("vit_window2d_global_1024", "window2d", 190.0),
                    run("vit_window2d_global_w16_1024", "window2d", 220.0),
                    run("seg_window2d_1024", "window2d", 900.0),  # a decoder's cost: not read
                    run("vit_linear_1024", "linear", 360.0),
                ]
            },
            "compile": {"items": [{**run("vit_linear_1024", "linear", 450.0), "compile": "train.compile=true"}]},
        }
    }
    # each variant against its own check's softmax; the newest check that trained it wins
    assert cards._gpu_train([older, newer], "vq") == cards.Fact("0.50x (50.0 samples/s)", 0.5, "`vit_vq_1024`")
    assert cards._gpu_train([older, newer], "linear").text == "1.80x (360.0 samples/s); compiled 2.25x"
    fact = cards._gpu_train([older, newer], "window2d")
    assert fact.text == "1.10x (220.0 samples/s `vit_window2d_global_w16_1024`)"
    assert "training a ViT at 1024 px on a GPU (1.10x" in cards.pick_this_when("window2d", {TRAIN: fact})
    assert "training a ViT" not in cards.pick_this_when("vq", {TRAIN: cards._gpu_train([older], "vq")})
    assert cards._gpu_train([older, newer], "performer") is None
