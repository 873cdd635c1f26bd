"""Experiment recipes: YAML files loaded into validated, typed dataclasses.

A recipe file may name shared parts under ``base`` (one path or a list, relative to the file). The bases are
deep-merged in order, then the file itself: mappings merge key by key, every other value is replaced. Command
line overrides (``train.epochs=3``) are applied last. The merged tree is checked against the dataclasses of
``_config.py``; every problem raises :class:`RecipeError` with one line that names the file (or override), the key
path, the bad value and what is allowed::

    base: parts/vit_small.yaml
    model:
      attention: {name: performer, options: {nb_features: 64}}
    train:
      epochs: 3

A recipe trains one ``task`` (``zoo.tasks``: classification by default; forecast, token_classification and
causal_lm for the 1-D data) with one ``model.kind`` (``zoo.kinds``): ``vit`` (timm's VisionTransformer,
images) or ``sequence`` (the 1-D ``zoo.models.SequenceModel``, configured under ``model.sequence``). The keys of
``model`` are those every kind shares (width, depth, heads, attention, dropout) and the kind's own, checked against
its options dataclass (``zoo.kinds.get_model_kind(kind).options``).
``data.options`` holds the options of the chosen dataset, checked against that dataset's own options dataclass
(``zoo.data.get_dataset(name).options``); the keys shared by every dataset (seed, sample counts, batch sizes,
``root``) are ``data``'s own::

    task: forecast
    model: {kind: sequence, embed_dim: 64, sequence: {input: series, patch_len: 16}}
    data: {name: elecdemand, options: {lookback: 336, horizon: 96}}
    metrics: [mse, mae]

YAML is read with the YAML 1.2 rules for booleans and floats: only ``true``/``false`` are booleans (so
``mixed_precision: no`` is the string ``'no'``) and ``1e-3`` is a float.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from .._schema import RecipeError, build
from ..tasks import get_task, list_tasks
from ._config import (
    AttentionConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    Recipe,
    ScheduleConfig,
    TrainConfig,
)
from ._files import Dumper, apply_override, layers, merge, source_of

__all__ = [
    "AttentionConfig",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "Recipe",
    "RecipeError",
    "ScheduleConfig",
    "SequenceConfig",
    "TrainConfig",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_dict",
    "save_recipe",
]


def _build_recipe(tree: Mapping, origins: Mapping[str, str], default_source: str) -> Recipe:
    task = tree.get("task", "classification")
    if "metrics" not in tree and isinstance(task, str) and task in list_tasks():
        # the task's own default, not classification's
        tree = {**tree, "metrics": list(get_task(task).default_metrics)}
    try:
        return build(Recipe, tree, "")
    except RecipeError as err:
        source = source_of(err.key, origins, default_source)
        if source == default_source or source.startswith("override "):
            raise RecipeError(err.problem, source=source, key=err.key) from None
        # a key from a base: name the file the user wrote, and the base that set it
        problem = f"{err.problem} (set in its base {source})"
        raise RecipeError(problem, source=default_source, key=err.key) from None


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Load a recipe file with its bases, apply ``KEY.PATH=VALUE`` overrides and validate it.

    ``name`` defaults to the file's stem when the file itself does not set it.
    """
    path = Path(path)
    found = layers(path)
    tree: dict = {}
    origins: dict[str, str] = {}
    for source, data in found:
        merge(tree, data, source, origins)
    if "name" not in found[-1][1]:
        tree["name"] = path.stem
        origins["name"] = str(path)
    if isinstance(overrides, str):
        overrides = [overrides]
    for item in overrides:
        apply_override(tree, item, origins)
    return _build_recipe(tree, origins, str(path))


def recipe_from_dict(data: Mapping, *, source: str = "<dict>") -> Recipe:
    """Validate a plain mapping (as read from YAML) into a :class:`Recipe`."""
    if not isinstance(data, Mapping):
        raise RecipeError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    return _build_recipe(data, {}, source)


def recipe_to_dict(recipe: Recipe) -> dict:
    """The recipe as plain dicts, lists and scalars, as a recipe file writes it (the model kind's options flat in
    ``model``)."""
    data = dataclasses.asdict(recipe)
    data["model"].update(data["model"].pop("options"))
    return data


def __getattr__(name: str):
    # the 1-D model's section lives with its model kind, which imports this package
    if name == "SequenceConfig":
        from ..kinds import SequenceConfig

        return SequenceConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def save_recipe(recipe: Recipe, path: str | Path) -> Path:
    """Write the resolved recipe as YAML (parent folders created); ``load_recipe(path) == recipe``."""
    path = Path(path)
    data = recipe_to_dict(recipe)
    # a recipe changed after loading is checked again, so that the saved file always loads
    recipe_from_dict(data, source=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    # through a temporary file: a run killed while writing never leaves half a recipe beside its checkpoints
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
