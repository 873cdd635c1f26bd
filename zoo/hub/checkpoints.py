"""Checkpoint folders that prove they are whole, and that they belong to the recipe about to load them.

A save writes every file of `checkpoints/<which>` into `<which>.tmp`, then `manifest.json` last (each file's name,
size and sha256, the model section of the recipe that trained it and the train state), then renames the folder into
place (`replace_dir`). So a folder with a manifest was written to the end, and `verify_checkpoint` finds what went
wrong since (a file truncated by a copy cut short or a full disk, a file missing, bytes changed) before any loader
reads it. `check_recipe` compares the manifest's model section with a recipe: another architecture, attention or
size is named key by key, e.g. `model.attention.name: 'performer' in the checkpoint, 'softmax' in recipe.yaml`.

A folder without a manifest (written by zoo before manifests) is loaded unverified, with a warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._weights import WEIGHTS_NAME, check_state_dict, read_weights

if TYPE_CHECKING:
    from torch import nn

    from ..config import Recipe

__all__ = [
    "EMA_WEIGHTS_NAME",
    "MANIFEST_NAME",
    "CheckpointError",
    "check_checkpoint_weights",
    "check_recipe",
    "fill_tied_weights",
    "find_checkpoint",
    "model_identity",
    "read_manifest",
    "replace_dir",
    "usable_checkpoint",
    "verify_checkpoint",
    "write_manifest",
]

_logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
# train.ema's moving average of the weights, beside accelerate's model.safetensors (zoo.train._ema)
EMA_WEIGHTS_NAME = "model_ema.safetensors"
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"
_FORMAT = 1
# Recipe keys under `model` that change neither the weights' shapes nor what they compute: a checkpoint may be
# resumed or evaluated with other values.
_FREE_KEYS = (
    "pretrained",
    "pretrained_file",
    "grad_checkpointing",
    "drop_rate",
    "drop_path_rate",
    "attn_drop_rate",
    "dynamic_img_size",
    "sequence.forecast_loss",
)


class CheckpointError(ValueError):
    """A checkpoint folder that is incomplete, altered, or trained with another model; one line naming it."""


def find_checkpoint(run_dir: Path, which: str = "last") -> Path | None:
    """`checkpoints/<which>`, or its `.old` twin if a crash fell between the two renames of a save."""
    for candidate in (Path(run_dir) / "checkpoints" / which, Path(run_dir) / "checkpoints" / f"{which}.old"):
        if candidate.is_dir():
            return candidate
    return None


def replace_dir(tmp: Path, final: Path) -> None:
    """Move `tmp` to `final`; the previous `final` survives as `final.old` until the new one is in place."""
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _files(folder: Path) -> list[Path]:
    """Every file under `folder` (sub-folders included: sharded states), the manifest left out, sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST_NAME)


def write_manifest(folder: Path, *, model: Mapping[str, Any], state: Mapping[str, Any]) -> Path:
    """Write `folder/manifest.json` (through a temporary file, so that it is whole or absent): every other file's
    size and sha256, the `model` section of the recipe (`model_identity`) and the train `state`. Call it last."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in _files(folder)}
    manifest = {"format": _FORMAT, "files": files, "model": dict(model), "state": dict(state)}
    tmp = folder / f"{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, folder / MANIFEST_NAME)
    return folder / MANIFEST_NAME


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of `folder`, None when it has none; a manifest that is not valid JSON is a CheckpointError."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{folder}: {MANIFEST_NAME} is corrupt ({error})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{folder}: {MANIFEST_NAME} is corrupt (no 'files' table)")
    return manifest


def verify_checkpoint(folder: Path) -> dict[str, Any] | None:
    """The manifest of `folder` once every file it lists is there with its size and sha256; a CheckpointError
    naming the first file that differs otherwise. None (with a warning) for a folder without a manifest."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} is not a folder")
    manifest = read_manifest(folder)
    if manifest is None:
        _logger.warning("%s has no %s (written by an older zoo?): loaded without verification", folder, MANIFEST_NAME)
        return None
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{folder} is incomplete: {name} is missing (listed in its {MANIFEST_NAME})")
        size = path.stat().st_size
        if size != entry.get("size"):
            cut = " (truncated)" if size < entry.get("size", 0) else ""
            with path.open("rb") as handle:
                if handle.read(len(_LFS_POINTER)) == _LFS_POINTER:
                    cut = ": a git-lfs pointer, not the file (run `git lfs pull`)"
            raise CheckpointError(f"{folder} is damaged: {name} has {size} bytes, {entry.get('size')} when saved{cut}")
        if _sha256(path) != entry.get("sha256"):
            raise CheckpointError(f"{folder} is damaged: the content of {name} changed since it was saved (sha256)")
    return manifest


def model_identity(recipe: Recipe) -> dict[str, Any]:
    """What a checkpoint's weights depend on: the recipe's task and `model` section, as flat dotted keys
    (`model.attention.name`), without the keys that do not shape the weights (dropout, pretrained source)."""
    from ..config import recipe_to_dict  # the model section as a recipe file writes it: the kind's options flat

    flat = {"task": recipe.task}
    flat.update(_flatten(recipe_to_dict(recipe)["model"], "model"))
    return {key: value for key, value in flat.items() if key.removeprefix("model.") not in _FREE_KEYS}


def _default_identity(recipe: Recipe) -> dict[str, Any]:
    """`model_identity` of `recipe` with its model kind's options at their defaults."""
    kind_options = type(recipe.model.options)()
    return model_identity(dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, options=kind_options)))


def _flatten(tree: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}"
        # attention options stay one value: a left-out option and its default are not told apart by the recipe
        if isinstance(value, Mapping) and not path.endswith("options"):
            flat.update(_flatten(value, path))
        else:
            flat[path] = value
    return flat


def check_recipe(manifest: Mapping[str, Any] | None, recipe: Recipe, folder: Path, recipe_source: str) -> None:
    """A CheckpointError naming every model key (up to 4) whose value in the checkpoint's manifest differs from
    `recipe` (read from `recipe_source`, e.g. `runs/x/recipe.yaml`); nothing for a folder without a manifest."""
    if manifest is None or not isinstance(manifest.get("model"), dict):
        return
    # JSON turns tuples into lists: compare through JSON on both sides
    current = json.loads(json.dumps(model_identity(recipe)))
    # a key the checkpoint lacks is an option added to zoo after it was written: it was trained as its default
    defaults = json.loads(json.dumps(_default_identity(recipe)))
    saved = {**{key: defaults[key] for key in current if key in defaults}, **manifest["model"]}
    differ = [key for key in dict.fromkeys([*saved, *current]) if saved.get(key, "<absent>") != current.get(key)]
    if differ:
        shown = "; ".join(
            f"{key}: {saved.get(key)!r} in the checkpoint, {current.get(key)!r} in {recipe_source}"
            for key in differ[:4]
        )
        more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
        raise CheckpointError(f"{folder} was trained with another model: {shown}{more}")


def usable_checkpoint(run_dir: Path, which: str, recipe: Recipe, recipe_source: str) -> tuple[Path, dict | None]:
    """`checkpoints/<which>` of `run_dir`, verified against its manifest and `recipe`, with the manifest.

    A broken `last` says whether `best` is whole and how to use it (`--resume-from best`, `--checkpoint best`): the
    fallback is the user's choice, never made here.
    """
    found = find_checkpoint(run_dir, which)
    if found is None:
        others = [name for name in ("last", "best") if name != which and find_checkpoint(run_dir, name)]
        hint = f" (it holds {', '.join(others)})" if others else ""
        raise FileNotFoundError(f"no {which!r} checkpoint in {Path(run_dir) / 'checkpoints'}{hint}")
    try:
        manifest = verify_checkpoint(found)
    except CheckpointError as error:
        raise CheckpointError(f"{error}{_fallback_hint(run_dir, which)}") from None
    check_recipe(manifest, recipe, found, recipe_source)
    return found, manifest


def check_checkpoint_weights(model: nn.Module, folder: Path) -> None:
    """A one-line WeightsError unless the weights of checkpoint `folder` fit `model` key by key and shape by shape
    (another architecture, width, depth, class count: `zoo._weights.check_state_dict`); nothing for a folder
    whose weights are sharded (no `model.safetensors`)."""
    path = Path(folder) / WEIGHTS_NAME
    if path.is_file():
        check_state_dict(model, fill_tied_weights(model, read_weights(path)), path)


def fill_tied_weights(model: nn.Module, state: Mapping[str, Any]) -> dict[str, Any]:
    """`state` with each weight that `model` ties to another (a language model's embeddings and head) present under
    both names: safetensors stores such a weight once, under either."""
    full, first = dict(state), {}
    for key, value in model.state_dict(keep_vars=True).items():
        if value.numel() == 0:
            continue
        pointer = (value.data_ptr(), tuple(value.shape))
        source = first.setdefault(pointer, key)
        if source != key and (key in full) != (source in full):
            full[key] = full[source] = full.get(key, full.get(source))
    return full


def _fallback_hint(run_dir: Path, which: str) -> str:
    """`; checkpoints/best (step 40) is whole: ...` when another checkpoint of the run verifies."""
    for other in ("best", "last"):
        found = find_checkpoint(run_dir, other) if other != which else None
        if found is None:
            continue
        try:
            manifest = verify_checkpoint(found)
        except CheckpointError:
            continue
        step = (manifest or {}).get("state", {}).get("step")
        at = f" (step {step})" if step is not None else ""
        return f"; {found}{at} is whole: use it with --resume-from {other} (training) or --checkpoint {other} (eval)"
    return "; no other checkpoint of the run is whole: train again with --overwrite"
