"""docs/cards.md (tools/cards.py): one row per registered variant, generated from the committed results alone."""

from pathlib import Path
from typing import ClassVar

import pytest

from zoo.attention import _registry, list_attentions
from zoo.attention.softmax import SoftmaxAttention
from zoo_bench import cards

REPO = Path(__file__).resolve().parents[2]


def rows(markdown: str) -> dict[str, list[str]]:
    table = [line for line in markdown.splitlines() if line.startswith("| `")]
    return {line.split("|")[1].strip().strip("`"): [c.strip() for c in line.split("|")[2:-1]] for line in table}


def test_every_registered_variant_has_a_row_and_a_pick_line():
    markdown = cards.cards_markdown()
    assert list(rows(markdown)) == list_attentions()
    assert all(f"- `{name}`: " in markdown for name in list_attentions())
    assert all(f"(../{column.link})" in markdown for column in cards.COLUMNS)


def test_the_committed_page_is_what_the_committed_results_give():
    cards._load.cache_clear()
    assert (REPO / "docs" / "cards.md").read_text() == cards.cards_markdown(), "run tools/cards.py and commit"


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
