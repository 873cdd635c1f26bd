"""The evaluation loop: a task's loss and metrics over a whole split, gathered from every process (no sample counted
twice). The training loop (`zoo.train.loop`) runs it after every evaluated epoch, `zoo.evaluate` on a saved run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from accelerate import Accelerator
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ..tasks import Task
from ..tasks.metrics import metrics_to_python

__all__ = ["evaluate_loader"]


def _gather(
    accelerator: Accelerator, outputs: Tensor, targets: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Every process's outputs, targets and target mask (no sample twice): only what the loss and metrics read,
    never the inputs. Per-position batches are first padded to one length across processes, the padding masked
    out."""
    tensors = (outputs, targets) if mask is None else (outputs, targets, mask)
    if accelerator.num_processes > 1 and mask is not None:
        # pad_across_processes pads with zeros through an addition, which turns a bool mask into int64
        tensors = tuple(accelerator.pad_across_processes(t, dim=1) for t in tensors)
    gathered = accelerator.gather_for_metrics(tensors)
    return gathered[0], gathered[1], None if mask is None else gathered[2].bool()


@torch.no_grad()
def evaluate_loader(
    model: nn.Module,
    loader: DataLoader,
    accelerator: Accelerator,
    *,
    task: Task,
    model_inputs: Callable[[Mapping[str, Tensor]], tuple[Tensor, ...]],
    metric_names: Sequence[str],
    num_classes: int,
) -> dict:
    """Loss and metrics of `task` over the whole split, gathered from every process (no sample counted twice).

    `model_inputs`: the model's inputs from a batch (`ModelKind.inputs`). `num_classes`: what the metrics count
    (`Task.num_outputs`). The loss is the mean over every term the task's loss averages (`Task.loss_units`).
    """
    model.eval()
    metrics = task.build_metrics(metric_names, num_classes).to(accelerator.device)
    loss_sum, units, count = torch.zeros((), device=accelerator.device), 0, 0
    for batch in loader:
        targets, mask = task.targets(batch)
        with accelerator.autocast():
            outputs = model(*model_inputs(batch))
        outputs, targets, mask = _gather(accelerator, outputs.float(), targets, mask)
        batch_units = task.loss_units(targets, mask)
        if batch_units:
            loss_sum += task.loss(outputs, targets, mask) * batch_units
        units += batch_units
        count += targets.shape[0]
        metrics.update(*task.metric_inputs(outputs, targets, mask))
    result = {"loss": float(loss_sum) / max(units, 1), "samples": count}
    return {**result, **metrics_to_python(metrics.compute())}
