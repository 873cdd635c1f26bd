"""`train.early_stopping`: the run ends once the validation score that picks `checkpoints/best` (the task's selection
metric) has not improved for `patience` evaluations in a row; `checkpoints/best` keeps the best one."""

from __future__ import annotations

from ..config._config import EarlyStoppingConfig

__all__ = ["early_stop_reason"]


def early_stop_reason(config: EarlyStoppingConfig | None, evals_since_best: int, selection: str) -> str | None:
    """Why the run stops now (one line for the log), or None to go on. `evals_since_best`: the evaluations in a row
    that did not beat the best score so far."""
    if config is None or evals_since_best < config.patience:
        return None
    return (
        f"early stopping: val_{selection} has not improved for {evals_since_best} evaluations "
        f"(train.early_stopping.patience {config.patience}); checkpoints/best holds the best"
    )
