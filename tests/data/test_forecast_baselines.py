"""Every forecast is scored beside both baselines the README names, so a model's error always has a floor to beat:
seasonal-naive where the series' season is known, the naive last value (its one-step season) where it is not, as
for your own CSV."""

import numpy as np
import pytest

from zoo.data.series.forecast import ForecastWindows


def test_a_series_without_a_season_gets_the_naive_baseline_beside_the_linear_one():
    rng = np.random.default_rng(0)
    # a random walk: its naive forecast error over a horizon of h steps is known from the steps themselves
    data = np.cumsum(rng.normal(size=(1_500, 1)), axis=0)
    train = ForecastWindows(data, ("y",), "train", lookback=32, horizon=8, targets=("y",))
    test = ForecastWindows(data, ("y",), "test", lookback=32, horizon=8, targets=("y",))
    scores = test.baselines(train)
    assert set(scores) == {"linear", "naive"}
    history, future = test.target_windows()
    errors = future - history[:, -1:]
    assert scores["naive"]["mse"] == pytest.approx(float(np.mean(np.square(errors))), rel=1e-5)
    # a random walk's best forecast is its last value: the linear map cannot beat it by much
    assert scores["linear"]["mse"] > 0.9 * scores["naive"]["mse"]
