"""Dataset registry: each dataset file registers its builder, its typed options and what it serves.

A dataset is one file that calls ``register_dataset`` plus one import line in ``zoo/data/__init__.py``::

    @dataclass(kw_only=True)
    class ListOpsOptions:
        min_length: int = field(default=500, metadata={"min": 1})

    @register_dataset("listops", options=ListOpsOptions, kind="tokens", tasks=("classification",))
    def build_listops(options: ListOpsOptions, context: DataContext) -> Dataset:
        return ListOps(context.split, num_samples=context.num_samples, seed=context.seed, **asdict(options))

The recipe validates ``data.options`` against the options dataclass (field types, and ``min`` / ``max`` /
``min_exclusive`` / ``max_exclusive`` / ``length`` / ``choices`` metadata; a field without a default is required),
so a builder receives checked, typed options. An options class may also define ``problems(self)`` returning
``(field, message)`` pairs for checks across its fields (``digit_size <= canvas_size``); the recipe reports them as
``data.options.<field>: <message>``. Everything else a builder needs (split, seed, sample count, ``data.root``, the
model's image size) comes in the ``DataContext``. Neither the recipe nor the engine names a dataset.

What a sample holds depends on the kind: ``image`` sets give ``(image [c, h, w] float32, label int)`` pairs
(batched as ``{"image", "label"}``); ``dna``, ``series`` and ``tokens`` sets give dicts (``tokens`` or ``values``,
``mask``, and ``label`` / ``labels`` / ``target``, see ``zoo.data.collate``) that ``PadCollate`` pads; a
``tokens`` set has a ``vocab_size`` attribute. A dataset object may define ``baselines(train_set)`` returning
``{name: {metric: value}}``, the scores of simple rules that ``tools/eval.py`` reports beside the model's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from torch.utils.data import Dataset, default_collate

from .._registry import Registry
from .._validate import did_you_mean
from .collate import PadCollate

__all__ = [
    "DEFAULT_NUM_SAMPLES",
    "INPUT_KINDS",
    "DataContext",
    "DatasetSpec",
    "build_dataset",
    "collate_for",
    "get_dataset",
    "list_datasets",
    "register_dataset",
]

# what a sample holds: image (`(image [c, h, w], label)` pairs), dna (nucleotide `tokens`), series (`values`),
# tokens (integer `tokens` from a dataset's own vocabulary, e.g. ListOps, Pathfinder pixels)
INPUT_KINDS = ("image", "dna", "series", "tokens")
RootUse = Literal["required", "optional", "none"]
# data.train_samples / val_samples / test_samples when a recipe leaves them out (zoo.config's DataConfig defaults):
# a generated set makes that many items, a set of your files keeps every item unless a recipe asks for another count
DEFAULT_NUM_SAMPLES = {"train": 10000, "val": 1000, "test": 1000}
_SPLITS = ("train", "val", "test")

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataContext:
    """What a builder gets besides its options: the split and the recipe's shared data keys."""

    split: str
    is_training: bool
    seed: int = 0
    # items of this split for generated sets (data.train_samples / val_samples / test_samples)
    num_samples: int | None = None
    # data.root: the user's files (or, for sets read from installed packages, where to find them)
    root: str | None = None
    # the model's input size and channels, for image sets that resize (None: the set's own)
    img_size: int | None = None
    in_chans: int | None = None
    # the model takes images of any size (model.dynamic_img_size): a set need not match img_size
    dynamic_img_size: bool = False

    def requested_samples(self) -> int | None:
        """`num_samples` where a recipe asks for a count other than its default for this split, else None."""
        if self.num_samples is None or self.num_samples == DEFAULT_NUM_SAMPLES.get(self.split):
            return None
        return self.num_samples

    def subset(self, total: int, what: str) -> np.ndarray | None:
        """For a set of your files: the sorted indices of `data.<split>_samples` of its `total` items, drawn from the
        seed (the same items every run), with a warning that counts them; None when every item is kept (the
        recipe's default count, or one at least `total`, which is warned about). `what` names the items (`images of
        'root/train'`)."""
        wanted = self.requested_samples()
        if wanted is None:
            return None
        key = f"data.{self.split}_samples"
        if wanted >= total:
            if wanted > total:
                _logger.warning("%s=%d asks for more than the %d %s: all %d kept", key, wanted, total, what, total)
            return None
        _logger.warning("%s=%d: %d of the %d %s kept (drawn with data.seed)", key, wanted, wanted, total, what)
        generator = np.random.default_rng([self.seed, _SPLITS.index(self.split) if self.split in _SPLITS else 3])
        return np.sort(generator.permutation(total)[:wanted])

    def refuse_samples(self, name: str, why: str) -> None:
        """A ValueError naming `data.<split>_samples` when a recipe sets it for dataset `name`, which cannot
        honour it (`why`)."""
        wanted = self.requested_samples()
        if wanted is not None:
            raise ValueError(
                f"data.{self.split}_samples={wanted}: dataset {name!r} {why}; leave data.{self.split}_samples out"
            )


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    build: Callable[[Any, DataContext], Dataset]
    options: type
    kind: str
    tasks: tuple[str, ...]
    root: RootUse
    doc: str = ""

    def make_options(self, values: Mapping[str, Any]) -> Any:
        """The options dataclass from already validated values (the recipe checks them)."""
        fields = [f.name for f in dataclasses.fields(self.options)]
        for key in values:
            if key not in fields:
                raise ValueError(
                    f"unknown option {key!r} for dataset {self.name!r}{did_you_mean(key, fields, n=1)}; "
                    f"allowed: {', '.join(fields) or 'none'}"
                )
        missing = [f.name for f in dataclasses.fields(self.options) if f.name not in values and _required(f)]
        if missing:
            raise ValueError(f"dataset {self.name!r} needs the option(s) {', '.join(missing)}")
        return self.options(**values)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


# listed in registration order: the import order of zoo/data/__init__.py
_DATASETS: Registry[DatasetSpec] = Registry("dataset", owner=lambda spec: spec.build.__qualname__)


def register_dataset(
    name: str, *, options: type, kind: str, tasks: Sequence[str], root: RootUse = "none"
) -> Callable[[Callable], Callable]:
    """Decorator for a builder ``(options, context) -> Dataset``; a duplicate name raises.

    Args:
        options: the dataclass of its ``data.options``, with the dataset's own defaults.
        kind: what a sample holds, one of ``INPUT_KINDS``.
        tasks: the tasks it serves (names of ``zoo.tasks``).
        root: whether it reads ``data.root``: ``required`` (the user's files), ``optional`` or ``none``.
    """
    if kind not in INPUT_KINDS:
        raise ValueError(f"dataset {name!r}: kind {kind!r} is not one of {', '.join(INPUT_KINDS)}")
    if root not in ("required", "optional", "none"):
        raise ValueError(f"dataset {name!r}: root {root!r} is not one of 'required', 'optional', 'none'")
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"dataset {name!r}: options must be a dataclass, got {options!r}")

    def decorator(build: Callable) -> Callable:
        doc = (build.__doc__ or "").strip().splitlines()
        _DATASETS.register(name, DatasetSpec(name, build, options, kind, tuple(tasks), root, doc[0] if doc else ""))
        return build

    return decorator


def list_datasets() -> list[str]:
    """Registered dataset names, in registration order (the import order of ``zoo/data/__init__.py``)."""
    return _DATASETS.names()


def get_dataset(name: str) -> DatasetSpec:
    return _DATASETS.get(name)


def build_dataset(name: str, context: DataContext, **options: Any) -> Dataset:
    """Dataset ``name`` for ``context.split`` with ``options`` (checked against its options dataclass); a split
    without samples is a ValueError."""
    spec = get_dataset(name)
    if spec.root == "required" and context.root is None:
        raise ValueError(f"dataset {name!r} needs the option data.root: it reads your files")
    if spec.root == "none" and context.root is not None:
        raise ValueError(f"dataset {name!r} reads no files of yours; leave data.root out, got {context.root!r}")
    dataset = spec.build(spec.make_options(options), context)
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        where = f" at {context.root!r}" if context.root is not None else ""
        hint = " (train.validate: false trains without a validation split)" if context.split == "val" else ""
        raise ValueError(
            f"dataset {name!r}{where} has no samples in its {context.split!r} split: nothing to train or evaluate "
            f"on{hint}"
        )
    return dataset


def _collate_images(samples: Sequence[tuple[Any, int]]) -> dict[str, Any]:
    """`(image [c, h, w], label)` pairs -> `{"image": [b, c, h, w], "label": [b]}`."""
    images, labels = default_collate(samples)
    return {"image": images, "label": labels}


def collate_for(kind: str) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """The DataLoader collate function of a dataset kind: every kind is batched as a dict."""
    return _collate_images if kind == "image" else PadCollate()
