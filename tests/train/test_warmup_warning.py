"""A warm-up at or beyond the run's steps never reaches the peak learning rate: a warning says so, with the fix."""

import logging

import torch

from zoo.config import ScheduleConfig
from zoo.train._schedule import build_scheduler


def _optimizer(lr=1e-3):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_warmup_beyond_the_run_warns_with_the_rate_it_reaches(caplog):
    with caplog.at_level(logging.WARNING, logger="zoo.train._schedule"):
        scheduler = build_scheduler(_optimizer(), ScheduleConfig(warmup_steps=40, warmup_lr=0.0), total_steps=30)
    # linear warm-up from 0 to 1e-3 over 40 steps: the last of 30 steps (index 29) runs at 29 / 40 of the peak
    assert "schedule.warmup_steps 40 is at or beyond the run's 30 steps" in caplog.text
    assert (
        "ends its warm-up at 0.000725, never reaching optim.lr 0.001; set schedule.warmup_steps below 30" in caplog.text
    )
    optimizer = scheduler.optimizer
    scheduler.step_update(29)
    assert optimizer.param_groups[0]["lr"] == 1e-3 * 29 / 40


def test_warmup_within_the_run_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="zoo.train._schedule"):
        build_scheduler(_optimizer(), ScheduleConfig(warmup_steps=10), total_steps=30)
    assert caplog.text == ""
