"""Model kinds: how a recipe's `model.kind` becomes a model built from the run's `ModelSizes`, and what of a batch
it reads. Each kind is a `ModelKind` registered by name, with its own options dataclass (`KindOptions`: the keys of
the recipe's `model` section only it takes, checked like `data.options`):

- `vit` (`vit.py`): timm's VisionTransformer with any zoo attention (`zoo.models.create_model`), for image data
  (`ViTOptions`);
- `sequence` (`sequence.py`): zoo's 1-D `SequenceModel` (`zoo.models.create_sequence_model`), for dna, series and
  tokens data (`SequenceOptions`: the `model.sequence` section).

The task (`zoo.tasks`) reads the sizes it needs (classes, vocabulary, horizon); the kind reads its own (input length,
channels) and its options. A kind also says what model.json records of how its inputs are read (`describe`), its
checks against the data and task (`recipe_problems`) and what the dataset builders read of its options
(`data_context`). The machinery and the registry are in `_base.py`; the engine builds every model through
`build_model(recipe, sizes)`. A new kind is one file that calls `register_model_kind(ModelKind(...))` plus one
import line below (or, outside zoo, the call alone: see tests/test_extension.py).
"""

# One line per kind module, in the order of list_model_kinds().
# isort: off
from . import vit  # noqa: F401
from . import sequence  # noqa: F401
from . import naflex  # noqa: F401

# isort: on
from ._base import (
    KindOptions,
    ModelKind,
    build_model,
    get_model_kind,
    kinds_reading,
    list_model_kinds,
    register_model_kind,
    sizes_of,
)
from .sequence import SequenceConfig, SequenceOptions
from .vit import ViTOptions

__all__ = [
    "KindOptions",
    "ModelKind",
    "SequenceConfig",
    "SequenceOptions",
    "ViTOptions",
    "build_model",
    "get_model_kind",
    "list_model_kinds",
    "kinds_reading",
    "register_model_kind",
    "sizes_of",
]
