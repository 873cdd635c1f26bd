"""A new task and a new model kind are each one definition plus one registration: registered here at run time (as a
new file would on import), with no other edit each trains from a recipe, evaluates, saves, loads back with
`zoo.load_model` and predicts through tools/predict.py.

The throwaway dataset (series of 24 steps, registered the same way) serves both: three tags per series (multi-label
classification, the new task) and one class (classification, with the new model kind).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import reset_accelerate
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MultilabelAccuracy

import zoo
from zoo.config import recipe_from_dict
from zoo.data import _registry as data_registry
from zoo.data import register_dataset
from zoo.evaluate import evaluate
from zoo.kinds import KindOptions, ModelKind, register_model_kind
from zoo.kinds import _base as kinds_registry
from zoo.tasks import HeadSpec, Task, register_task
from zoo.tasks import _base as tasks_registry
from zoo.tasks.heads import ClassificationHead
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("no_network")

STEPS, TAGS = 24, ("rising", "noisy", "shifted")


# -- the throwaway task: several tags per sample ------------------------------------------------------------------


@dataclass(frozen=True)
class MultiLabel(Task):
    """Any number of tags per sample: logits `[b, k]`, multi-hot targets `[b, k]`."""

    name = "throwaway_multilabel"
    target_key = "tags"
    metrics = ("top1",)
    default_metrics = ("top1",)
    selection = ("top1", True)
    inputs = ("series",)
    pooled = True

    def _loss(self, outputs: Tensor, targets: Tensor, mask: Tensor | None, label_smoothing: float) -> Tensor:
        return F.binary_cross_entropy_with_logits(outputs.float(), targets.float())

    def metric_inputs(self, outputs: Tensor, targets: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return outputs.float(), targets.long()

    def build_metrics(self, names, num_classes: int) -> MetricCollection:
        # top1: the share of (sample, tag) pairs predicted right
        return MetricCollection({"top1": MultilabelAccuracy(num_labels=num_classes, average="micro")})

    def model_sizes(self, sizes) -> dict:
        return {"num_classes": sizes.num_classes}

    def num_outputs(self, sizes) -> int:
        return sizes.num_classes

    def build_head(self, spec: HeadSpec) -> nn.Module:
        return ClassificationHead(spec.dim, spec.num_classes, channels=spec.folded_channels, drop=spec.drop)

    def prediction_rows(self, meta, outputs, mask, description, top_k) -> list[dict]:
        """logits `[k]` -> one row: the tags whose probability passes one half."""
        names = description["label_names"]
        chosen = [names[i] for i in torch.nonzero(outputs.sigmoid() > 0.5).flatten().tolist()]
        return [{**meta, "tags": " ".join(chosen)}]


# -- the throwaway model kind: a masked mean over time, then an MLP -------------------------------------------------


@dataclass
class PooledMLPOptions(KindOptions):
    hidden: int = field(default=32, metadata={"min": 1})


class PooledMLP(nn.Module):
    """values `[b, n, c]`, mask `[b, n]` -> logits `[b, k]`."""

    def __init__(self, channels: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, num_classes))

    def forward(self, values: Tensor, mask: Tensor) -> Tensor:
        weights = mask.float()[..., None]
        return self.mlp((values * weights).sum(1) / weights.sum(1).clamp_min(1))


def build_pooled_mlp(recipe, sizes, task) -> nn.Module:
    return PooledMLP(sizes.in_chans, recipe.model.hidden, task.num_outputs(sizes))


POOLED_MLP = ModelKind(
    "throwaway_pooled_mlp",
    {"series": ()},
    build_pooled_mlp,
    lambda batch: (batch["values"], batch["mask"]),
    options=PooledMLPOptions,
    # how zoo.predict reads a CSV file of series for it: one series per row, the label column left out
    describe=lambda recipe, train_set, task: {"inputs": {"input": "series", "nan": "error", "label_column": "label"}},
)


# -- the throwaway dataset ------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class TaggedOptions:
    pass


class TaggedSeries(torch.utils.data.Dataset):
    """Series `[STEPS, 1]` with tags drawn from the split's seed; the label is the first tag."""

    num_classes, classes, in_chans = len(TAGS), TAGS, 1

    def __init__(self, seed: int, count: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tags = torch.rand(count, len(TAGS), generator=generator) > 0.5
        noise = torch.randn(count, STEPS, generator=generator)
        ramp = torch.linspace(-1, 1, STEPS)
        tags = self.tags.float()
        self.values = tags[:, :1] * ramp + tags[:, 1:2] * noise + 2 * tags[:, 2:3]

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {
            "values": self.values[index][:, None],
            "mask": torch.ones(STEPS, dtype=torch.bool),
            "tags": self.tags[index].float(),
            "label": torch.tensor(int(self.tags[index].float().argmax())),
        }


def build_tagged(options: TaggedOptions, context) -> TaggedSeries:
    """Throwaway tagged series."""
    return TaggedSeries(10 * context.seed + ("train", "val", "test").index(context.split), context.num_samples)


@pytest.fixture
def registered():
    """The throwaway task, model kind and dataset, registered for one test only."""
    with tasks_registry._TASKS.scope(), kinds_registry._KINDS.scope(), data_registry._DATASETS.scope():
        register_task(MultiLabel())
        register_model_kind(POOLED_MLP)
        register_dataset(
            "throwaway_tagged", options=TaggedOptions, kind="series", tasks=("throwaway_multilabel", "classification")
        )(build_tagged)
        yield


def recipe_for(task: str, model: dict):
    data = {"name": "throwaway_tagged", "train_samples": 64, "val_samples": 16, "test_samples": 16}
    tree = {
        "name": f"throwaway_{task}",
        "task": task,
        "model": model,
        "data": {**data, "batch_size": 16, "num_workers": 0},
        "train": {"epochs": 2, "mixed_precision": "no"},
        "optim": {"lr": 0.01},
    }
    return recipe_from_dict(tree)


def train_evaluate_predict(recipe, tmp_path: Path, monkeypatch) -> tuple[dict, list[dict]]:
    """Train the recipe, evaluate the run, load it back and predict a CSV file through tools/predict.py."""
    run_dir = tmp_path / "run"
    reset_accelerate()
    Trainer(recipe, run_dir).fit()
    reset_accelerate()
    result = evaluate(run_dir, split="test")
    model = zoo.load_model(run_dir)
    series = TaggedSeries(7, 3).values
    rows = [",".join(f"{v:.5f}" for v in row.tolist()) for row in series]
    (tmp_path / "new.csv").write_text(",".join(f"t{i}" for i in range(STEPS)) + "\n" + "\n".join(rows) + "\n")
    output = tmp_path / "predictions.json"
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import predict as predict_tool

    monkeypatch.setattr(sys, "argv", ["predict.py", str(run_dir), str(tmp_path / "new.csv"), "--output", str(output)])
    predict_tool.main()
    predictions = json.loads(output.read_text())
    # the tool predicts what the loaded model predicts
    with torch.no_grad():
        assert model(series[:, :, None], torch.ones(3, STEPS, dtype=torch.bool)).shape == (3, len(TAGS))
    return result, predictions["predictions"]


def test_a_new_task_trains_evaluates_loads_and_predicts(registered, tmp_path, monkeypatch):
    model = {"kind": "sequence", "embed_dim": 16, "depth": 1, "num_heads": 2, "sequence": {"input": "series"}}
    recipe = recipe_for("throwaway_multilabel", model)
    result, rows = train_evaluate_predict(recipe, tmp_path, monkeypatch)
    assert result["task"] == "throwaway_multilabel" and result["metrics"]["samples"] == 16
    assert 0.0 <= result["metrics"]["top1"] <= 1.0
    assert [row["item"] for row in rows] == [1, 2, 3]
    assert all(set(row["tags"].split()) <= set(TAGS) for row in rows)


def test_a_new_model_kind_trains_evaluates_loads_and_predicts(registered, tmp_path, monkeypatch):
    recipe = recipe_for("classification", {"kind": "throwaway_pooled_mlp", "hidden": 8})
    assert recipe.model.hidden == 8
    result, rows = train_evaluate_predict(recipe, tmp_path, monkeypatch)
    assert result["metrics"]["samples"] == 16 and 0.0 <= result["metrics"]["top1"] <= 1.0
    assert isinstance(zoo.load_model(tmp_path / "run"), PooledMLP)
    assert [row["item"] for row in rows] == [1, 2, 3]
    assert all(row["classes"][0] in TAGS and len(row["classes"]) == len(TAGS) for row in rows)


def test_a_new_kinds_options_are_checked(registered):
    with pytest.raises(ValueError, match=r"model\.hidden: expected an integer >= 1, got 0"):
        recipe_for("classification", {"kind": "throwaway_pooled_mlp", "hidden": 0})
    with pytest.raises(ValueError, match=r"model\.hiden: unknown key \(did you mean 'hidden'\?\)"):
        recipe_for("classification", {"kind": "throwaway_pooled_mlp", "hiden": 8})
    with pytest.raises(ValueError, match=r"model\.img_size: an option of model\.kind 'vit', unused by model\.kind"):
        recipe_for("classification", {"kind": "throwaway_pooled_mlp", "img_size": 64})
