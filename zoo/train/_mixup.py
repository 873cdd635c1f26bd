"""`train.mixup`: timm's `Mixup` on a training batch's images and `SoftTargetCrossEntropy` on the mixed targets.

A mixed batch pairs sample i with sample B - 1 - i (the batch reversed). Mixup (Zhang et al. 2018) blends the two
images with weight lam ~ Beta(mixup_alpha, mixup_alpha); CutMix (Yun et al. 2019) pastes a box of the partner's image,
lam being the share of pixels kept. Either way the target is lam * y_i + (1 - lam) * y_{B-1-i}, each one-hot smoothed
by `train.label_smoothing` (1 - eps + eps / K on the class, eps / K elsewhere), and the loss is the cross-entropy
against that soft target. lam is drawn from numpy's global generator (accelerate's `set_seed` seeds it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor, nn

from ..attention._registry import auxiliary_loss
from ..config._config import TrainConfig
from ._objective import TaskObjective

__all__ = ["MixupObjective", "training_objective"]

# the key of an image batch (zoo.data: {"image", "label"})
_IMAGES = "image"


class MixupObjective(TaskObjective):
    """The task's objective on mixed batches: images `[B, C, H, W]` mixed in place, class indices `[B]` turned into
    soft targets `[B, K]`, their mean cross-entropy with the outputs `[B, K]`, plus the attention's auxiliary loss."""

    def __init__(self, kind: Any, task: Any, cfg: TrainConfig, num_classes: int) -> None:
        super().__init__(kind, task, label_smoothing=cfg.label_smoothing)
        mixup = cfg.mixup
        self.mixup = Mixup(
            mixup_alpha=mixup.mixup_alpha,
            cutmix_alpha=mixup.cutmix_alpha,
            prob=mixup.prob,
            switch_prob=mixup.switch_prob,
            label_smoothing=cfg.label_smoothing,
            num_classes=num_classes,
        )
        self.soft_loss = SoftTargetCrossEntropy()

    def loss(self, module: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        targets, _ = self.task.targets(batch)
        images, soft = self.mixup(batch[_IMAGES], targets)
        outputs = module(*self.kind.inputs({**batch, _IMAGES: images}))
        return self.soft_loss(outputs.float(), soft) + auxiliary_loss(module)


def training_objective(kind: Any, task: Any, cfg: TrainConfig, num_classes: int) -> TaskObjective:
    """The objective of a run trained on labels: mixed batches under `train.mixup`, else the task's loss."""
    if cfg.mixup is not None:
        return MixupObjective(kind, task, cfg, num_classes)
    return TaskObjective(kind, task, label_smoothing=cfg.label_smoothing)
