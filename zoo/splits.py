"""A recipe's data: the context a dataset builder reads, each split's dataset, and the loader that batches it.

The one place that turns a recipe's `data` section into datasets and loaders: the Trainer (`zoo.train.loop`),
evaluation (`zoo.evaluate`) and conversion (`zoo.convert.run`) all build their splits here. Batches are dicts
(`zoo.data.collate_for`: `{"image", "label"}`, or the 1-D sets' `tokens` or `values`, `mask` and targets, padded).
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, Dataset

from .data import DataContext, build_dataset, collate_for, get_dataset
from .kinds import get_model_kind

if TYPE_CHECKING:
    from .config import Recipe

__all__ = ["build_loader", "build_split", "data_context", "seed_loader"]


def data_context(recipe: Recipe, split: str) -> DataContext:
    """What a dataset builder reads of the recipe besides data.options: the split, seed, sample count, root and
    the model's image size."""
    data, model = recipe.data, recipe.model
    samples = {"train": data.train_samples, "val": data.val_samples, "test": data.test_samples}
    return DataContext(
        split=split,
        is_training=split == "train",
        seed=data.seed,
        num_samples=samples.get(split),
        root=data.root,
        # what the model kind tells the builders (a ViT's image size and channels)
        **get_model_kind(model.kind).data_context(model.options),
    )


def build_split(recipe: Recipe, split: str) -> Dataset:
    """The recipe's dataset for `split` (`train`, `val` or `test`)."""
    return build_dataset(recipe.data.name, data_context(recipe, split), **recipe.data.options)


def build_loader(recipe: Recipe, dataset: Dataset, train: bool) -> DataLoader:
    """Shuffled, whole batches for training; every item, in order, for evaluation. Batches are dicts (1-D items
    padded).

    Each loader draws its workers' base seed from a generator of its own (`seed_loader` reseeds it every epoch), never
    from torch's global one: a loader's iterator draws once from the global generator otherwise, so that evaluating,
    or a resumed run's first iterator made mid-epoch, shifted every later random draw of the model (drop path) and a
    resumed run parted from one trained straight through. Workers ignore Ctrl-C: the training process finishes its
    step and saves (`zoo.train.loop`), and ends them."""
    batch_size = recipe.data.batch_size if train else recipe.data.eval_batch_size or recipe.data.batch_size
    workers = recipe.data.num_workers
    # a set may batch itself: by token budget (NaFlex patch sequences, zoo.data.images.native)
    sampler = getattr(dataset, "batch_sampler", lambda *args: None)(
        getattr(dataset, "batch_tokens", None), batch_size, train, recipe.seed
    )
    plain = {"batch_size": batch_size, "shuffle": train, "drop_last": train}
    batching = {"batch_sampler": sampler} if sampler else plain
    return DataLoader(
        dataset,
        **batching,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
        collate_fn=getattr(dataset, "collate", None) or collate_for(get_dataset(recipe.data.name).kind),
        generator=torch.Generator().manual_seed(recipe.seed),
        worker_init_fn=_ignore_interrupts if workers else None,
    )


def seed_loader(loader: DataLoader, seed: int, epoch: int) -> None:
    """Reseed `loader`'s own generator for `epoch`: the base seed of the workers it starts then depends on the seed and
    the epoch only, as in a run that resumed in that epoch."""
    generator = getattr(loader, "generator", None)
    if generator is not None:
        generator.manual_seed(seed * 100_003 + epoch)


def _ignore_interrupts(worker_id: int) -> None:
    """A loader worker's start: Ctrl-C (which a terminal sends to every process of the run) is the training process's
    to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
