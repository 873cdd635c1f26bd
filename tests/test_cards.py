"""docs/cards.md (tools/cards.py): one row per registered variant, generated from the committed results alone."""

import sys
from pathlib import Path
from typing import ClassVar

import pytest

from zoo.attention import _registry, list_attentions
from zoo.attention.softmax import SoftmaxAttention

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from zoo_bench import cards


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

    monkeypatch.setitem(_registry._ATTENTIONS, "throwaway_card", Throwaway)
    row = rows(cards.cards_markdown())["throwaway_card"]
    assert row == ["not measured"] * len(cards.COLUMNS)
    assert "- `throwaway_card`: no measured strength yet." in cards.cards_markdown()


def test_a_failed_run_reads_as_a_failure_not_as_missing():
    record = {"variant": "vq", "status": "oom", "length": 512, "width": 64}
    assert cards._recall([{"records": [record]}], "vq").text == "failed (oom)"
    ok = {**record, "status": "ok", "test": {"top1": 0.5}, "label": "vq"}
    best = {**ok, "label": "vq(codebook_size=64)", "test": {"top1": 0.75}}
    assert cards._recall([{"records": [ok, best, {**ok, "length": 64}]}], "vq").text == (
        "0.750 at L=512, d=64 vq(codebook_size=64)"
    )


@pytest.mark.parametrize(
    "facts,says",
    [
        ({"GPU speed at 64K": cards.Fact("", 16.9)}, "long sequences on a GPU (17x SDPA at 64K)"),
        ({"recall (MQAR)": cards.Fact("", 0.02)}, "not for recall (MQAR 0.02)"),
        ({"ListOps": cards.Fact("", 15.2), "error vs exact at 16K": cards.Fact("", 0.5)}, "did not learn ListOps"),
        ({}, "no measured strength yet"),
    ],
)
def test_pick_this_when_follows_the_rules(facts, says):
    assert says in cards.pick_this_when("any", facts)
