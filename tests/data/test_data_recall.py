"""Recall probes (`zoo.data.tokens.recall`): every label of a generated set re-derived from its input tokens by an
independent checker, Zoology's conditions and power law, determinism per (seed, split, index), and the per-position task
that scores them (loss and accuracy over the labelled positions only)."""

from collections import Counter

import numpy as np
import pytest
import torch

from zoo.config import RecipeError, load_recipe
from zoo.data import DataContext, build_dataset, get_dataset, list_datasets
from zoo.data.tokens.recall import MQAR, InductionHeads, SelectiveCopying, mqar_power_law
from zoo.tasks import IGNORE_INDEX, get_task

RECALL = ("mqar", "induction_heads", "selective_copying")


def mqar_labels(tokens: list[int], pairs: int, queried: list[int]) -> dict[int, int]:
    """{position: value} of the queried positions, read from the key-value prefix of `tokens`."""
    bound = {}
    for i in range(0, 2 * pairs, 2):
        assert tokens[i] not in bound, f"key {tokens[i]} bound twice"
        bound[tokens[i]] = tokens[i + 1]
    return {p: bound[tokens[p]] for p in queried}


def check_mqar(ds: MQAR) -> None:
    half, pairs = ds.vocab_size // 2, ds.num_kv_pairs
    for index in range(len(ds)):
        sample = ds[index]
        tokens, labels = sample["tokens"].tolist(), sample["labels"].tolist()
        assert len(tokens) == len(labels) == ds.seq_len and bool(sample["mask"].all())
        assert all(0 <= t < ds.vocab_size for t in tokens)
        keys, values = tokens[0 : 2 * pairs : 2], tokens[1 : 2 * pairs : 2]
        assert all(1 <= k < half for k in keys) and all(half <= v < ds.vocab_size for v in values)
        assert len(set(keys)) == len(set(values)) == pairs
        queried = [p for p, label in enumerate(labels) if label != IGNORE_INDEX]
        # every key asked once, after the pairs, on Zoology's grid of even offsets
        assert sorted(tokens[p] for p in queried) == sorted(keys)
        assert all(p >= 2 * pairs and (p - 2 * pairs) % 2 == 0 for p in queried)
        expected = mqar_labels(tokens, pairs, queried)
        assert {p: labels[p] for p in queried} == expected
        if ds.layout == "causal":
            # the next-token stream: the answer is the token after its query
            assert all(tokens[p + 1] == labels[p] for p in queried)


@pytest.mark.parametrize("layout", ["bidirectional", "causal"])
def test_mqar_labels_match_an_independent_checker(layout):
    for split in ("train", "test"):
        context = DataContext(split, is_training=split == "train", num_samples=200, seed=3)
        ds = build_dataset("mqar", context, vocab_size=256, seq_len=128, num_kv_pairs=16, layout=layout)
        check_mqar(ds)
    # the smallest sample Zoology allows: 4 pairs fill a length of 16, vocabulary 17
    check_mqar(MQAR("val", num_samples=200, vocab_size=17, seq_len=16, num_kv_pairs=4, layout=layout))


def test_mqar_checker_catches_a_wrong_label():
    ds = MQAR("train", num_samples=1, vocab_size=64, seq_len=32, num_kv_pairs=4)
    sample = ds[0]
    tokens, labels = sample["tokens"].tolist(), sample["labels"].tolist()
    queried = [p for p, label in enumerate(labels) if label != IGNORE_INDEX]
    expected = mqar_labels(tokens, 4, queried)
    # the checker agrees with the generator's labels as they are ...
    assert expected == {p: labels[p] for p in queried}
    # ... and with none where one answer is moved to another value of the upper half [32, 64)
    first = queried[0]
    labels[first] = (labels[first] + 1 - 32) % 32 + 32
    changed = {p: labels[p] for p in queried}
    assert changed != expected and changed[first] != expected[first] and 32 <= changed[first] < 64
    assert {p: v for p, v in changed.items() if p != first} == {p: v for p, v in expected.items() if p != first}
    # a key bound twice (the second pair rebinding the first key) is refused, not read with either value
    tokens[2] = tokens[0]
    with pytest.raises(AssertionError, match=f"key {tokens[0]} bound twice"):
        mqar_labels(tokens, 4, queried)


def test_mqar_layouts_share_everything_but_the_answer_slot():
    bidirectional = MQAR("train", num_samples=20, vocab_size=128, seq_len=64, num_kv_pairs=8)
    causal = MQAR("train", num_samples=20, vocab_size=128, seq_len=64, num_kv_pairs=8, layout="causal")
    for index in range(20):
        a, b = bidirectional[index], causal[index]
        torch.testing.assert_close(a["labels"], b["labels"])
        answer_slots = torch.roll(a["labels"] != IGNORE_INDEX, 1)
        torch.testing.assert_close(a["tokens"][~answer_slots], b["tokens"][~answer_slots])


def test_mqar_queries_follow_zoologys_power_law():
    # p(g) ~ a * (g + 1) ** (a - 1): the ratio of neighbours is fixed by a; a = 1 is uniform
    p = mqar_power_law(48, 0.01)
    assert p.sum() == pytest.approx(1.0) and np.all(np.diff(p) < 0)
    assert p[0] / p[1] == pytest.approx(2**0.99)
    assert np.allclose(mqar_power_law(10, 1.0), 0.1)
    # one pair: its gap is one draw of p, whose mean (far below a uniform draw's) the samples must match
    ds = MQAR("train", num_samples=2000, vocab_size=512, seq_len=256, num_kv_pairs=1)
    gaps = np.array([(int(np.flatnonzero(ds[i]["labels"].numpy() != IGNORE_INDEX)[0]) - 2) // 2 for i in range(2000)])
    space = (256 - 2) // 2
    p = mqar_power_law(space, 0.01)
    mean = float(np.arange(space) @ p)
    std = float(np.sqrt((np.arange(space) - mean) ** 2 @ p))
    assert mean < 0.5 * (space - 1) / 2
    assert abs(gaps.mean() - mean) < 4 * std / np.sqrt(len(gaps))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"vocab_size": 64, "seq_len": 64}, r"vocab_size: must be > seq_len 64 .*got 64"),
        ({"vocab_size": 256, "seq_len": 64, "num_kv_pairs": 17}, r"num_kv_pairs: must be <= seq_len / 4 = 16.*17"),
        ({"layout": "causual"}, r"layout: must be one of bidirectional, causal, got 'causual'"),
    ],
)
def test_mqar_refuses_zoologys_impossible_settings(options, message):
    with pytest.raises(ValueError, match=message):
        MQAR("train", num_samples=1, **options)


def test_recipe_names_a_bad_mqar_option():
    with pytest.raises(RecipeError, match=r"data\.options\.vocab_size.*must be > seq_len 128"):
        load_recipe("recipes/recall_mqar_quick.yaml", ["data.options.vocab_size=100"])
    with pytest.raises(RecipeError, match=r"data\.options\.num_kv_pairs"):
        load_recipe("recipes/recall_mqar_quick.yaml", ["data.options.num_kv_pairs=40"])


def test_induction_heads_labels_match_an_independent_checker():
    ds = build_dataset("induction_heads", DataContext("test", is_training=False, num_samples=300, seed=1))
    assert ds.vocab_size == ds.num_classes == 17 and ds.max_length == 256
    answers = Counter()
    for index in range(len(ds)):
        tokens, labels = ds[index]["tokens"].tolist(), ds[index]["labels"].tolist()
        triggers = [p for p, t in enumerate(tokens) if t == 16]
        assert len(triggers) == 2 and triggers[1] == len(tokens) - 1
        labelled = [p for p, label in enumerate(labels) if label != IGNORE_INDEX]
        assert labelled == [len(tokens) - 1] and labels[-1] == tokens[triggers[0] + 1] != 16
        answers[labels[-1]] += 1
    # the answer is any symbol, uniformly: no constant guess scores much above 1/16
    assert max(answers.values()) < 0.15 * len(ds)


def test_selective_copying_labels_match_an_independent_checker():
    ds = build_dataset(
        "selective_copying", DataContext("train", is_training=True, num_samples=300), seq_len=64, num_tokens=8
    )
    assert ds.vocab_size == 18
    for index in range(len(ds)):
        tokens, labels = ds[index]["tokens"].tolist(), ds[index]["labels"].tolist()
        body, tail = tokens[:56], tokens[56:]
        assert tail == [17] * 8
        placed = [t for t in body if t != 0]
        assert len(placed) == 8 and all(1 <= t <= 16 for t in placed)
        assert labels[56:] == placed and set(labels[:56]) == {IGNORE_INDEX}
    with pytest.raises(RecipeError, match=r"data\.options\.num_tokens: must be <= seq_len / 2 = 32, got 33"):
        load_recipe(
            "recipes/recall_selective_copying_quick.yaml", ["data.options.seq_len=64", "data.options.num_tokens=33"]
        )


@pytest.mark.parametrize("name", RECALL)
def test_samples_depend_only_on_seed_split_and_index(name):
    spec = get_dataset(name)
    assert name in list_datasets() and spec.kind == "tokens" and "causal_token_classification" in spec.tasks

    def sample(split, index, *, seed=0, num_samples=50):
        ds = build_dataset(name, DataContext(split, is_training=False, num_samples=num_samples, seed=seed))
        return ds[index]["tokens"]

    torch.testing.assert_close(sample("train", 7), sample("train", 7, num_samples=500))
    torch.testing.assert_close(sample("train", -1), sample("train", 49))
    assert not torch.equal(sample("train", 7), sample("val", 7))
    assert not torch.equal(sample("train", 7), sample("train", 7, seed=1))
    assert not torch.equal(sample("train", 7), sample("train", 8))
    with pytest.raises(IndexError, match="index 50 out of range"):
        sample("train", 50)


def test_default_sizes_are_the_papers():
    assert len(MQAR("train")) == 100_000 and len(MQAR("test")) == 3_000
    assert MQAR("test").vocab_size == 8192 and MQAR("test").seq_len == 64
    assert InductionHeads("train", num_samples=1).symbols == 16
    assert SelectiveCopying("train", num_samples=1).num_tokens == 16


@pytest.mark.parametrize("task_name", ["token_classification", "causal_token_classification"])
def test_loss_and_accuracy_count_the_queries_only(task_name):
    task = get_task(task_name)
    assert "tokens" in task.inputs and task.causal == (task_name == "causal_token_classification")
    ds = MQAR("train", num_samples=4, vocab_size=64, seq_len=32, num_kv_pairs=4)
    labels = torch.stack([ds[i]["labels"] for i in range(4)])
    asked = labels != IGNORE_INDEX
    # right at every query, wrong (and confidently so) everywhere else
    logits = torch.full((4, 32, 64), -10.0)
    logits[asked] = torch.nn.functional.one_hot(labels[asked], 64).float() * 20.0
    logits[~asked, 0] = 50.0
    metrics = task.build_metrics(["top1"], 64)
    metrics.update(*task.metric_inputs(logits, labels))
    assert float(metrics.compute()["top1"]) == 1.0
    assert float(task.loss(logits, labels)) < 1e-6
    assert task.loss_units(labels, None) == int(asked.sum()) == 16
