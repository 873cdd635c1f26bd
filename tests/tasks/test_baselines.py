"""Every task's trivial baseline, as tools/eval.py prints it beside the metric: a classifier's majority class (of the
training split, scored on the evaluated one) and chance, a tagger's majority label over labelled positions, a
language model's majority next token; each checked against counts made by hand on tiny splits. And every quick
recipe's first comment line names its measured result page or says it is a smoke test."""

import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from zoo.evaluate import evaluation_lines
from zoo.tasks import IGNORE_INDEX, get_task

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


class Items(Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def images(labels):
    return Items([(torch.zeros(1, 2, 2), label) for label in labels])


def test_classification_scores_the_training_majority_on_the_evaluated_split_and_chance():
    # training: class 2 three times, 0 and 1 once each; evaluated: class 2 once in 4 samples
    rules = get_task("classification").baselines(images([2, 0, 2, 1, 2]), images([1, 2, 1, 0]), 3)
    assert rules == {"majority_class": {"top1": 0.25}, "chance": {"top1": pytest.approx(1 / 3)}}


def test_a_set_that_knows_its_labels_is_not_rendered():
    class Known(Items):
        def sample_label(self, index):
            return [4, 4, 0][index]

        def __getitem__(self, index):
            raise AssertionError("rendered a sample for its label")

    rules = get_task("classification").baselines(Known([None] * 3), images([4, 0, 0, 0]), 5)
    assert rules["majority_class"] == {"top1": 0.25}


def test_megamnist_names_each_canvas_label_without_rendering_it():
    from zoo.data._registry import DataContext, build_dataset

    options = {"canvas_size": 32, "digit_size": 8, "num_target": 1, "num_other": 0, "num_clutter": 0}
    data = build_dataset(
        "megamnist", DataContext(split="val", is_training=False, num_samples=6, img_size=32, in_chans=1), **options
    )
    assert [data.sample_label(i) for i in range(6)] == [data[i][1] for i in range(6)]


def test_token_classification_counts_labelled_kept_positions_only():
    def sample(labels, mask):
        return {"tokens": torch.zeros(len(labels)), "labels": torch.tensor(labels), "mask": torch.tensor(mask)}

    ignored = IGNORE_INDEX
    # training: label 1 at 3 kept positions (a fourth is masked out), label 0 at 2; ignored ones count for nothing
    train = Items([sample([1, 1, ignored, 0], [1, 1, 1, 1]), sample([1, 0, 1, 1], [1, 1, 1, 0])])
    # evaluated: 5 labelled kept positions, 2 of them label 1
    evaluated = Items([sample([0, 1, ignored], [1, 1, 1]), sample([0, 1, 0, 1], [1, 1, 1, 0])])
    for name in ("token_classification", "causal_token_classification"):
        assert get_task(name).baselines(train, evaluated, 2) == {"majority_label": {"top1": 0.4}}


def test_causal_lm_scores_the_majority_next_token():
    def sample(tokens):
        return {"tokens": torch.tensor(tokens), "mask": torch.ones(len(tokens), dtype=torch.bool)}

    # the first token of a sample is never predicted: 3 is most frequent among the others (3 of 5) in training
    train = Items([sample([0, 3, 3, 1]), sample([0, 0, 3])])
    evaluated = Items([sample([3, 3, 0, 0, 1])])  # predicted tokens 3, 0, 0, 1: one 3 in 4
    assert get_task("causal_lm").baselines(train, evaluated, 4) == {"majority_token": {"top1": 0.25}}


def test_forecast_and_segmentation_leave_their_baselines_to_the_dataset():
    assert get_task("forecast").baselines(images([0]), images([0]), 0) == {}
    assert get_task("segmentation").baselines(images([0]), images([0]), 2) == {}


def test_eval_prints_each_baseline_beside_the_metric(tmp_path):
    result = {
        "split": "test",
        "metrics": {"top1": 0.5, "samples": 4},
        "baselines": {"majority_class": {"top1": 0.25}, "chance": {"top1": 0.1}},
    }
    lines = evaluation_lines(result, tmp_path / "eval.json")
    assert lines[:3] == ["test: top1=0.5000", "baseline majority_class: top1=0.2500", "baseline chance: top1=0.1000"]


QUICK = sorted([*RECIPES.glob("*_quick.yaml"), RECIPES / "quickstart.yaml"])


@pytest.mark.parametrize("path", QUICK, ids=lambda p: p.stem)
def test_every_quick_recipe_names_its_result_page_or_says_smoke_test(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), f"{path.name} opens without a comment"
    pages = re.findall(r"benchmarks/[\w/.-]+\.(?:md|json)", first)
    assert pages or "smoke test" in first.lower(), f"{path.name}: {first!r}"
    root = RECIPES.parent
    assert all((root / page).is_file() for page in pages), f"{path.name} names a missing page: {pages}"
