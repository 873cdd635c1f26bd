"""From a run folder or checkpoint to verified weights: the one route of `zoo.load_model`, tools/eval.py,
tools/predict.py and tools/convert.py.

A run of tools/train.py is a folder holding `recipe.yaml`, `model.json` and `checkpoints/best`, `checkpoints/last`;
each checkpoint folder holds `model.safetensors`, its own copies of the two files and a `manifest.json`
(`zoo.hub.checkpoints`). `resolve_run` accepts the run folder, a checkpoint folder (also one copied out of its run) or
the weights in one, and returns the weights once the checkpoint is whole (its manifest) and was trained with the
model the recipe describes (`check_recipe`), with the recipe and `model.json` that rebuild the model: everything a
loader needs, read in one pass over the folder (`open_run`: the same for a path that may be no part of a run).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .._validate import unknown_name
from .._weights import WEIGHTS_NAME, check_state_dict, read_weights
from ..data._sizes import ModelSizes
from .checkpoints import (
    EMA_WEIGHTS_NAME,
    check_recipe,
    fill_tied_weights,
    find_checkpoint,
    usable_checkpoint,
    verify_checkpoint,
)
from .runs import MODEL_FILE, RECIPE_FILE, read_description

if TYPE_CHECKING:
    from torch import nn

    from ..config import Recipe

__all__ = ["CHECKPOINTS", "RunWeights", "find_run", "load_checked", "open_run", "resolve_run", "without_pretrained"]

# the checkpoints of a run, by name
CHECKPOINTS = ("best", "last")
FilesFrom = Literal["checkpoint", "run"]


def without_pretrained(recipe: Recipe) -> Recipe:
    """`recipe` with its pretrained weights off (its model kind says which options fetch them): a checkpoint holds
    every weight, and a student converted from a teacher takes the teacher's; none is fetched again."""
    return dataclasses.replace(recipe, model=recipe.model.without_pretrained())


@dataclasses.dataclass(frozen=True)
class RunWeights:
    """A run's verified weights and what rebuilds their model.

    `home` holds the `recipe.yaml` and `model.json` (`description`) that rebuild it; `recipe` is that recipe with its
    pretrained settings off; `folder` is the verified checkpoint folder (None for a weights file given by path,
    read unverified); `manifest` its manifest (None for a folder written without one).
    """

    home: Path
    recipe: Recipe
    description: dict[str, Any]
    weights: Path
    folder: Path | None
    manifest: dict[str, Any] | None

    @property
    def recipe_path(self) -> Path:
        return self.home / RECIPE_FILE

    @property
    def sizes(self) -> ModelSizes:
        """The run's sizes (model.json's `sizes`), which every model of the run is built from."""
        return ModelSizes.from_json(self.description["sizes"])

    def build_model(self) -> nn.Module:
        """The run's model, built by its model kind from the recipe and the run's sizes (no data read), with the
        verified weights loaded (`load_checked`); in train mode, as built."""
        from ..kinds import build_model

        model = build_model(self.recipe, self.sizes)
        load_checked(model, self.weights)
        return model


@dataclasses.dataclass(frozen=True)
class _Located:
    home: Path
    weights: Path
    folder: Path | None
    # the run directory and its checkpoint chosen by name (best, last); None for a folder or file given by path
    run_dir: Path | None = None
    name: str | None = None


def find_run(path: Path, checkpoint: str | Path = "best", files_from: FilesFrom = "checkpoint") -> _Located | None:
    """Where the run of `path` keeps its recipe and weights, without reading them; None when `path` is no part of a
    run. `path`: a run directory (its `checkpoints/<checkpoint>`), a checkpoint folder or the weights in one.
    `checkpoint` may also name a checkpoint folder or a weights file of the run directory `path` (tools/eval.py's
    --checkpoint). The recipe and model.json are the checkpoint's own copies (what trained it; the run's two
    levels up for a folder without them), or with `files_from="run"` those of the run directory `path` (what
    tools/eval.py runs, checked against the checkpoint)."""
    path = Path(path).expanduser()
    if path.is_dir() and (path / RECIPE_FILE).is_file() and not (path / WEIGHTS_NAME).is_file():
        located = _in_run_directory(path, checkpoint)
        own = located.folder is not None and (located.folder / RECIPE_FILE).is_file()
        if files_from == "checkpoint" and own:
            return dataclasses.replace(located, home=located.folder)
        return located
    folder = path if path.is_dir() else path.parent
    weights = path if path.is_file() else folder / WEIGHTS_NAME
    for home in (folder, folder.parent.parent):
        if (home / RECIPE_FILE).is_file():
            if not weights.is_file():
                raise FileNotFoundError(f"{folder} is part of the run {home} but holds no {WEIGHTS_NAME}")
            return _Located(home, weights, folder)
    return None


def _in_run_directory(run_dir: Path, checkpoint: str | Path) -> _Located:
    if checkpoint in CHECKPOINTS:
        found = find_checkpoint(run_dir, str(checkpoint))
        if found is None:
            others = [name for name in CHECKPOINTS if name != checkpoint and find_checkpoint(run_dir, name)]
            hint = f" (it holds {', '.join(others)}: pass checkpoint={others[0]!r})" if others else ""
            raise FileNotFoundError(f"{run_dir} is a run directory without a {checkpoint!r} checkpoint{hint}")
        return _Located(run_dir, found / WEIGHTS_NAME, found, run_dir, str(checkpoint))
    given = Path(checkpoint).expanduser()
    if not given.exists():
        # a bare word is a misspelt checkpoint name; anything else a path that is not there
        if isinstance(checkpoint, str) and "/" not in checkpoint and "." not in checkpoint:
            raise unknown_name("checkpoint", checkpoint, CHECKPOINTS)
        raise FileNotFoundError(f"checkpoint weights {given} do not exist")
    if given.is_dir():
        return _Located(run_dir, given / WEIGHTS_NAME, given)
    return _Located(run_dir, given, None)


def resolve_run(
    source: str | Path, checkpoint: str | Path = "best", files_from: FilesFrom = "checkpoint"
) -> RunWeights:
    """The verified weights of `source` (a run directory, a checkpoint folder or the weights in one; `checkpoint`
    and `files_from` as in `find_run`) and what rebuilds their model. A checkpoint that is damaged or was trained
    with another model than the recipe describes is a CheckpointError (naming a whole checkpoint of the run to use
    instead, if there is one); a run without `model.json` a FileNotFoundError."""
    run = open_run(source, checkpoint, files_from)
    if run is None:
        raise ValueError(f"{source}: not a run directory of tools/train.py, a checkpoint folder or the weights in one")
    return run


def open_run(
    source: str | Path, checkpoint: str | Path = "best", files_from: FilesFrom = "checkpoint"
) -> RunWeights | None:
    """`resolve_run`'s verified weights and what rebuilds their model, or None when `source` is no part of a run (a
    save_pretrained folder, a bare weights file: `zoo.load_model` reads those otherwise)."""
    from ..config import load_recipe

    source = Path(source).expanduser()
    located = find_run(source, checkpoint, files_from)
    if located is None:
        return None
    recipe_path = located.home / RECIPE_FILE
    recipe = without_pretrained(load_recipe(recipe_path))
    manifest = None
    if located.name is not None:
        # a run's own best/last: a broken one names the run's other checkpoint if that one is whole
        _, manifest = usable_checkpoint(located.run_dir, located.name, recipe, str(recipe_path))
    elif located.folder is not None:
        manifest = verify_checkpoint(located.folder)
        check_recipe(manifest, recipe, located.folder, str(recipe_path))
    if not located.weights.is_file():
        raise FileNotFoundError(f"checkpoint weights {located.weights} do not exist")
    if not source.is_file() and not Path(checkpoint).expanduser().is_file():
        located = _evaluated_weights(located, recipe)
    description = read_description(located.home)
    if description is None:
        raise FileNotFoundError(
            f"{located.home / MODEL_FILE} does not exist: is {located.home} a run of tools/train.py?"
        )
    return RunWeights(located.home, recipe, description, located.weights, located.folder, manifest)


def _evaluated_weights(located: _Located, recipe: Recipe) -> _Located:
    """The weights a run evaluated, for a run or checkpoint folder (a weights file named by path is read as it is):
    under `train.ema.evaluate: ema` the checkpoint's moving average (`model_ema.safetensors`) in place of its
    `model.safetensors`."""
    ema = recipe.train.ema
    if ema is None or ema.evaluate != "ema" or located.folder is None:
        return located
    averaged = located.folder / EMA_WEIGHTS_NAME
    if not averaged.is_file():
        raise FileNotFoundError(f"{located.folder} holds no {EMA_WEIGHTS_NAME}, which train.ema.evaluate 'ema' reads")
    return dataclasses.replace(located, weights=averaged)


def load_checked(model: nn.Module, weights: Path) -> None:
    """Load `weights` into `model` once they fit key by key and shape by shape (a one-line WeightsError naming
    what differs otherwise: another architecture, size, class count; a text file, a git-lfs pointer). A weight the
    model ties to another (a language model's embeddings and head) may be stored once, under either name."""
    state = fill_tied_weights(model, read_weights(weights))
    check_state_dict(model, state, weights)
    model.load_state_dict(state)
