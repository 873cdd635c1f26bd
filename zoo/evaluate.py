"""Evaluate a trained run directory (or a model) on a split, through `evaluate`: the task's metrics through
torchmetrics, a confusion-matrix plot where the task counts classes, and the trivial baselines the model is judged
against: the task's (`Task.baselines`: a classifier's majority class of the training split and chance, a tagger's
majority label, a language model's majority token) and the dataset's (its `baselines(train_set)`: the GC-content
nearest-mean rule for genomes, seasonal-naive and linear forecasts for the forecasting sets, the all-background rule
for masks), all on the same split."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import Dataset

from .config import Recipe
from .data._interface import split_attribute
from .hub._run_weights import resolve_run
from .hub.runs import RECIPE_FILE
from .kinds import get_model_kind
from .splits import build_loader, build_split
from .tasks import Task
from .train.eval_loop import evaluate_loader
from .train.parts import resolve_mixed_precision

__all__ = [
    "CONFUSION_MAX_CLASSES",
    "ConfusionLayout",
    "baselines",
    "confusion_layout",
    "evaluate",
    "evaluation_lines",
    "plot_confusion",
    "plot_masks",
    "save_evaluation",
]

_logger = logging.getLogger(__name__)


# Geometry of the confusion plot, in points (1/72 in): a class's cell is _CELL_PT wide up to 40 classes, narrower
# beyond so that the matrix stays within _MATRIX_PT; the margins grow with the longest class name.
_CELL_PT = 36.0
_MATRIX_PT = 1440.0
_FONT_PT = (6.0, 10.0)  # the smallest and largest size of class names and counts
_NAME_CHARS = 40  # a longer class name is cut with an ellipsis in the plot (eval.json keeps it whole)
_TICK_PT = 8.0  # a tick and its pad
_AXIS_LABEL_PT = 24.0  # "true" / "predicted" and their pad
_COLORBAR_PT = 60.0  # the colour bar and its numbers, drawn when no count fits a cell
# up to this many classes a zero count is written; beyond, its cell is left empty (the many zeros of a large
# matrix hide its few errors, and drawing ten thousand labels is slow)
_ZEROS_UP_TO = 20
CONFUSION_DPI = 100
# ImageNet-1k's classes and fewer: the implicit confusion matrix's limit (`_implicit_metrics`)
CONFUSION_MAX_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class ConfusionLayout:
    """Where `plot_confusion` draws, in points: the cell of one class, the size of the class names (every
    `stride`-th class named), the size of the counts (None: not written, a colour bar instead), whether the
    predicted names are turned upright, and the margins around the matrix."""

    cell: float
    font: float
    stride: int
    count_font: float | None
    rotate: bool
    left: float
    bottom: float
    right: float
    top: float = 12.0

    def size(self, classes: int) -> tuple[float, float]:
        """(width, height) of the figure in points."""
        side = self.cell * classes
        return self.left + side + self.right, self.bottom + side + self.top


def confusion_layout(
    values: torch.Tensor, names: Sequence[str], fonts: Sequence[str] = ("DejaVu Sans",)
) -> ConfusionLayout:
    """The layout of `values` (`[classes, classes]` counts) with class `names` (cut at 40 letters) drawn in
    `fonts`."""
    classes = len(values)
    cell = min(_CELL_PT, _MATRIX_PT / max(classes, 1))
    font = min(max(0.8 * cell, _FONT_PT[0]), _FONT_PT[1])
    # every k-th name where the cells are narrower than one line of text
    stride = max(1, math.ceil(font / cell))
    rotate = max((len(_shorten(name)) for name in names), default=0) > 3
    name_width = max((_text_width(_shorten(name), font, fonts) for name in names[::stride]), default=0.0)
    count_font = _count_font(values, cell, fonts)
    return ConfusionLayout(
        cell=cell,
        font=font,
        stride=stride,
        count_font=count_font,
        rotate=rotate,
        left=name_width + _TICK_PT + _AXIS_LABEL_PT,
        bottom=(name_width if rotate else font) + _TICK_PT + _AXIS_LABEL_PT,
        right=12.0 if count_font else _COLORBAR_PT,
    )


def plot_confusion(matrix: Sequence[Sequence[int]], path: Path, class_names: Sequence[str] | None = None) -> None:
    """The confusion matrix as a PNG, readable from 2 to hundreds of classes (`confusion_layout`): each class a
    square cell, its count written in it where the count fits (beyond 20 classes only counts that are not zero; a
    colour bar where no count fits), margins as wide as the longest class name needs, a name every k-th class
    where the cells are narrower than a line. Class names are drawn as they are written, cut at 40 letters: in a
    font that has their letters (DejaVu Sans covers Latin, Greek and Cyrillic; another installed font is looked for,
    e.g. for CJK), else with the missing letters as `\\uXXXX` escapes; `$` is never read as mathtext."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = torch.tensor(matrix)
    classes = len(values)
    fonts, names = _font_for([_shorten(str(name)) for name in (class_names or range(classes))])
    layout = confusion_layout(values, names, fonts)
    width, height = layout.size(classes)
    side = layout.cell * classes
    with matplotlib.rc_context({"text.parse_math": False, "font.family": fonts, "font.size": layout.font}):
        fig = plt.figure(figsize=(width / 72, height / 72))
        ax = fig.add_axes((layout.left / width, layout.bottom / height, side / width, side / height))
        # a NumPy array: matplotlib's conversion of a tensor goes through a deprecated __array__ call
        image = ax.imshow(values.numpy(), cmap="Blues", interpolation="nearest", aspect="equal")
        ticks = range(0, classes, layout.stride)
        named = names[:: layout.stride]
        ax.set(xticks=ticks, yticks=ticks, xticklabels=named, yticklabels=named, xlabel="predicted", ylabel="true")
        ax.tick_params(axis="x", labelrotation=90 if layout.rotate else 0)
        if layout.count_font:
            _write_counts(ax, values, layout.count_font)
        else:
            bar = (layout.left + side + 8) / width, layout.bottom / height, 10 / width, side / height
            fig.colorbar(image, cax=fig.add_axes(bar))
        fig.savefig(path, dpi=CONFUSION_DPI)
    plt.close(fig)


def _write_counts(ax, values: torch.Tensor, size: float) -> None:
    """Each count in its cell, white on the dark ones; zeros left out of a matrix of more than 20 classes."""
    classes, threshold = len(values), values.max().item() / 2
    cells = torch.cartesian_prod(torch.arange(classes), torch.arange(classes)).tolist()
    for (row, col), count in zip(cells, values.flatten().tolist(), strict=True):
        if count == 0 and classes > _ZEROS_UP_TO:
            continue
        color = "white" if count > threshold else "black"
        ax.text(col, row, count, ha="center", va="center", color=color, fontsize=size)


def _shorten(name: str) -> str:
    return name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 1] + "\u2026"


def _text_width(text: str, size: float, fonts: Sequence[str]) -> float:
    """Width in points of `text` drawn at `size` points in `fonts` (the first one's widths; the others draw only
    the few letters it lacks)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    width, _, _ = TextToPath().get_text_width_height_descent(text, FontProperties(family=list(fonts), size=size), False)
    return width


def _count_font(values: torch.Tensor, cell: float, fonts: Sequence[str]) -> float | None:
    """The largest size (within _FONT_PT) at which the widest count fits a cell of `cell` points; None when none
    does."""
    widest = str(int(values.max().item())) if values.numel() else "0"
    size = _FONT_PT[1]
    while size >= _FONT_PT[0]:
        if size <= 0.8 * cell and _text_width(widest, size, fonts) <= 0.85 * cell:
            return size
        size -= 1.0
    return None


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


def baselines(train_set: Dataset | None, dataset: Dataset) -> dict[str, dict[str, float]]:
    """Scores of the simple rules the model should beat on `dataset` (the dataset's own `baselines(train_set)`):
    genomes -> `{"gc_nearest_mean": {"top1": ...}}`; forecasting -> `{"linear": {"mse", "mae"}, "seasonal_naive":
    {...}}` (the seasonal one where the season is known); `{}` for a dataset without baselines."""
    rules = split_attribute(dataset, "baselines")
    return rules(train_set) if callable(rules) else {}


def evaluate(
    source: str | Path | nn.Module,
    *,
    split: str = "test",
    checkpoint: str = "best",
    recipe: Recipe | None = None,
    num_classes: int | None = None,
) -> dict[str, Any]:
    """The one way to evaluate: `source`'s metrics on `split`, as tools/eval.py writes them to eval.json
    (`run_dir`, `checkpoint`, `split`, `task`, `metrics`, `baselines`, `confusion_png`).

    `source` a run directory of tools/train.py: its `checkpoint` (`best`, `last`, a checkpoint folder or weights
    file), verified, in the model built from the run's `model.json`; the recipe's metrics and the task's
    `eval_metrics`, at the recipe's mixed precision, with the task's and the dataset's baselines and, where the task
    counts classes, the confusion matrix saved as `confusion_<split>.png` beside it. Only the evaluated split is read,
    and the training split where a baseline is fitted on it (a classifier's majority class reads its labels only).

    `source` a model (`nn.Module`): on `recipe`'s split, the recipe's metrics over `num_classes` classes, in full
    precision (as `zoo.convert.run` measures its stages); no baselines, no plot.
    """
    if isinstance(source, nn.Module):
        if recipe is None or num_classes is None:
            raise TypeError("evaluate(model) needs the recipe it was built from and its num_classes")
        return _evaluate_model(source, recipe, split, num_classes)
    return _evaluate_run(Path(source), checkpoint=checkpoint, split=split)


def save_evaluation(
    run_dir: str | Path, *, checkpoint: str = "best", split: str = "test", output: str | Path | None = None
) -> tuple[dict[str, Any], Path]:
    """`evaluate(run_dir, ...)` with `wall_s`, the seconds it took, written to `output` (default
    `<run_dir>/eval.json`): what tools/eval.py and `tools/train.py --test` write. Returns the result and its path."""
    start = time.perf_counter()
    result = evaluate(run_dir, checkpoint=checkpoint, split=split)
    result["wall_s"] = round(time.perf_counter() - start, 3)
    path = Path(output) if output else Path(run_dir) / "eval.json"
    path.write_text(json.dumps(result, indent=2))
    return result, path


def evaluation_lines(result: dict[str, Any], path: Path) -> list[str]:
    """What the command line prints of a result `save_evaluation` wrote to `path`: the split's scores, each
    baseline's, the files written."""
    lines = [f"{result['split']}: {_scores(result['metrics'])}"]
    lines += [f"baseline {name}: {_scores(scores)}" for name, scores in result["baselines"].items()]
    written = [str(path), *(result[key] for key in ("confusion_png", "masks_png") if result.get(key))]
    return [*lines, f"wrote {' and '.join(written)}"]


def _scores(values: dict[str, Any]) -> str:
    return " ".join(f"{key}={value:.4f}" for key, value in values.items() if isinstance(value, float))


def _evaluate_model(model: nn.Module, recipe: Recipe, split: str, num_classes: int) -> dict[str, Any]:
    kind = get_model_kind(recipe.model.kind)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    loader = accelerator.prepare(build_loader(recipe, build_split(recipe, split), train=False))
    model.to(accelerator.device)
    metrics = evaluate_loader(
        model,
        loader,
        accelerator,
        task=kind.task(recipe),
        model_inputs=kind.inputs,
        metric_names=recipe.metrics,
        num_classes=num_classes,
    )
    return _report(None, None, split, recipe, metrics, {}, None)


def _evaluate_run(run_dir: Path, *, checkpoint: str, split: str) -> dict[str, Any]:
    recipe_path = run_dir / RECIPE_FILE
    if not recipe_path.is_file():
        raise FileNotFoundError(f"{recipe_path} does not exist: is {run_dir} a run directory of tools/train.py?")
    # the run's recipe.yaml (which the user may point at other data), checked against the checkpoint
    run = resolve_run(run_dir, checkpoint, files_from="run")
    recipe, weights, sizes = run.recipe, run.weights, run.sizes
    model = run.build_model()
    dataset = build_split(recipe, split)
    kind = get_model_kind(recipe.model.kind)
    task = kind.task(recipe)
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(recipe.train.mixed_precision))
    loader = build_loader(recipe, dataset, train=False)
    model, loader = accelerator.prepare(model, loader)
    num_classes = task.num_outputs(sizes)
    names = list(dict.fromkeys([*recipe.metrics, *_implicit_metrics(task.eval_metrics, num_classes)]))
    metrics = evaluate_loader(
        model,
        loader,
        accelerator,
        task=task,
        model_inputs=kind.inputs,
        metric_names=names,
        num_classes=num_classes,
    )
    png = run_dir / f"confusion_{split}.png" if "confusion" in metrics else None
    if png is not None and accelerator.is_main_process:
        plot_confusion(metrics["confusion"], png, split_attribute(dataset, "classes"))
    rules = _all_baselines(recipe, task, dataset, num_classes)
    report = _report(run_dir, weights, split, recipe, metrics, rules, png)
    if getattr(task, "predicts_masks", False):
        report["masks_png"] = str(run_dir / f"masks_{split}.png")
        if accelerator.is_main_process:
            plot_masks(accelerator.unwrap_model(model), dataset, Path(report["masks_png"]))
    return report


def _all_baselines(recipe: Recipe, task: Task, dataset: Dataset, num_classes: int) -> dict[str, dict[str, float]]:
    """The task's trivial rules (a classifier's majority class and chance, a tagger's majority label) and the
    dataset's own (`baselines`), on `dataset`; the training split is built only where one of them is fitted on it.
    A dataset's rule replaces the task's of the same name."""
    fitted = callable(split_attribute(dataset, "baselines"))
    own = type(task).baselines is not Task.baselines
    train_set = build_split(recipe, "train") if fitted or own else None
    rules = task.baselines(train_set, dataset, num_classes) if own else {}
    return {**rules, **baselines(train_set, dataset)}


def _implicit_metrics(names: Sequence[str], num_classes: int) -> list[str]:
    """The task's evaluation extras at `num_classes`: the confusion matrix only up to `CONFUSION_MAX_CLASSES`.
    Beyond, its k x k counts outgrow the split (a recall probe's 32,768-token vocabulary: a billion int64 counts,
    in memory and in eval.json) and no plot shows them; a recipe that lists `confusion` in `metrics` still gets it."""
    if num_classes <= CONFUSION_MAX_CLASSES or "confusion" not in names:
        return list(names)
    _logger.info("no confusion matrix: %d classes, above the %d it is kept for", num_classes, CONFUSION_MAX_CLASSES)
    return [name for name in names if name != "confusion"]


def plot_masks(model: nn.Module, dataset: Dataset, path: Path, count: int = 4) -> None:
    """The first `count` images of a segmentation split beside their true and predicted masks, one row each, as a
    PNG; each image as it was read (`shown_image`: the split's normalisation undone), the masks in
    `zoo.predict.mask_palette`'s colours (unlabelled pixels white) with the classes named in a legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from .predict import mask_palette

    samples = [dataset[i] for i in range(min(count, len(dataset)))]
    if isinstance(samples[0], dict):  # NaFlex patch sequences: each image at its own size
        from .data.images.native import predict_masks

        *pairs, predicted = zip(*predict_masks(model, samples), strict=True)
        samples = list(zip(*pairs, strict=True))
    else:
        images = torch.stack([image for image, _ in samples])
        device = next(model.parameters()).device
        model.eval()
        with torch.no_grad():
            predicted = model(images.to(device)).argmax(1).cpu()  # [n, H, W]
    names = [str(name) for name in (split_attribute(dataset, "classes") or range(model.num_classes))]
    colors = [tuple(c / 255 for c in rgb) for rgb in mask_palette(len(names))]
    # one colour per class, white for IGNORE_INDEX (shown as class len(names))
    cmap = ListedColormap([*colors, (1.0, 1.0, 1.0)])
    shown = {"cmap": cmap, "vmin": 0, "vmax": len(names), "interpolation": "nearest"}
    fig, axes = plt.subplots(len(samples), 3, figsize=(7.5, 2.5 * len(samples)), squeeze=False)
    for row, ((image, mask), guess) in enumerate(zip(samples, predicted, strict=True)):
        truth = mask.clone()
        truth[(truth < 0) | (truth >= len(names))] = len(names)
        picture = shown_image(image, dataset).permute(1, 2, 0).numpy()  # [H, W, c]
        axes[row][0].imshow(picture[..., 0] if picture.shape[-1] == 1 else picture, cmap="gray", vmin=0, vmax=1)
        axes[row][1].imshow(truth.numpy(), **shown)
        axes[row][2].imshow(guess.numpy(), **shown)
        for ax, title in zip(axes[row], ("image", "true", "predicted"), strict=True):
            ax.set_title(title if row == 0 else "")
            ax.axis("off")
    handles = [Patch(color=color, label=name) for name, color in zip(names, colors, strict=True)]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(names), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def shown_image(image: torch.Tensor, dataset: Dataset) -> torch.Tensor:
    """`image` `[c, H, W]` as the file held it, in [0, 1]: the split's normalisation (its `mean` and `std`, timm's
    preprocessing of the run) undone, where a figure that clipped the normalised tensor showed other colours."""
    mean, std = (split_attribute(dataset, name) for name in ("mean", "std"))
    if mean is None or std is None:
        return image.clamp(0, 1)
    shape = (-1, 1, 1)
    mean, std = (torch.as_tensor(v, dtype=image.dtype).reshape(shape) for v in (mean, std))
    return (image * std + mean).clamp(0, 1)


def _report(
    run_dir: Path | None,
    weights: Path | None,
    split: str,
    recipe: Recipe,
    metrics: dict[str, Any],
    rules: dict[str, Any],
    png: Path | None,
) -> dict[str, Any]:
    return {
        "run_dir": None if run_dir is None else str(run_dir),
        "checkpoint": None if weights is None else str(weights),
        "split": split,
        "task": recipe.task,
        "metrics": metrics,
        "baselines": rules,
        "confusion_png": None if png is None else str(png),
    }
