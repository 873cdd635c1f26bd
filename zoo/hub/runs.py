"""A run directory as a model: what rebuilds a trained model without its training data.

tools/train.py writes `model.json` beside `recipe.yaml` when training starts and copies both into every checkpoint
folder, so `runs/NAME`, `runs/NAME/checkpoints/best` and the `model.safetensors` in it each say which model they
hold (`zoo.load_model` reads any of them):

- `sizes`: the run's `zoo.data._sizes.ModelSizes`, read off the training split when it started (classes, input channels,
  sequence length, vocabulary, horizon, the forecast's columns); every model of the run is built from them;
- `label_names`: one name per output class (image folders, FASTA files, MegaMNIST digits, series labels), or null;
- `pretrained_cfg` (images): timm's preprocessing, input size, mean/std, interpolation and crop;
- `inputs` (1-D data): what `zoo.predict` needs to turn a file into model inputs (DNA windows and tokenizer, series
  z-normalisation, a forecast's look-back, horizon, columns and training mean/std);
- `naflex` (`model.kind: naflex`): how each image is read at its own size (`zoo.data.images.native.READING_KEYS`:
  patch size, token budget, resize rule, mean/std).

A NaFlex model loaded from a `save_pretrained` folder carries the same description (`saved_description`, built from
its config.json: no `data`), so `zoo.predict` reads its images as it reads a NaFlex run's.

`write_run` makes a run directory of a model trained outside the engine (`tools/convert.py`), with checkpoints that
tools/eval.py and `zoo.load_model` verify as they verify the engine's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors.torch import save_model
from torch import nn
from torch.utils.data import Dataset

from .._weights import WEIGHTS_NAME
from ..data._sizes import ModelSizes
from ..tasks import Task
from .checkpoints import model_identity, replace_dir, write_manifest

if TYPE_CHECKING:
    from ..config import Recipe

__all__ = [
    "MODEL_FILE",
    "RECIPE_FILE",
    "copy_run_files",
    "describe_model",
    "read_description",
    "saved_description",
    "write_description",
    "write_run",
]

MODEL_FILE = "model.json"
RECIPE_FILE = "recipe.yaml"
_FORMAT = 1


def _label_names(train_set: Dataset, task: Task, sizes: ModelSizes) -> list[str] | None:
    """The split's class names when there is one per output the metrics count (not a vocabulary, not a forecast)."""
    from ..data._interface import split_attribute

    names = split_attribute(train_set, "classes")
    if names is None or len(names) != task.num_outputs(sizes):
        return None
    return [str(name) for name in names]


def describe_model(recipe: Recipe, train_set: Dataset, task: Task, sizes: ModelSizes) -> dict[str, Any]:
    """`model.json`'s content for the model `recipe` builds from `sizes`, the run's sizes of `train_set` (see the
    module docstring)."""
    # the dataset modules, the model kinds and the recipe schema (torchmetrics, matplotlib) load only when a run is
    # described, not on `import zoo`
    from ..data import get_dataset
    from ..kinds import get_model_kind

    data_kind = get_dataset(recipe.data.name).kind
    description: dict[str, Any] = {
        "format": _FORMAT,
        "kind": recipe.model.kind,
        "task": recipe.task,
        "data": recipe.data.name,
        "input": data_kind,
        "label_names": _label_names(train_set, task, sizes),
        "sizes": sizes.to_json(),
    }
    description.update(get_model_kind(recipe.model.kind).describe(recipe, train_set, task))
    return json.loads(json.dumps(description))


def saved_description(
    kind: str, task: str, label_names: Sequence[str] | None, sizes: Mapping[str, Any], **entries: Any
) -> dict[str, Any]:
    """The description of an image model loaded from a save_pretrained folder, in `model.json`'s layout without the
    run's `data`: `kind`, `task`, `label_names`, `sizes` and the kind's own `entries` (NaFlex: `naflex`)."""
    names = None if label_names is None else [str(name) for name in label_names]
    description = {"format": _FORMAT, "kind": kind, "task": task, "input": "image", "label_names": names}
    return json.loads(json.dumps({**description, "sizes": dict(sizes), **entries}))


def write_description(folder: str | Path, description: Mapping[str, Any]) -> Path:
    """Write `folder/model.json`; returns its path."""
    path = Path(folder) / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(description, indent=2) + "\n")
    return path


def read_description(folder: str | Path) -> dict[str, Any] | None:
    """`folder/model.json`, None when there is none (a run trained before zoo wrote it); a ValueError naming the
    file when it is not a description."""
    path = Path(folder) / MODEL_FILE
    if not path.is_file():
        return None
    try:
        description = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    keys = ("kind", "task", "input", "sizes")
    missing = [key for key in keys if not isinstance(description, dict) or key not in description]
    if missing:
        raise ValueError(f"{path}: not a run's model description: missing {', '.join(missing)}")
    if description.get("format", _FORMAT) > _FORMAT:
        raise ValueError(f"{path} has format {description['format']}, newer than this zoo reads ({_FORMAT})")
    return description


def copy_run_files(run_dir: str | Path, folder: str | Path) -> None:
    """Copy the run's `recipe.yaml` and `model.json` into checkpoint `folder`, so the checkpoint alone rebuilds
    its model (the files a run lacks are skipped)."""
    for name in (RECIPE_FILE, MODEL_FILE):
        if (Path(run_dir) / name).is_file():
            shutil.copy2(Path(run_dir) / name, Path(folder) / name)


def write_run(
    run_dir: str | Path, recipe: Recipe, model: nn.Module, description: Mapping[str, Any], state: Mapping[str, Any]
) -> Path:
    """A run directory for `model`, trained outside the engine: `recipe.yaml` (the recipe that builds it),
    `model.json`, and `checkpoints/best` and `checkpoints/last` holding its weights, the train `state` and a
    manifest, as tools/train.py writes them. Returns `checkpoints/best`."""
    from ..config import save_recipe

    run_dir = Path(run_dir)
    save_recipe(recipe, run_dir / RECIPE_FILE)
    write_description(run_dir, description)
    root = run_dir / "checkpoints"
    tmp = root / "best.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # save_model, not save_file: it stores tied weights once, as accelerate's checkpoints do
    save_model(model, str(tmp / WEIGHTS_NAME))
    (tmp / "meta.json").write_text(json.dumps(dict(state)))
    copy_run_files(run_dir, tmp)
    write_manifest(tmp, model=model_identity(recipe), state=state)
    replace_dir(tmp, root / "best")
    shutil.rmtree(root / "last.tmp", ignore_errors=True)
    shutil.copytree(root / "best", root / "last.tmp")
    replace_dir(root / "last.tmp", root / "last")
    return root / "best"
