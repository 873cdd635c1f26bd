"""A recipe's data: the context a dataset builder reads, each split's dataset, and the loader that batches it.

The one place that turns a recipe's `data` section into datasets and loaders: the Trainer (`zoo.train.loop`),
evaluation (`zoo.evaluate`) and conversion (`zoo.convert.run`) all build their splits here. Batches are dicts
(`zoo.data.collate_for`: `{"image", "label"}`, or the 1-D sets' `tokens` or `values`, `mask` and targets, padded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, Dataset

from .data import DataContext, build_dataset, collate_for, get_dataset
from .kinds import get_model_kind

if TYPE_CHECKING:
    from .config import Recipe

__all__ = ["build_loader", "build_split", "data_context"]


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
    padded)."""
    batch_size = recipe.data.batch_size if train else recipe.data.eval_batch_size or recipe.data.batch_size
    workers = recipe.data.num_workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train,
        drop_last=train,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
        collate_fn=collate_for(get_dataset(recipe.data.name).kind),
    )
