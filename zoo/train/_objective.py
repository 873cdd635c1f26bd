"""What a run of `zoo.train.loop.Trainer` optimises: the one thing its routes do differently.

The Trainer brings everything else (accelerate's `prepare`, the recipe's optimizer and schedule, mixed precision,
ddp / fsdp, gradient accumulation and clipping, non-finite handling, checkpoints, trackers); an `Objective` says what
module trains and what its loss on a batch is. Training on labels uses `TaskObjective`; self-pretraining
(`zoo.train.self_pretrain`) and the two stages of conversion (`zoo.convert.model`) bring their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from accelerate import Accelerator
from torch import Tensor, nn

from ..attention._registry import auxiliary_loss

if TYPE_CHECKING:
    from ..config import Recipe

__all__ = ["Objective", "TaskObjective", "objective_recipe"]


class Objective:
    """The loss of a run and the module it trains. Subclasses override `loss`, and `module` / `setup` / `metrics`
    where they need to."""

    def module(self, model: nn.Module) -> nn.Module:
        """What the Trainer optimises and prepares, built around the run's `model` (the model itself by default).
        Parameters with `requires_grad=False` get no optimizer state."""
        return model

    def setup(self, accelerator: Accelerator, module: nn.Module) -> None:
        """Called once `module` is prepared (wrapped for ddp / fsdp / torch.compile): e.g. a teacher to the device."""

    def loss(self, module: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        """The scalar loss of one batch through the prepared `module`, under the run's autocast."""
        raise NotImplementedError

    def metrics(self, accelerator: Accelerator) -> dict[str, Any]:
        """Training metrics of the objective's own since the last call, reduced over the processes, for the run's
        evaluation records (`metrics.jsonl`)."""
        return {}


class TaskObjective(Objective):
    """The task's loss (`zoo.tasks`) on the model's outputs, plus the attention's auxiliary loss (VQ's
    commitment)."""

    def __init__(self, kind: Any, task: Any, *, label_smoothing: float = 0.0) -> None:
        self.kind, self.task, self.label_smoothing = kind, task, label_smoothing

    def loss(self, module: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        targets, mask = self.task.targets(batch)
        positions = self.task.loss_positions(targets, mask)
        if positions is None:
            outputs = module(*self.kind.inputs(batch))
        else:
            # the model's outputs at the positions the loss reads only (e.g. a few labelled ones of many)
            outputs = module(*self.kind.inputs(batch), positions=positions)
            targets, mask = targets[positions], None
        loss = self.task.loss(outputs, targets, mask, label_smoothing=self.label_smoothing)
        return loss + auxiliary_loss(module)


# what belongs to a run on labels only (zoo.train._ema, _mixup, _stopping): a run with an objective of its own
# (self-pretraining, a conversion stage) leaves it out
_LABELLED_RUN_ONLY = ("ema", "mixup", "early_stopping")


def objective_recipe(recipe: Recipe, name: str, *, train: Mapping[str, Any], **sections: Mapping[str, Any]) -> Recipe:
    """`recipe` renamed `name` for a run with an objective of its own: `train`'s values replace the recipe's
    `train` ones (EMA, mixup and early stopping off), each other keyword a section's (`optim={"lr": ...}`)."""
    present = {f.name for f in dataclasses.fields(recipe.train)}
    off = {key: None for key in _LABELLED_RUN_ONLY if key in present}
    changed = {key: dataclasses.replace(getattr(recipe, key), **values) for key, values in sections.items()}
    return dataclasses.replace(
        recipe, name=name, train=dataclasses.replace(recipe.train, **{**off, **train}), **changed
    )
