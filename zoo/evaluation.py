"""Evaluate a trained run directory on a split: the task's metrics through torchmetrics, a confusion-matrix plot
where the task counts classes, and the baselines the dataset is judged against (its `baselines(train_set)`: the
GC-content nearest-mean rule for genomes, seasonal-naive and linear forecasts for the forecasting sets), all on the
same split."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import Dataset

from .checkpoints import check_recipe, fill_tied_weights, find_checkpoint, usable_checkpoint, verify_checkpoint
from .engine import build_loader, build_split, evaluate, resolve_mixed_precision
from .model_kinds import get_model_kind
from .pretrained import check_state_dict, read_weights
from .recipe import Recipe, load_recipe

__all__ = ["baselines", "evaluate_run", "load_checked", "plot_confusion", "resolve_weights"]

_logger = logging.getLogger(__name__)


def resolve_weights(run_dir: Path, checkpoint: str, recipe: Recipe | None = None) -> Path:
    """`best`/`last` of the run, a checkpoint directory, or a weights file -> the weights file.

    A checkpoint folder is verified against its manifest (every file whole) and, given the run's `recipe`, against
    the model it was trained with (`zoo.checkpoints`): a damaged or foreign checkpoint is a CheckpointError.
    """
    recipe_source = str(Path(run_dir) / "recipe.yaml")
    if checkpoint in ("best", "last"):
        if recipe is None:
            found = find_checkpoint(run_dir, checkpoint)
            if found is None:
                raise FileNotFoundError(f"no {checkpoint!r} checkpoint in {run_dir / 'checkpoints'}")
            verify_checkpoint(found)
        else:
            found, _ = usable_checkpoint(run_dir, checkpoint, recipe, recipe_source)
        path = found
    else:
        path = Path(checkpoint)
        if path.is_dir():
            manifest = verify_checkpoint(path)
            if recipe is not None:
                check_recipe(manifest, recipe, path, recipe_source)
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint weights {path} do not exist")
    return path


def load_checked(model: nn.Module, weights: Path) -> None:
    """Load `weights` into `model` once they fit key by key and shape by shape (a one-line WeightsError naming
    what differs otherwise: another architecture, size, class count; a text file, a git-lfs pointer)."""
    state = fill_tied_weights(model, read_weights(weights))
    check_state_dict(model, state, weights)
    model.load_state_dict(state)


def plot_confusion(matrix: Sequence[Sequence[int]], path: Path, class_names: Sequence[str] | None = None) -> None:
    """The confusion matrix as a PNG, class names as they are written: in a font that has their letters (DejaVu
    Sans covers Latin, Greek and Cyrillic; another installed font is looked for, e.g. for CJK), else with the
    missing letters as `\\uXXXX` escapes; `$` is never read as mathtext."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = torch.tensor(matrix)
    fonts, names = _font_for([str(name) for name in (class_names or range(len(values)))])
    with matplotlib.rc_context({"text.parse_math": False, "font.family": fonts}):
        fig, ax = plt.subplots(figsize=(1 + 0.6 * len(names), 1 + 0.6 * len(names)))
        # a NumPy array: matplotlib's conversion of a tensor goes through a deprecated __array__ call
        ax.imshow(values.numpy(), cmap="Blues")
        ax.set(
            xticks=range(len(names)),
            yticks=range(len(names)),
            xticklabels=names,
            yticklabels=names,
            xlabel="predicted",
            ylabel="true",
        )
        ax.tick_params(axis="x", labelrotation=90 if max(map(len, names), default=0) > 3 else 0)
        threshold = values.max().item() / 2
        cells = torch.cartesian_prod(torch.arange(len(names)), torch.arange(len(names))).tolist()
        for (row, col), count in zip(cells, values.flatten().tolist()):
            ax.text(col, row, count, ha="center", va="center", color="white" if count > threshold else "black")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)


def _font_for(names: list[str]) -> tuple[list[str], list[str]]:
    """Font families that draw every letter of `names` (DejaVu Sans, then installed fonts for the letters it lacks:
    matplotlib falls back glyph by glyph), and the names, each letter no font has written as an escape."""
    from matplotlib import font_manager, ft2font

    default = font_manager.findfont("DejaVu Sans")
    missing = {ord(c) for c in "".join(names) if not c.isspace()} - _covered(ft2font.FT2Font(default))
    families = ["DejaVu Sans"]
    # LastResort draws a placeholder box for every letter: it covers nothing
    paths = sorted({e.fname for e in font_manager.fontManager.ttflist if "LastResort" not in e.fname} - {default})
    for fname in paths if missing else ():
        try:
            face = ft2font.FT2Font(fname)
        except (OSError, RuntimeError):
            continue
        found = missing & _covered(face)
        if found:
            families.append(face.family_name)
            missing -= found
        if not missing:
            break
    if not missing:
        return families, names
    _logger.warning("no installed font draws %s of the class names: written as escapes", "".join(map(chr, missing)))
    return families, ["".join(f"\\u{ord(c):04x}" if ord(c) in missing else c for c in name) for name in names]


def _covered(face) -> set[int]:
    """The code points an FT2Font has glyphs for."""
    return set(face.get_charmap())


def baselines(train_set: Dataset, dataset: Dataset) -> dict[str, dict[str, float]]:
    """Scores of the simple rules the model should beat on `dataset` (the dataset's own `baselines(train_set)`):
    genomes -> `{"gc_nearest_mean": {"top1": ...}}`; forecasting -> `{"linear": {"mse", "mae"}, "seasonal_naive":
    {...}}` (the seasonal one where the season is known); `{}` for a dataset without baselines."""
    rules = getattr(dataset, "baselines", None)
    return rules(train_set) if callable(rules) else {}


def evaluate_run(run_dir: Path, *, checkpoint: str = "best", split: str = "test") -> dict:
    """Metrics of `run_dir`'s checkpoint on `split` with the task's baselines, and for the classification tasks
    the confusion matrix saved as a PNG beside it (`confusion_png`, None for the others)."""
    recipe_path = Path(run_dir) / "recipe.yaml"
    if not recipe_path.is_file():
        raise FileNotFoundError(f"{recipe_path} does not exist: is {run_dir} a run directory of tools/train.py?")
    recipe = load_recipe(recipe_path)
    # The checkpoint holds every weight: do not fetch pretrained ones again.
    recipe = dataclasses.replace(
        recipe, model=dataclasses.replace(recipe.model, pretrained=False, pretrained_file=None)
    )
    weights = resolve_weights(Path(run_dir), checkpoint, recipe)
    dataset = build_split(recipe, split)
    # The model is sized from its training split (classes, length, channels), as in training.
    train_set = build_split(recipe, "train")
    kind = get_model_kind(recipe.model.kind)
    task = kind.task(recipe)
    model = kind.build(recipe, train_set, task)
    load_checked(model, weights)
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(recipe.train.mixed_precision))
    loader = build_loader(recipe, dataset, train=False)
    model, loader = accelerator.prepare(model, loader)
    names = list(dict.fromkeys([*recipe.metrics, *task.eval_metrics]))
    metrics = evaluate(
        model,
        loader,
        accelerator,
        task=task,
        model_inputs=kind.inputs,
        metric_names=names,
        num_classes=task.num_outputs(train_set),
    )
    png = Path(run_dir) / f"confusion_{split}.png" if "confusion" in metrics else None
    if png is not None and accelerator.is_main_process:
        plot_confusion(metrics["confusion"], png, getattr(dataset, "classes", None))
    return {
        "run_dir": str(run_dir),
        "checkpoint": str(weights),
        "split": split,
        "task": recipe.task,
        "metrics": metrics,
        "baselines": baselines(train_set, dataset),
        "confusion_png": None if png is None else str(png),
    }
