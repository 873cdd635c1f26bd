"""Tasks: what a model learns from a batch, one `Task` object per task, registered by name.

A task owns everything that differs between "classify a sequence", "label every position", "forecast a series"
and "predict the next token", for the image ViT and the 1-D `SequenceModel` alike:

- the batch key of its targets (`target_key`) and whether the batch's `mask` masks them (`per_position`);
- its loss (label smoothing where it applies, `IGNORE_INDEX` positions left out) and how many terms the loss
  averages (`loss_units`, so that a whole split's loss is the mean over the same terms);
- its metrics: the allowed names, the defaults, the validation metric that picks the best checkpoint, and the
  `(preds, target)` pair every metric takes (`metric_inputs`);
- what it reads of the run's `ModelSizes` (`model_sizes`: classes, vocabulary, horizon and channels) and
  which head a 1-D model needs (`build_head`);
- the 1-D model inputs it takes, and the `model.sequence` options only it uses;
- what a run records of its training split for prediction (`describe_inputs`: a forecast's columns) and how
  `zoo.predict` turns one input's outputs into rows (`prediction_rows`; a task without them is not predicted).

Batches are dicts (`zoo.data` turns image `(image, label)` pairs into `{"image", "label"}`), so one `Task` serves
every model. A new task is one file: a `Task` subclass (`zoo.tasks._base`) registered with
`register_task(MyTask())`, plus its import line below (tests/test_extension.py registers a multi-label task at
run time, with no other edit).

Letter legend: b - batch, k - classes, l - positions, n - tokens, t - horizon, c - channels, v - vocabulary.
"""

# One line per task module, in the order of list_tasks().
# isort: off
from .classification import Classification
from .forecast import Forecast
from .token_classification import TokenClassification
from .causal_lm import CausalLanguageModelling
from .causal_token_classification import CausalTokenClassification
from .segmentation import Segmentation

# isort: on
from ..data._interface import IGNORE_INDEX
from ._base import HeadSpec, Task, get_task, list_tasks, register_task

__all__ = [
    "IGNORE_INDEX",
    "CausalLanguageModelling",
    "CausalTokenClassification",
    "Classification",
    "Forecast",
    "HeadSpec",
    "Segmentation",
    "Task",
    "TokenClassification",
    "get_task",
    "list_tasks",
    "register_task",
]
