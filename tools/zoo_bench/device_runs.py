"""The device check's training parts: what users run, timed on the device (`zoo_bench.device_check` runs them).

- `train`: every shipped `recipes/vit_*_1024.yaml` and `recipes/seg_*_1024.yaml` (globbed, so a new recipe is
  covered with no edit): softmax and the families the GPU work touches first (`FIRST`), then the rest by name, then
  the NaFlex recipes (`recipes/naflex_*_1024.yaml`: mixed-size images at native resolution, batches packed by a
  token budget), then softmax and window2d + global blocks at 2048 px (`LARGE`): samples/s, tokens/s (a NaFlex
  batch's valid tokens, padding not counted), peak memory, and the rate over softmax's at the same size in this
  check; a NaFlex run also gives its tokens/s over the square recipe's of its attention (`vs_square`).
- `compile`: the recipes of `COMPILED` again under `train.compile=true`: the compile time (the first step's time
  past a steady step's) and the rate over the eager run of the `train` part. A torch without the option, or a
  compile that fails, is that item's recorded failure.
- `long`: the long 1-D recipes at their full lengths (`LongRun`): tokens/s and peak memory, each beside the same
  recipe with softmax (with linear, for a recipe that is softmax already).

Each run is a `Trainer` built from the recipe with one batch's samples and no validation split; that batch is
repeated on the device (data loading excluded): `warmup` steps, then `timed` steps. A 1-D set that cannot be built
on this machine (its Python package or Debian data is missing there) is replaced by random samples of its shape and
vocabulary (`StandIn`), and the record says so.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch._dynamo
from torch.utils.data import Dataset

from zoo.attention import list_attentions

from .device_parts import LongRun, Profile, Report, run_items, sync
from .machine import REPO_ROOT
from .measure import failure

__all__ = [
    "COMPILED",
    "FIRST",
    "LARGE",
    "StandIn",
    "VARIANTS",
    "fresh_accelerate",
    "layout_fits",
    "run_compile",
    "run_long",
    "run_train",
    "train_record",
    "vit_runs",
]

# Softmax, the baseline, then the families the GPU work touches (fused kernels, train.compile, tiled neighbourhoods)
FIRST = ("softmax", "performer", "linear", "hedgehog", "window2d_global", "neighborhood")
# the families timed again under train.compile
COMPILED = ("linear", "performer", "hedgehog", "window2d_global", "neighborhood")
# timed at 2048 px too (16,385 tokens), after every 1024-px recipe
LARGE = ("softmax", "window2d_global")
RATIOS = (
    (
        "window2d + global at 1024 px vs softmax at 2048 px (target >= 2)",
        "vit_window2d_global_1024",
        "vit_softmax_2048",
    ),
    ("window2d + global vs softmax, both at 2048 px", "vit_window2d_global_2048", "vit_softmax_2048"),
)
# Layouts timed right after their recipe, to choose between on GPU numbers (run -> recipe stem, overrides):
# window2d + global in ViTDet's 14 x 14 windows (the grid padded to 70 x 70: 155 of FlexAttention's 167 blocks
# partial), and in the recipe's 16 x 16 on the torch path (no padding, no mask: SDPA's flash kernel)
VARIANTS = {
    "vit_window2d_global_w14_1024": ("vit_window2d_global_1024", ("model.attention.options.window=14",)),
    "vit_window2d_global_torch_1024": ("vit_window2d_global_1024", ("model.attention.options.backend=torch",)),
}
# ListOps and Path-X ship with softmax: their partner is linear
PARTNER_OF_SOFTMAX = "linear"
# the species of recipes/genomes.yaml (E. coli, H. pylori, S. aureus, V. cholerae)
_GENOME_SPECIES = 4


def vit_runs() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The `train` part's runs in order -> (recipe, overrides of its own): the stems of recipes/vit_*_1024.yaml,
    `FIRST`'s in its order then the rest by name, each followed by its `VARIANTS`, then recipes/naflex_*_1024.yaml,
    then the `LARGE` ones at 2048 px (`vit_<name>_2048`, the profile's `large_overrides` on top). A family of
    `FIRST` that ships no recipe (hedgehog) runs as `vit_softmax_1024` with its attention swapped, at the variant's
    defaults."""
    recipes = REPO_ROOT / "recipes"
    # the segmentation recipes at 1024 px too (seg_*_1024: ViTDet's layout, Performer), beside softmax's classifier
    stems = sorted(path.stem for pattern in ("vit_*_1024.yaml", "seg_*_1024.yaml") for path in recipes.glob(pattern))
    runs = {stem: (f"recipes/{stem}.yaml", ()) for stem in stems}
    if "vit_softmax_1024" in runs:
        for name in FIRST:
            if f"vit_{name}_1024" not in runs and name in list_attentions():
                swap = (f"model.attention.name={name}", "model.attention.options={}")
                runs[f"vit_{name}_1024"] = ("recipes/vit_softmax_1024.yaml", swap)
    rank = {f"vit_{name}_1024": index for index, name in enumerate(FIRST)}
    ordered = {}
    for run in sorted(runs, key=lambda run: (rank.get(run, len(rank)), run)):
        ordered[run] = runs[run]
        for variant, (stem, overrides) in VARIANTS.items():
            if stem == run:
                ordered[variant] = (runs[run][0], (*runs[run][1], *overrides))
    for path in sorted(recipes.glob("naflex_*_1024.yaml")):
        ordered[path.stem] = (f"recipes/{path.stem}.yaml", ())
    for name in LARGE:
        if f"vit_{name}_1024" in runs:
            ordered[f"vit_{name}_2048"] = runs[f"vit_{name}_1024"]
    return ordered


def _softmax_twin(run: str) -> str:
    """The softmax run a `train` run is compared with: the one at its image size."""
    return "vit_softmax_2048" if run.endswith("_2048") else "vit_softmax_1024"


def is_naflex(run: str) -> bool:
    return run.startswith("naflex_")


def square_twin(run: str) -> str:
    """The square recipe a NaFlex run is compared with: the ViT recipe of its attention at 1024 px."""
    return "vit_" + run.removeprefix("naflex_")


# ----- stand-in data for a 1-D set this machine cannot build


class StandIn(Dataset):
    """Random 1-D samples of a set's shape and vocabulary. Sample i: `tokens` int64 `[length]` uniform over
    `token_ids` (drawn from (seed, i)), `mask` bool `[length]` all True, `label` int64 `i % num_classes`."""

    def __init__(
        self,
        *,
        length: int,
        token_ids: range,
        num_classes: int,
        num_samples: int,
        tokenizer: Any = None,
        seed: int = 0,
    ) -> None:
        self.window, self.token_ids, self.num_classes = length, token_ids, num_classes
        self.vocab_size = token_ids.stop
        self.classes = tuple(f"class {index}" for index in range(num_classes))
        self.num_samples, self.seed = num_samples, seed
        # a DNA set's tokenizer: what the model's description records
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        low, high = self.token_ids.start, self.token_ids.stop
        tokens = torch.randint(low, high, (self.window,), generator=generator)
        return {
            "tokens": tokens,
            "mask": torch.ones(self.window, dtype=torch.bool),
            "label": torch.tensor(index % self.num_classes),
        }


def stand_in(recipe: Any, split: str) -> StandIn | None:
    """The `StandIn` of the recipe's set (genomes, listops, pathfinder), or None for a set it has none for."""
    options = recipe.data.dataset_options()
    samples = {"train": recipe.data.train_samples, "val": recipe.data.val_samples}.get(split) or recipe.data.batch_size
    common = {"num_samples": samples, "seed": recipe.data.seed}
    if recipe.data.name == "genomes":
        from zoo.data.dna.nucleotides import NUM_SPECIAL, DNATokenizer

        tokenizer = DNATokenizer()
        length = tokenizer.num_tokens(options.window)
        ids = range(NUM_SPECIAL, tokenizer.vocab_size)
        return StandIn(length=length, token_ids=ids, num_classes=_GENOME_SPECIES, tokenizer=tokenizer, **common)
    if recipe.data.name == "listops":
        from zoo.data.tokens.listops import VOCAB

        return StandIn(length=options.max_length, token_ids=range(1, len(VOCAB)), num_classes=10, **common)
    if recipe.data.name == "pathfinder":
        return StandIn(length=options.resolution**2, token_ids=range(256), num_classes=2, **common)
    return None


@contextlib.contextmanager
def stand_in_data(notes: list[str]) -> Iterator[None]:
    """While a `Trainer` is built: a split that cannot be built becomes its `StandIn` where the set has one (the
    `build_split` that builds a Trainer's parts, `zoo.train.parts`, is swapped for the while), and `notes` gets why."""
    from zoo.train import parts

    build_split = parts.build_split

    def build(recipe: Any, split: str) -> Dataset:
        try:
            return build_split(recipe, split)
        except Exception as error:  # noqa: BLE001 - any reason the set cannot be built here; re-raised without a stand-in
            fake = stand_in(recipe, split)
            if fake is None:
                raise
            notes.append(f"{split}: random tokens of the set's shape and vocabulary ({failure(error)['message']})")
            return fake

    with mock.patch.object(parts, "build_split", build):
        yield


# ----- one timed run


def fresh_accelerate() -> None:
    """Forget accelerate's process-wide state, so that the next run's `Accelerator` takes its own settings (a
    compiled run's dynamo plugin above all): what accelerate's own tests do between tests."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def layout_fits(recipe: Any) -> list[str]:
    """A per-block layout moved inside a depth the overrides lowered (toy sizes): its global block the last."""
    blocks, depth = getattr(recipe.model, "global_blocks", None), recipe.model.depth
    if blocks and depth and max(blocks) >= depth:
        return [f"model.global_blocks=[{depth - 1}]"]
    return []


def _tokens(trainer: Any, batch: dict[str, torch.Tensor]) -> int:
    """Tokens per sample: a ViT's patches and prefix tokens, a NaFlex batch's valid patches a sample (its padding
    not counted) and prefix tokens, a 1-D batch's (padded) length."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if "patch_valid" in batch:
        valid = batch["patch_valid"]
        return round(int(valid.sum()) / len(valid)) + int(model.num_prefix_tokens)
    embed = getattr(model, "patch_embed", None)
    if embed is not None:
        return int(embed.num_patches) + int(getattr(model, "num_prefix_tokens", 0))
    inputs = batch["tokens"] if "tokens" in batch else batch["values"]
    return int(inputs.shape[1])


# A run whose warm steps are slow times as many steps as fit in this many seconds, at least MIN_TIMED_STEPS: a fixed
# step count lets one slow recipe spend the train part's budget before the recipes after it are reached
TIMED_SECONDS = 2.0
MIN_TIMED_STEPS = 2


def timed_steps(asked: int, warm_steps_s: list[float]) -> int:
    """Steps to time: `asked`, or fewer where the warm steps after the first (which compiles) say that `asked` of
    them would take more than `TIMED_SECONDS` (never under `MIN_TIMED_STEPS`, nor more than asked)."""
    if not warm_steps_s:
        return asked
    fit = math.ceil(TIMED_SECONDS / max(warm_steps_s[-1], 1e-9))
    return min(asked, max(MIN_TIMED_STEPS, fit))


def train_record(
    recipe_path: str, overrides: tuple[str, ...], steps: tuple[int, int], *, compiled: str | None = None
) -> dict[str, Any]:
    """Time `steps` (warm-up, timed) training steps of the recipe: its record. `compiled`: None (eager), or how the
    run compiles ("real": train.compile=true; "off": train.compile=true with Dynamo switched off)."""
    from zoo.config import load_recipe
    from zoo.train.loop import Trainer

    # eager named, not assumed: a recipe may compile on a GPU by itself (`train.compile: cuda`). Kept out of the
    # record's overrides, which docs/choose.md prints as the command of a pick (a compiled run's `compile` key says so)
    how = "train.compile=true" if compiled else "train.compile=false"
    recipe = load_recipe(REPO_ROOT / recipe_path, [*overrides, how])
    overrides = (*overrides, *layout_fits(recipe))
    size = recipe.data.batch_size
    # one batch's samples are all the steps need; no validation split is read
    sized = (f"data.train_samples={size}", f"data.val_samples={size}", "data.num_workers=0", "train.validate=false")
    recipe = load_recipe(REPO_ROOT / recipe_path, [*overrides, how, *sized])
    notes: list[str] = []
    dynamo = torch._dynamo.config.patch(disable=True) if compiled == "off" else contextlib.nullcontext()
    fresh_accelerate()
    with tempfile.TemporaryDirectory() as run_dir, dynamo:
        with stand_in_data(notes):
            trainer = Trainer(recipe, Path(run_dir))
        device = trainer.accelerator.device
        batch = next(iter(trainer.train_loader))
        padded = None
        if "patch_valid" in batch:  # a NaFlex batch packed by tokens: its sample count and its padding
            size = len(batch["patch_valid"])
            padded = round(1 - float(batch["patch_valid"].float().mean()), 4)
        warmup, timed = steps
        first = []
        for _ in range(warmup):
            start = time.perf_counter()
            trainer.train_batch(batch)
            sync(device)
            first.append(time.perf_counter() - start)
        timed = timed_steps(timed, first[1:])
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(timed):
            loss = trainer.train_batch(batch)
        sync(device)
        seconds = time.perf_counter() - start
        tokens = _tokens(trainer, batch)
        record = {
            "recipe": recipe_path,
            "overrides": list(overrides),
            "attention": recipe.model.attention.name,
            # what docs/choose.md compares with the recipe as it is now: a pick measured with other options says so
            "attention_options": dict(recipe.model.attention.options),
            "tokens": tokens,
            "batch_size": size,
            "mixed_precision": trainer.accelerator.mixed_precision,
            "data": "; ".join(notes) if notes else "real",
            "steps": {"warmup": warmup, "timed": timed},
            "first_step_s": round(first[0], 3) if first else None,
            "step_s": round(seconds / timed, 4),
            "samples_per_s": round(size * timed / seconds, 2),
            "tokens_per_s": round(size * tokens * timed / seconds),
            "loss": float(loss.detach()),
            "peak_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None,
        }
        if padded is not None:
            record["padding_share"] = padded
        if compiled:
            record["compile"] = "train.compile=true" if compiled == "real" else "Dynamo off (the CPU's rehearsal)"
            record["compile_s"] = round(max(record["first_step_s"] - record["step_s"], 0.0), 2) if first else None
        del trainer, batch
    if compiled:
        torch._dynamo.reset()
    record["status"] = "ok" if math.isfinite(record["loss"]) else "error"
    record["ok"] = record["status"] == "ok"
    if not record["ok"]:
        record["message"] = f"non-finite loss {record['loss']}"
    return record


def _link_softmax(items: list[dict[str, Any]], record: dict[str, Any]) -> None:
    """`vs_softmax` (samples/s over its softmax twin's, the same batch and size) on `record` and, when `record` is
    that twin, on the records measured before it."""

    def rate(item: dict[str, Any]) -> float | None:
        return item.get("samples_per_s") if item.get("ok") else None

    runs = {item["run"]: item for item in items}
    if record.get("twin") == record["run"] and rate(record):
        record["vs_softmax"] = 1.0
    twin = runs.get(record.get("twin"))
    if twin is not None and rate(twin) and rate(record):
        record["vs_softmax"] = round(rate(record) / rate(twin), 3)
    for item in items:
        if item.get("twin") == record["run"] and item is not record and rate(item) and rate(record):
            item["vs_softmax"] = round(rate(item) / rate(record), 3)


def _link_square(items: list[dict[str, Any]], record: dict[str, Any]) -> None:
    """`square` (the square recipe's run) and `vs_square` (tokens/s over its tokens/s: samples differ in size, so
    tokens are what compares) on a NaFlex run's `record`."""
    record["square"] = square_twin(record["run"])
    square = {item["run"]: item for item in items}.get(record["square"])
    if square is not None and square.get("ok") and record.get("ok") and square.get("tokens_per_s"):
        record["vs_square"] = round(record["tokens_per_s"] / square["tokens_per_s"], 3)


# ----- the parts


def run_train(report: Report, profile: Profile) -> None:
    """The `train` part: `vit_runs()` in order, each with its rate over softmax's."""
    part = report.part("train")
    runs = vit_runs()

    def measure(run: str) -> dict[str, Any]:
        recipe, own = runs[run]
        large = profile.large_overrides if run.endswith("_2048") else ()
        overrides = (*(profile.naflex_overrides if is_naflex(run) else profile.train_overrides), *own, *large)
        # a NaFlex run's samples differ in size from the square ones: compared by tokens/s with its square recipe
        twin = None if is_naflex(run) else _softmax_twin(run)
        record = {"run": run, "twin": twin, **train_record(recipe, overrides, profile.train_steps)}
        _link_softmax(part["items"], record)
        if is_naflex(run):
            _link_square(part["items"], record)
        return record

    part = run_items(report, "train", profile, list(runs), measure, key="run")
    rates = {item["run"]: item.get("samples_per_s") for item in part["items"] if item["ok"]}
    part["ratios"] = {
        title: round(rates[a] / rates[b], 2) if rates.get(a) and rates.get(b) else None for title, a, b in RATIOS
    }
    report.save()


def run_compile(report: Report, profile: Profile) -> None:
    """The `compile` part: `COMPILED`'s recipes under train.compile=true, against their eager runs."""
    eager = {
        item["run"]: item["samples_per_s"]
        for item in report.results["parts"].get("train", {}).get("items", [])
        if item.get("ok")
    }
    runs = vit_runs()
    names = [f"vit_{name}_1024" for name in COMPILED if f"vit_{name}_1024" in runs]
    how = "real" if profile.compile_for_real else "off"

    def measure(run: str) -> dict[str, Any]:
        recipe, own = runs[run]
        overrides = (*profile.train_overrides, *own)
        record = {"run": run, **train_record(recipe, overrides, profile.train_steps, compiled=how)}
        if record["ok"] and eager.get(run):
            record["vs_eager"] = round(record["samples_per_s"] / eager[run], 3)
        if record["ok"] and eager.get("vit_softmax_1024"):
            record["vs_softmax"] = round(record["samples_per_s"] / eager["vit_softmax_1024"], 3)
        return record

    run_items(report, "compile", profile, names, measure, key="run")


def _long_items(profile: Profile) -> dict[str, tuple[LongRun, tuple[str, ...], str]]:
    """The `long` part's runs in order: each recipe as shipped, then beside it the same with softmax (linear for a
    softmax recipe) -> name: (run, overrides, the softmax run it is compared with)."""
    from zoo.config import load_recipe

    items = {}
    for run in profile.long_runs:
        shipped = load_recipe(REPO_ROOT / run.recipe, list(run.overrides)).model.attention.name
        partner = PARTNER_OF_SOFTMAX if shipped == "softmax" else "softmax"
        swapped = (*run.overrides, f"model.attention.name={partner}", "model.attention.options={}")
        twin = run.name if shipped == "softmax" else f"{run.name}_softmax"
        items[run.name] = (run, run.overrides, twin)
        items[f"{run.name}_{partner}"] = (run, swapped, twin)
    return items


def run_long(report: Report, profile: Profile) -> None:
    """The `long` part: the long 1-D recipes at full length, each beside its softmax twin."""
    part = report.part("long")
    try:
        items = _long_items(profile)
    except Exception as error:  # noqa: BLE001 - a recipe that does not load fails this part, not the check
        part.update(status="failed", message=failure(error)["message"], budget_s=profile.budgets["long"])
        report.save()
        return

    def measure(name: str) -> dict[str, Any]:
        run, overrides, twin = items[name]
        record = {"run": name, "twin": twin, **train_record(run.recipe, overrides, profile.train_steps)}
        _link_softmax(part["items"], record)
        return record

    run_items(report, "long", profile, list(items), measure, key="run")
