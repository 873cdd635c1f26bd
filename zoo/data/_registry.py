"""Dataset registry: each dataset file registers its builder, its typed options and what it serves.

A dataset is one file that calls ``register_dataset`` plus one import line in ``zoo/data/__init__.py``::

    @dataclass(kw_only=True)
    class ListOpsOptions:
        min_length: int = field(default=500, metadata={"min": 1})

    @register_dataset("listops", options=ListOpsOptions, kind="tokens", tasks=("classification",))
    def build_listops(options: ListOpsOptions, context: DataContext) -> Dataset:
        return ListOps(context.split, num_samples=context.num_samples, seed=context.seed, **asdict(options))

The recipe validates ``data.options`` against the options dataclass (field types, and ``min`` / ``max`` /
``min_exclusive`` / ``max_exclusive`` / ``choices`` metadata), so a builder receives checked, typed options;
everything else a builder needs (split, seed, sample count, ``data.root``, the model's image size) comes in the
``DataContext``. Neither the recipe nor the engine names a dataset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Optional

from torch.utils.data import Dataset

from .._validate import did_you_mean, unknown_name

__all__ = [
    "INPUT_KINDS",
    "DataContext",
    "DatasetSpec",
    "build_dataset",
    "get_dataset",
    "list_datasets",
    "register_dataset",
]

# what a sample holds: image (`(image [c, h, w], label)` pairs), dna (nucleotide `tokens`), series (`values`),
# tokens (integer `tokens` from a dataset's own vocabulary, e.g. ListOps, Pathfinder pixels)
INPUT_KINDS = ("image", "dna", "series", "tokens")
RootUse = Literal["required", "optional", "none"]


@dataclass(frozen=True)
class DataContext:
    """What a builder gets besides its options: the split and the recipe's shared data keys."""

    split: str
    is_training: bool
    seed: int = 0
    # items of this split for generated sets (data.train_samples / val_samples / test_samples)
    num_samples: Optional[int] = None
    # data.root: the user's files (or, for sets read from installed packages, where to find them)
    root: Optional[str] = None
    # the model's input size and channels, for image sets that resize (None: the set's own)
    img_size: Optional[int] = None
    in_chans: Optional[int] = None


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
        fields = {f.name for f in dataclasses.fields(self.options)}
        for key in values:
            if key not in fields:
                raise ValueError(
                    f"dataset {self.name!r} has no option {key!r}{did_you_mean(key, fields)}; "
                    f"its options: {', '.join(sorted(fields)) or 'none'}"
                )
        return self.options(**values)


_DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(
    name: str, *, options: type, kind: str, tasks: tuple[str, ...], root: RootUse = "none"
) -> Callable[[Callable], Callable]:
    """Decorator for a builder ``(options, context) -> Dataset``; a duplicate name raises."""
    if kind not in INPUT_KINDS:
        raise ValueError(f"dataset {name!r}: kind {kind!r} is not one of {', '.join(INPUT_KINDS)}")
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"dataset {name!r}: options must be a dataclass, got {options!r}")

    def decorator(build: Callable) -> Callable:
        if name in _DATASETS:
            raise ValueError(f"dataset {name!r} is already registered by {_DATASETS[name].build.__qualname__}")
        doc = (build.__doc__ or "").strip().splitlines()
        _DATASETS[name] = DatasetSpec(name, build, options, kind, tuple(tasks), root, doc[0] if doc else "")
        return build

    return decorator


def list_datasets() -> list[str]:
    return sorted(_DATASETS)


def get_dataset(name: str) -> DatasetSpec:
    if name not in _DATASETS:
        raise unknown_name("dataset", name, _DATASETS)
    return _DATASETS[name]


def build_dataset(name: str, context: DataContext, **options: Any) -> Dataset:
    """Dataset ``name`` for ``context.split`` with ``options`` (checked against its options dataclass)."""
    spec = get_dataset(name)
    if spec.root == "required" and context.root is None:
        raise ValueError(f"dataset {name!r} reads your files: it needs data.root")
    if spec.root == "none" and context.root is not None:
        raise ValueError(f"dataset {name!r} reads no files of yours; leave data.root out, got {context.root!r}")
    return spec.build(spec.make_options(options), context)
