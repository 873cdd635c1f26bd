"""Predictions of a loaded model (`zoo.load_model`) on new files: images, FASTA, CSV and .ts series, token ids.

`predict(model, inputs)` reads what the model's run was trained on (`model.zoo_run`, see `zoo.hub.runs`; a ViT saved by
`save_pretrained` reads images):

- images: files, or folders searched recursively for image files; read by `image_loader(model)`: decoded by
  `zoo.data.images.decode.open_image` (any bit depth, palette, alpha), then resized, cropped and normalised by timm's
  eval transform of the model's `pretrained_cfg` (`timm.data.resolve_data_config(model=model)`): one row per image;
- FASTA files (a folder: its FASTA files): each record cut as the run's data was (`window`, `stride`; a set without
  windows: the record whole, cut at its `max_length`): one row per window, or for a per-position task one row per
  nucleotide with its label;
- series: a CSV file with one series per row (the run's label column, when there, is not a time step) or a `.ts`
  file, one row per series; for forecasting a CSV file with one row per time step: its last `lookback` rows of the
  run's input columns give `horizon` rows of the target columns, in their own units;
- token ids (a run on token sets: MQAR, ListOps, ...): a `.txt`, `.tok`, `.csv` or `.tsv` file with one sequence per
  line, integer ids below the run's vocabulary size separated by spaces, tabs or commas (a first line with no id
  is a header, blank lines are counted and left out): one row per line, or for a per-position task one row per
  token with its label.

Classification rows hold the `top_k` classes and their probabilities. A segmentation row names the image's predicted
mask, a palette PNG written to `mask_dir` (`write_mask`; pixel value = class index, the run's class names and the
palette's colours in `mask_dir/legend.json`), at the model's input size (the image as the eval transform gave it;
a NaFlex model's, from a run, a save_pretrained folder or built in memory, at the file's own size:
`zoo.data.images.native.native_logits`), and the classes it covers with their shares of the image. An input that
cannot be read is named in one warning and skipped whole
(`Predictions.skipped`: a CSV file with one bad row gives no row); the others are predicted. Inside a folder,
files that are not inputs of the run's kind (`notes.txt`, `.DS_Store`) are counted in a warning, and so are the
empty records of a FASTA file. `options` (`tools/predict.py --set data.options.KEY=VALUE`) changes how series files
are read (`READ_OPTIONS`: `nan`, a CSV file's `label_column`) from the run's recipe.
`write_predictions` writes CSV or JSON.

Letter legend: b - batch, n - positions, k - classes, t - horizon, c - channels.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ._validate import check_int, first_line
from .data.collate import PadCollate, window_starts
from .data.dna.fasta import _is_fasta
from .data.dna.nucleotides import DNATokenizer, read_fasta
from .data.images.decode import ImageError, open_image
from .tasks import Task, get_task, list_tasks

__all__ = [
    "READ_OPTIONS",
    "ImageLoader",
    "Predictions",
    "image_loader",
    "mask_palette",
    "predict",
    "write_mask",
    "write_predictions",
]

_logger = logging.getLogger(__name__)

_SERIES_SUFFIXES = (".csv", ".ts")
_TOKEN_SUFFIXES = (".txt", ".tok", ".csv", ".tsv")
FORMATS = ("csv", "json")
# data.options a prediction may read its inputs with, by input kind (the others are tied to the trained model)
READ_OPTIONS = {"image": (), "dna": (), "series": ("nan", "label_column"), "tokens": ()}
# how a user of predict sets the policy for missing values
_NAN_FIX = "rerun with --set data.options.nan=mask (or interpolate; options={'nan': 'mask'} in Python)"


@dataclass
class Predictions:
    """`rows`: one dict per prediction, where it comes from (`input`, then `record`/`start`/`end`, `item`,
    `position` or `step`) and what was predicted (`classes` and `probabilities`, best first; a per-position
    `label` and `probability`; a forecast's value per target column). `skipped`: (input, reason) of every input
    that could not be read."""

    task: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _run_description(model: nn.Module) -> dict[str, Any] | None:
    """The model's run's `model.json` (`model.zoo_run`); for a NaFlex model built in memory the one its run would
    carry (`zoo.hub.load.native_description`: it reads each image at its own size); else None."""
    from .hub.load import native_description

    run = getattr(model, "zoo_run", None)
    return run if run is not None else native_description(model)


def _description(model: nn.Module) -> dict[str, Any]:
    """What the model reads: its run's `model.json`, or for a ViT from `save_pretrained` its `pretrained_cfg`."""
    run = _run_description(model)
    if run is not None:
        return run
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if "input_size" not in cfg:
        raise ValueError(
            f"{type(model).__name__} carries no description of its inputs: predict takes a model from "
            "zoo.load_model (a run directory of tools/train.py or a save_pretrained folder)"
        )
    # a save_pretrained segmentation model records its decoder (zoo.models.segmentation)
    task = "segmentation" if getattr(model, "zoo_args", {}).get("decoder") else "classification"
    return {"task": task, "input": "image", "label_names": cfg.get("label_names")}


def predict(
    model: nn.Module,
    inputs: Sequence[str | Path],
    *,
    top_k: int = 5,
    batch_size: int = 32,
    progress: bool = False,
    options: Mapping[str, Any] | None = None,
    mask_dir: str | Path | None = None,
) -> Predictions:
    """Predict every input (paths of files or folders, see the module docstring) with `model` in eval mode, in
    batches of `batch_size`; classification rows keep the `top_k` best classes (at most the class count). `options`:
    data options that read the inputs otherwise than the run's recipe did (`READ_OPTIONS` of the run's input kind,
    e.g. `{"nan": "mask"}`). `mask_dir`: where a segmentation run's masks go (required for one)."""
    check_int("top_k", top_k, 1)
    check_int("batch_size", batch_size, 1)
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    description = _description(model)
    task, kind = get_task(description["task"]), description["input"]
    if not task.predicts:
        handled = [name for name in list_tasks() if get_task(name).predicts]
        raise ValueError(f"predict does not handle task {task.name!r}; it handles {', '.join(handled)}")
    if kind not in _READERS:
        raise ValueError(f"predict does not read {kind!r} inputs (the run's data); it reads {', '.join(_READERS)}")
    masks_out = None
    if getattr(task, "predicts_masks", False):
        masks_out = _MaskWriter(mask_dir, task.name, description.get("label_names"), model.num_classes)
    if options:
        read = _read_options(options, kind, task)
        description = {**description, "inputs": {**description.get("inputs", {}), **read}}
    result = Predictions(task.name)
    items = _READERS[kind](model, description, [Path(p) for p in inputs], result)
    model.eval()
    bar = tqdm(total=len(items), desc="predict", unit="item", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    # a skipped input's warning goes above the bar, not into it
    with torch.no_grad(), bar, logging_redirect_tqdm():
        for metas, batch in _batches(items, batch_size):
            logits = model(*(_to(t, _device(model)) for t in batch)).float().cpu()
            if masks_out is not None and isinstance(batch[0], dict):  # NaFlex: each mask at its file's size
                from .data.images.native import native_logits

                logits = native_logits(logits, batch[0])
            masks = batch[1] if len(batch) > 1 else [None] * len(metas)
            for meta, out, mask in zip(metas, logits, masks, strict=True):
                rows = task.prediction_rows(meta, out, mask, description, top_k)
                result.rows.extend(rows if masks_out is None else [masks_out(row) for row in rows])
            bar.update(len(metas))
    if not result.rows:
        reasons = "; ".join(f"{name}: {reason}" for name, reason in result.skipped[:3])
        raise ValueError(f"nothing to predict: no input could be read ({reasons or 'no inputs given'})")
    return result


def mask_palette(num_classes: int) -> list[tuple[int, int, int]]:
    """One RGB colour per class: black for class 0 (background), then matplotlib's tab20 colours, repeated."""
    from matplotlib import colormaps

    colors = [tuple(round(255 * c) for c in rgb) for rgb in colormaps["tab20"].colors]
    return [(0, 0, 0), *(colors[i % len(colors)] for i in range(num_classes - 1))][:num_classes]


def write_mask(mask: Tensor, path: str | Path, num_classes: int) -> Path:
    """A mask of class indices `[H, W]` as a PNG: a palette image (`mask_palette`) up to 256 classes, 16-bit grey
    beyond; the pixel values are the class indices either way."""
    from PIL import Image

    values = mask.cpu().numpy()
    if num_classes <= 256:
        image = Image.fromarray(values.astype(np.uint8), mode="P")
        image.putpalette([channel for color in mask_palette(num_classes) for channel in color])
    else:
        image = Image.fromarray(values.astype(np.uint16))
    image.save(path)
    return Path(path)


class _MaskWriter:
    """A segmentation row's `mask` (int64 `[H, W]`) written as `mask_dir/<image stem>.png` (a number added when
    two inputs share a stem), the row then naming the file; `legend.json` (value, class name, colour) written
    first."""

    def __init__(self, mask_dir: str | Path | None, task: str, names: Sequence[str] | None, num_classes: int) -> None:
        if mask_dir is None:
            raise ValueError(f"task {task!r} predicts masks: give the folder to write them to (mask_dir)")
        self.folder = Path(mask_dir)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.names, self.num_classes = names, num_classes
        self.used: set[str] = set()
        self._legend()

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        stem, number = Path(row["input"]).stem, 1
        name = f"{stem}.png"
        while name in self.used:
            number += 1
            name = f"{stem}_{number}.png"
        self.used.add(name)
        return {**row, "mask": str(write_mask(row["mask"], self.folder / name, self.num_classes))}

    def _legend(self) -> None:
        colors = mask_palette(self.num_classes) if self.num_classes <= 256 else [None] * self.num_classes
        entries = [
            {"value": value, "name": self.names[value] if self.names else str(value), "color": color}
            for value, color in enumerate(colors)
        ]
        (self.folder / "legend.json").write_text(json.dumps(entries, indent=1) + "\n")


def _read_options(options: Mapping[str, Any], kind: str, task: Task) -> dict[str, Any]:
    """`options` checked against what reads `kind` inputs for `task`: a ValueError naming a key or value that does
    not apply."""
    from .data._tables import NAN_POLICIES

    # a forecast's CSV file has no label column
    allowed = tuple(
        name for name in READ_OPTIONS.get(kind, ()) if not (task.forecasts_inputs and name == "label_column")
    )
    for key, value in options.items():
        if key not in allowed:
            takes = f"takes only {', '.join(f'data.options.{name}' for name in allowed)}" if allowed else "takes none"
            raise ValueError(f"data.options.{key}: predict reads {kind} inputs as the run was trained; it {takes}")
        if key == "nan" and value not in NAN_POLICIES:
            raise ValueError(f"data.options.nan must be one of {', '.join(NAN_POLICIES)}, got {value!r}")
        if key == "label_column" and (not isinstance(value, str) or not value):
            raise ValueError(f"data.options.label_column must be a column name, got {value!r}")
    return dict(options)


def _to(batch: Tensor | dict[str, Tensor], device: torch.device) -> Tensor | dict[str, Tensor]:
    return {k: v.to(device) for k, v in batch.items()} if isinstance(batch, dict) else batch.to(device)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _skip(result: Predictions, name: str | Path, reason: str) -> None:
    _logger.warning("skipped %s: %s", name, reason)
    result.skipped.append((str(name), reason))


Item = tuple[dict[str, Any], tuple[Tensor, ...]]


class _Lazy:
    """Items made while they are consumed (decoded images), and how many there will be at most."""

    def __init__(self, total: int, items: Iterator[Item]) -> None:
        self.total, self.items = total, items

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[Item]:
        return self.items


def _batches(items: Iterable[Item], batch_size: int) -> Iterator[tuple[list[dict], tuple[Tensor, ...]]]:
    """Items `(meta, model inputs)` grouped into batches; 1-D inputs `(tokens or values, mask)` padded."""
    metas, tensors = [], []
    for meta, inputs in items:
        metas.append(meta)
        tensors.append(inputs)
        if len(metas) == batch_size:
            yield metas, _stack(tensors)
            metas, tensors = [], []
    if metas:
        yield metas, _stack(tensors)


def _stack(tensors: list[tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    if isinstance(tensors[0][0], dict):  # NaFlex patch sequences, padded to the longest
        from .data.images.native import collate_patches

        batch = collate_patches([{**t[0], "label": 0} for t in tensors], labels=False)
        sizes = {k: torch.stack([t[0][k] for t in tensors]) for k in ("image_size", "input_size") if k in tensors[0][0]}
        return ({**batch, **sizes},)
    if len(tensors[0]) == 1:
        return (torch.stack([t[0] for t in tensors]),)
    batch = PadCollate(pad_values={"x": 0, "mask": False})([{"x": x, "mask": mask} for x, mask in tensors])
    return batch["x"], batch["mask"]


def _files(paths: Sequence[Path], wanted: Callable[[Path], bool], what: str, result: Predictions) -> list[Path]:
    """Every path that is a file, and the `wanted` files under every folder (recursively, sorted; hidden files and
    folders and the files that are not `wanted` counted in a warning); a missing path or a folder without such files
    is skipped."""
    found = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            inside, others = _folder_files(path, wanted)
            if others:
                shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
                _logger.warning("%s: left out %d files that are not %s (%s)", path, len(others), what, shown)
            found.extend(inside) if inside else _skip(result, path, f"a folder without {what}")
        else:
            _skip(result, path, "no such file or folder")
    return found


def _folder_files(folder: Path, wanted: Callable[[Path], bool]) -> tuple[list[Path], list[str]]:
    """The `wanted` visible files under `folder` (sorted), and the other files' paths relative to it."""
    inside, others = [], []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        hidden = any(part.startswith(".") for part in relative.parts)
        inside.append(path) if wanted(path) and not hidden else others.append(str(relative))
    return inside, others


def _image_suffixes() -> set[str]:
    from PIL import Image

    Image.init()
    return set(Image.registered_extensions())


class ImageLoader:
    """An image file -> the model's input `[c, h, w]`: `zoo.data.images.decode.open_image` (16-bit values scaled by
    their bit depth, alpha composited on black, palette and CMYK converted, the first frame, the EXIF orientation), then
    timm's eval transform of the model's `pretrained_cfg` (resize, centre crop, normalise). `config`: timm's
    `resolve_data_config(model=model)`; `mode`: `RGB`, or `L` for a one-channel model."""

    def __init__(self, model: nn.Module) -> None:
        from timm.data import create_transform, resolve_data_config

        self.config = resolve_data_config(model=model)
        self.transform = create_transform(**self.config)
        self.mode = "L" if self.config["input_size"][0] == 1 else "RGB"

    def __call__(self, path: str | Path) -> Tensor:
        """float32 `[c, h, w]`; an ImageError naming `path` when it cannot be decoded."""
        return self.transform(open_image(path, self.mode))


def image_loader(model: nn.Module) -> ImageLoader:
    """How `predict` reads an image for `model` (a ViT of `zoo.load_model` or `zoo.create_model`), as one call for
    your own scripts: `image_loader(model)("a.png")[None]` is a batch of one, preprocessed as `predict` and the
    training data preprocess it. timm's route (`create_transform(**resolve_data_config(model=model))` on
    `PIL.Image.open(path).convert("RGB")`) gives the same tensor for 8-bit RGB files but clips 16-bit images and
    drops alpha instead of compositing it on black."""
    run = _run_description(model) or {}
    if run.get("naflex"):  # a NaFlex model reads each image at its own size (zoo.data.images.native)
        from .data.images.native import NativeLoader

        return NativeLoader(run["naflex"], run["sizes"]["in_chans"])
    return ImageLoader(model)


def _read_images(model: nn.Module, description: dict, paths: Sequence[Path], result: Predictions) -> _Lazy:
    """Each image as `[c, h, w]`, read by `image_loader(model)`, decoded when its batch is."""
    load = image_loader(model)
    suffixes = _image_suffixes()
    files = _files(paths, lambda p: p.suffix.lower() in suffixes, "image files", result)

    def decoded() -> Iterator[Item]:
        for path in files:
            try:
                image = load(path)
            except ImageError as error:
                _skip(result, path, error.reason)
                continue
            yield {"input": str(path)}, (image,)

    return _Lazy(len(files), decoded())


def _read_fasta(model: nn.Module, description: dict, paths: Sequence[Path], result: Predictions) -> list[Item]:
    """Each window of each record as `(tokens [n], mask [n])`: the run's windows, or the record whole (cut at the
    run's `max_length`) for a set without windows."""
    inputs = description["inputs"]
    tokenizer = DNATokenizer(**inputs.get("tokenizer", {}))
    window = inputs.get("window")
    cut = window or inputs.get("max_length")
    # a per-position task labels each nucleotide once: windows side by side
    stride = window if get_task(description["task"]).per_position else inputs.get("stride") or window
    items = []
    for path in _files(paths, lambda p: _is_fasta(p.name), "FASTA files", result):
        try:
            records = read_fasta(path)
        except (OSError, ValueError, EOFError) as error:
            _skip(result, path, first_line(error))
            continue
        empty = [name for name, codes in records if not len(codes)]
        if empty:
            _logger.warning("%s: left out %d empty record(s) (no nucleotides): >%s", path, len(empty), empty[0])
        for name, codes in records:
            starts = window_starts(len(codes), window, stride).tolist() if window else [0] * bool(len(codes))
            for start in starts:
                piece = codes[start : start + cut] if cut else codes
                tokens = tokenizer(piece)
                meta = {"input": str(path), "record": name, "start": start + 1, "end": start + len(piece)}
                items.append((meta, (tokens, torch.ones(len(tokens), dtype=torch.bool))))
    return items


def _read_series(model: nn.Module, description: dict, paths: Sequence[Path], result: Predictions) -> list[Item]:
    """Each series as `(values [n, c], mask [n])`: the rows of a CSV file or the cases of a .ts file; for a
    forecast, the last look-back of a CSV file with one row per time step."""
    read = _forecast_window if get_task(description["task"]).forecasts_inputs else _series_of_file
    items = []
    for path in _files(paths, lambda p: p.suffix.lower() in _SERIES_SUFFIXES, "CSV or .ts files", result):
        try:
            # every row read before any is kept: a file is predicted whole or skipped whole
            items.extend(list(read(path, description["inputs"])))
        except (OSError, ValueError) as error:
            _skip(result, path, first_line(error))
    return items


def _as_sample(values: np.ndarray, inputs: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """`[n, c]` float with NaN where missing -> `(values [n, c], mask [n])` as the series sets give them."""
    observed = np.isfinite(values)
    if inputs.get("znorm"):
        mean, std = np.nanmean(values, axis=0), np.nanstd(values, axis=0)
        values = (values - mean) / np.where(std > 0, std, 1.0)
    values = np.where(observed, values, 0.0).astype(np.float32)
    return torch.from_numpy(values), torch.from_numpy(observed.any(axis=1))


def _series_of_file(path: Path, inputs: Mapping[str, Any]) -> Iterator[Item]:
    """One item per series: a .ts case `[c, n]`, or a CSV row (the label column left out) `[1, n]`."""
    from .data._tables import apply_nan_policy, parse_cells, read_table
    from .data.series.classification import read_ts

    if path.suffix.lower() == ".ts":
        for number, series in enumerate(read_ts(path, nan=inputs.get("nan", "error"), fix=_NAN_FIX).series, start=1):
            yield {"input": str(path), "item": number}, _as_sample(series.T, inputs)
        return
    table = read_table(path, ragged=True)
    label = inputs.get("label_column", "label")
    skip = table.header.index(label) if label in table.header else None
    for row, cells in enumerate(table.rows):
        steps = [i for i in range(len(cells)) if i != skip]
        while steps and not cells[steps[-1]].strip():
            steps.pop()

        def where(i: int, row: int = row, steps: list[int] = steps) -> str:
            return table.where(row, steps[i])

        values = parse_cells([cells[i] for i in steps], where)
        values = apply_nan_policy(values, inputs.get("nan", "error"), where, fix=_NAN_FIX)
        yield {"input": str(path), "item": row + 1}, _as_sample(values[:, None], inputs)


def _forecast_window(path: Path, inputs: Mapping[str, Any]) -> Iterator[Item]:
    """The last `lookback` steps of the run's input columns, standardised with the training mean and std."""
    from .data._tables import apply_nan_policy, parse_cells, read_table

    table = read_table(path)
    lookback, columns = inputs["lookback"], inputs["columns"]
    if len(table.rows) < lookback:
        raise ValueError(
            f"{len(table.rows)} time steps, the model looks back {lookback}: give at least {lookback} rows"
        )
    rows = range(len(table.rows) - lookback, len(table.rows))
    values = []
    for name in inputs["inputs"]:
        at = table.column(name, "input column")

        def where(i: int, at: int = at) -> str:
            return table.where(rows[i], at)

        column = parse_cells([table.rows[r][at] for r in rows], where)
        values.append(apply_nan_policy(column, inputs.get("nan", "error"), where, fix=_NAN_FIX))
    index = [columns.index(name) for name in inputs["inputs"]]
    mean, std = np.asarray(inputs["mean"])[index], np.asarray(inputs["std"])[index]
    yield {"input": str(path)}, _as_sample((np.stack(values, axis=1) - mean) / std, {})


def _read_tokens(model: nn.Module, description: dict, paths: Sequence[Path], result: Predictions) -> list[Item]:
    """Each sequence of token ids as `(tokens [n], mask [n])`, one per non-blank line; a file with a bad line is
    skipped whole."""
    vocab_size = description["sizes"]["vocab_size"]
    items = []
    for path in _files(paths, lambda p: p.suffix.lower() in _TOKEN_SUFFIXES, "token files", result):
        try:
            items.extend(_token_lines(path, vocab_size))
        except (OSError, ValueError) as error:  # a file that is not UTF-8 text is a ValueError too
            _skip(result, path, first_line(error))
    return items


def _token_lines(path: Path, vocab_size: int) -> list[Item]:
    items, blank = [], 0
    with path.open(encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.replace(",", " ").split()
            if not fields:
                blank += 1
            elif not items and not any(_is_int(f) for f in fields):
                _logger.warning("%s: read line %d as a header (no token id in it): %s", path, number, line.strip())
            else:
                ids = torch.tensor([_token_id(f, vocab_size, f"line {number}") for f in fields])
                items.append(({"input": str(path), "item": number}, (ids, torch.ones(len(ids), dtype=torch.bool))))
    if blank:
        _logger.warning("%s: left out %d blank line(s)", path, blank)
    if not items:
        raise ValueError("no sequence of token ids in it")
    return items


def _is_int(text: str) -> bool:
    return re.fullmatch(r"[+-]?[0-9]+", text) is not None


def _token_id(text: str, vocab_size: int, where: str) -> int:
    if not _is_int(text):
        raise ValueError(f"{where}: {text!r} is not a token id (an integer from 0 to {vocab_size - 1})")
    if not 0 <= int(text) < vocab_size:
        raise ValueError(f"{where}: token id {text} is outside the run's vocabulary (0 to {vocab_size - 1})")
    return int(text)


_READERS = {"image": _read_images, "dna": _read_fasta, "series": _read_series, "tokens": _read_tokens}


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row for CSV: the top-k lists as `class_1, probability_1, class_2, ...`."""
    if "probabilities" not in row:
        # other lists (a mask's classes and their shares) as one space-separated cell each
        return {k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in row.items()}
    flat = {k: v for k, v in row.items() if k not in ("classes", "probabilities")}
    pairs = zip(row.get("classes", []), row.get("probabilities", []), strict=True)
    for rank, (name, probability) in enumerate(pairs, start=1):
        flat[f"class_{rank}"], flat[f"probability_{rank}"] = name, probability
    return flat


def format_of(path: str | Path) -> str:
    """`csv` or `json` from a file name's suffix; a ValueError naming the allowed suffixes otherwise."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"output {str(path)!r}: write predictions to a .csv or .json file, not .{suffix or '?'}")
    return suffix


def write_predictions(predictions: Predictions, output: str | Path | io.TextIOBase, fmt: str | None = None) -> None:
    """Write the rows to `output` (a path, or an open text stream such as sys.stdout) as CSV (one column per key;
    top-k classes as `class_1, probability_1, ...`) or JSON (a list of the rows, with `skipped` beside them);
    the format is `fmt`, else the path's suffix."""
    fmt = fmt or format_of(output)
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    if isinstance(output, (str, Path)):
        with open(output, "w", newline="") as handle:
            _write(predictions, handle, fmt)
    else:
        _write(predictions, output, fmt)


def _write(predictions: Predictions, handle: io.TextIOBase, fmt: str) -> None:
    if fmt == "json":
        skipped = [{"input": name, "reason": reason} for name, reason in predictions.skipped]
        json.dump({"task": predictions.task, "predictions": predictions.rows, "skipped": skipped}, handle, indent=1)
        handle.write("\n")
        return
    rows = [_flat(row) for row in predictions.rows]
    writer = csv.DictWriter(handle, fieldnames=list(dict.fromkeys(k for row in rows for k in row)), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
