"""`train.compile`: torch.compile of the model through accelerate's dynamo plugin, and the step timing that shows
what compiling cost.

`Accelerator.prepare` compiles the model last (after DDP wraps it; under FSDP2 after `fully_shard`), so the model
the engine holds is torch's `OptimizedModule`, whose own `state_dict` prefixes every key with `_orig_mod.`.
`plain_state_dict_keys` gives that wrapper the keys of the model it wraps, both ways (saving, loading and the
names a load reports as missing or unexpected): a compiled run's checkpoints hold the keys an eager run's do,
resume into either, and load into an eager model (`zoo.load_model`, `tools/eval.py`). Under FSDP2 the wrapper is
left alone: accelerate saves through `torch.distributed.checkpoint`, which drops the prefix itself and walks the
module names with it.

Everything else reaches the model's modules through the wrapper unchanged: `modules()` (the attention's
`on_optimizer_step` hooks, `auxiliary_loss`), `parameters()` (the optimizer, gradient clipping), buffers (a
Performer redraw copies into the buffer the compiled graph reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from accelerate.utils import TorchDynamoPlugin, is_compiled_module
from torch import nn

__all__ = ["StepTimes", "dynamo_plugin", "plain_state_dict_keys"]

_PREFIX = "_orig_mod."


def dynamo_plugin(mode: str | None) -> TorchDynamoPlugin:
    """accelerate's dynamo plugin for torch.compile `mode` with inductor, or none (`mode` None: eager). Every field
    is set, so that the recipe decides and not the `ACCELERATE_DYNAMO_*` variables an `accelerate launch` sets."""
    if mode is None:
        return TorchDynamoPlugin(backend="no", mode="default", fullgraph=False, use_regional_compilation=False)
    # a graph break costs speed, not correctness: fullgraph stays off; dynamic None is torch's default (static
    # shapes first, dynamic after a shape changes, as the 1-D sets' padded lengths do)
    return TorchDynamoPlugin(backend="inductor", mode=mode, fullgraph=False, use_regional_compilation=False)


def plain_state_dict_keys(model: nn.Module) -> None:
    """Make a compiled `model` (`OptimizedModule`) save, load and report its state under the keys of the module it
    wraps; anything else is left as it is."""
    if not is_compiled_module(model):
        return
    model.register_state_dict_post_hook(_strip_saved)
    model.register_load_state_dict_pre_hook(_prefix_loaded)
    model.register_load_state_dict_post_hook(_strip_reported)


def _strip_saved(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    # a state_dict post-hook: `state` holds every key of the whole model (prefix "" at the wrapper, the root)
    inner = prefix + _PREFIX
    renamed = [(prefix + key[len(inner) :] if key.startswith(inner) else key, value) for key, value in state.items()]
    state.clear()
    state.update(renamed)


def _prefix_loaded(module: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
    # a load_state_dict pre-hook: `state` is load_state_dict's own copy, which the wrapped modules read next
    inner = prefix + _PREFIX
    renamed = [
        (inner + key[len(prefix) :] if key.startswith(prefix) and not key.startswith(inner) else key, value)
        for key, value in state.items()
    ]
    state.clear()
    state.update(renamed)


def _strip_reported(module: nn.Module, incompatible: Any) -> None:
    # a load_state_dict post-hook: the names reported missing or unexpected, as the caller passed them
    for names in (incompatible.missing_keys, incompatible.unexpected_keys):
        names[:] = [name.replace(_PREFIX, "", 1) for name in names]


@dataclass
class StepTimes:
    """Wall times of this process's optimizer steps: the first (under `train.compile`, the one that compiles), then
    the steady ones. A step is timed from the end of the previous one to the end of its optimizer step (loading its
    batches, forward, backward, the host sync that reads its loss flag, the optimizer step, the attention's
    `on_optimizer_step`); evaluations, checkpoints and logging between steps are not counted."""

    first_s: float | None = None
    first_samples: int = 0
    steady_s: float = 0.0
    steady_steps: int = 0
    # the current epoch's steady steps: samples and seconds, for its samples/s
    epoch_samples: int = 0
    epoch_s: float = 0.0

    def add(self, seconds: float, samples: int) -> bool:
        """Count one step of `samples` (over every process) that took `seconds`; True for the first."""
        if self.first_s is None:
            self.first_s, self.first_samples = seconds, samples
            return True
        self.steady_s += seconds
        self.steady_steps += 1
        self.epoch_samples += samples
        self.epoch_s += seconds
        return False

    def samples_per_s(self) -> float:
        """The current epoch's samples/s over its steady steps; the first step's rate while there is no other (an
        epoch, or a run, of one step)."""
        if self.epoch_s > 0:
            return self.epoch_samples / self.epoch_s
        return self.first_samples / max(self.first_s or 0.0, 1e-9)

    def new_epoch(self) -> None:
        self.epoch_samples, self.epoch_s = 0, 0.0

    @property
    def step_s(self) -> float | None:
        """The mean steady step time; None before the second step."""
        return self.steady_s / self.steady_steps if self.steady_steps else None

    def summary(self, compiled: bool) -> dict[str, float | None]:
        """`first_step_s`, `step_s` (the steady mean) and `compile_s`: the first step's time beyond a steady one's,
        which is compiling plus the warm-up an eager first step has too (data workers starting, CUDA's libraries
        loading: an eager run's `first_step_s` shows how much); None under eager, and before a second step."""
        first, steady = self.first_s, self.step_s
        compile_s = None
        if compiled and first is not None and steady is not None:
            compile_s = max(first - steady, 0.0)
        return {"first_step_s": _rounded(first), "step_s": _rounded(steady), "compile_s": _rounded(compile_s)}


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None or not math.isfinite(seconds) else round(seconds, 4)
