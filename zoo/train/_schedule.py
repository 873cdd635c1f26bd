"""The learning-rate schedule of a recipe (`schedule` section) as timm's `create_scheduler_v2`, stepped per
optimizer step (`scheduler.step_update(step)`): linear warm-up from `schedule.warmup_lr` over `warmup_steps`, then
`cosine` to `min_lr` at the run's last step, `constant`, or `step` (the rate divided by 10 every
`total_steps // 3` steps after warm-up)."""

from __future__ import annotations

import logging

from timm.scheduler import create_scheduler_v2
from timm.scheduler.scheduler import Scheduler
from torch.optim import Optimizer

from ..config import ScheduleConfig

__all__ = ["build_scheduler"]

_logger = logging.getLogger(__name__)

# `step`: ten times lower at each third of the run
_STEP_DECAY_RATE = 0.1
_STEP_PHASES = 3


def build_scheduler(optimizer: Optimizer, schedule: ScheduleConfig, total_steps: int) -> Scheduler:
    """timm's scheduler for `schedule` over `total_steps` optimizer steps, counted in steps (not epochs); a warm-up
    at or beyond the run's steps, which never reaches the peak rate, is named in a warning with the fix."""
    if schedule.warmup_steps >= total_steps > 0:
        peak = max(group["lr"] for group in optimizer.param_groups)
        reached = schedule.warmup_lr + (peak - schedule.warmup_lr) * (total_steps - 1) / schedule.warmup_steps
        _logger.warning(
            "schedule.warmup_steps %d is at or beyond the run's %d steps: the learning rate ends its warm-up at %.3g, "
            "never reaching optim.lr %.3g; set schedule.warmup_steps below %d (e.g. %d)",
            schedule.warmup_steps,
            total_steps,
            reached,
            peak,
            total_steps,
            max(total_steps // 10, 0),
        )
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=schedule.name,
        num_epochs=total_steps,
        decay_epochs=max(total_steps // _STEP_PHASES, 1),
        decay_rate=_STEP_DECAY_RATE,
        min_lr=schedule.min_lr,
        warmup_lr=schedule.warmup_lr,
        warmup_epochs=schedule.warmup_steps,
        # `step` counts its thirds from the end of warm-up (StepLRScheduler's own default); cosine reaches min_lr at
        # the run's last step, warm-up included
        warmup_prefix=schedule.name == "step",
        # one "epoch" per step: timm then counts every length above in optimizer steps
        step_on_epochs=False,
        updates_per_epoch=1,
    )
    return scheduler
