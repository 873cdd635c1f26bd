"""The recipe's learning-rate schedules (zoo.train._schedule, timm's create_scheduler_v2) pinned to the sequences
that zoo's own CosineLRScheduler / StepLRScheduler mapping gave before it was replaced: lr before step 1, then after
each optimizer step, for optim.lr 1e-3, schedule.warmup_lr 1e-6 and min_lr 1e-6."""

import typing

import pytest
import torch

from zoo.config import ScheduleConfig
from zoo.train._schedule import build_scheduler

# (schedule.name, total steps, warmup_steps) -> lr sequence, computed with the replaced mapping
PINNED = {
    ("cosine", 10, 3): [1e-06, 0.000334, 0.000667, 0.0007940987335, 0.0006548539887, 0.0005005, 0.0003461460113,
                        0.0002069012665, 9.639601131e-05, 2.544727011e-05, 1e-06],
    ("cosine", 7, 0): [0.001, 0.0009505339495, 0.000811933156, 0.0006116492065, 0.0003893507935, 0.000189066844,
                       5.046605048e-05, 1e-06],
    ("cosine", 2, 5): [1e-06, 0.0002008, 0.0004006],
    ("constant", 10, 3): [1e-06, 0.000334, 0.000667, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001],
    ("constant", 7, 0): [0.001] * 8,
    ("constant", 2, 5): [1e-06, 0.0002008, 0.0004006],
    ("step", 10, 3): [1e-06, 0.000334, 0.000667, 0.001, 0.001, 0.001, 0.0001, 0.0001, 0.0001, 1e-05, 1e-05],
    ("step", 7, 0): [0.001, 0.001, 0.0001, 0.0001, 1e-05, 1e-05, 1e-06, 1e-06],
    ("step", 2, 5): [1e-06, 0.0002008, 0.0004006],
}  # fmt: skip


def test_every_recipe_schedule_is_pinned():
    assert {name for name, _, _ in PINNED} == set(typing.get_args(typing.get_type_hints(ScheduleConfig)["name"]))


@pytest.mark.parametrize(("name", "total", "warmup"), list(PINNED))
def test_schedule_matches_the_pinned_sequence(name, total, warmup):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = build_scheduler(optimizer, ScheduleConfig(name=name, warmup_steps=warmup), total)
    lrs = [optimizer.param_groups[0]["lr"]]
    for step in range(1, total + 1):
        scheduler.step_update(step)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx(PINNED[name, total, warmup], rel=1e-9)
