"""Tasks (`zoo.tasks`), driven by the registry: every task's loss is the mean over the units it counts, padded
positions never count, its metrics take its `metric_inputs`, and its metric names agree with each other."""

import math

import pytest
import torch

from zoo.data.collate import IGNORE_INDEX as DATA_IGNORE_INDEX
from zoo.tasks import IGNORE_INDEX, Forecast, get_task, list_tasks, register_task
from zoo.tasks.metrics import METRICS

B, L, K = 4, 9, 5


def batch_of(task, seed: int = 0):
    """Outputs, targets and target mask of the shapes `task` reads, from its own flags."""
    generator = torch.Generator().manual_seed(seed)
    if task.forecasts_inputs:
        return torch.randn(B, L, 2, generator=generator), torch.randn(B, L, 2, generator=generator), None
    if task.per_position:
        outputs = torch.randn(B, L, K, generator=generator)
        targets = torch.randint(0, K, (B, L), generator=generator)
        mask = torch.ones(B, L, dtype=torch.bool)
        mask[1, 6:] = mask[3, 2:] = False
        return outputs, targets, mask
    return torch.randn(B, K, generator=generator), torch.randint(0, K, (B,), generator=generator), None


def _rows(tensor, rows):
    return None if tensor is None else tensor[rows]


@pytest.mark.parametrize("name", list_tasks())
def test_loss_is_the_mean_over_its_units(name):
    # a split's loss is the units-weighted mean of its batches' losses: exact only if loss_units counts the terms
    task = get_task(name)
    outputs, targets, mask = batch_of(task)
    whole = task.loss(outputs, targets, mask)
    total, units = 0.0, 0
    for rows in (slice(0, 1), slice(1, B)):
        part_units = task.loss_units(_rows(targets, rows), _rows(mask, rows))
        total += float(task.loss(_rows(outputs, rows), _rows(targets, rows), _rows(mask, rows))) * part_units
        units += part_units
    assert units == task.loss_units(targets, mask) > 0
    assert math.isclose(total / units, float(whole), rel_tol=1e-5)


@pytest.mark.parametrize("name", [name for name in list_tasks() if get_task(name).per_position])
def test_padded_positions_never_count(name):
    task = get_task(name)
    outputs, targets, mask = batch_of(task)
    changed_targets, changed_outputs = targets.clone(), outputs.clone()
    changed_targets[~mask] = (targets[~mask] + 1) % K
    # padding is a suffix: a padded output predicts a padded position, whether its own or the next one
    changed_outputs[~mask] = torch.randn_like(outputs[~mask])
    reference = task.loss(outputs, targets, mask)
    torch.testing.assert_close(task.loss(changed_outputs, changed_targets, mask), reference)
    preds, target = task.metric_inputs(outputs, changed_targets, mask)
    assert preds.shape[0] == target.shape[0] and int((target != IGNORE_INDEX).sum()) == task.loss_units(targets, mask)


@pytest.mark.parametrize("name", list_tasks())
def test_metrics_take_the_metric_inputs(name):
    task = get_task(name)
    assert set(task.default_metrics) <= set(task.metrics) <= set(METRICS)
    assert set(task.eval_metrics) <= set(task.metrics) and task.selection[0] in task.metrics
    outputs, targets, mask = batch_of(task)
    metrics = task.build_metrics(task.metrics, K)
    metrics.update(*task.metric_inputs(outputs, targets, mask))
    values = metrics.compute()
    assert set(values) == set(task.metrics) - ({"top5"} if K < 5 else set())
    assert task.selection_metric(task.metrics) == task.selection
    assert task.selection_metric([]) == ("loss", False)
    with pytest.raises(ValueError, match=f"unknown metrics \\['nope'\\] for task '{name}'; allowed: "):
        task.build_metrics(["nope"], K)


@pytest.mark.parametrize("name", list_tasks())
def test_label_smoothing_only_where_the_task_takes_it(name):
    task = get_task(name)
    outputs, targets, mask = batch_of(task)
    if task.label_smoothing:
        assert not torch.equal(
            task.loss(outputs, targets, mask, label_smoothing=0.1), task.loss(outputs, targets, mask)
        )
    else:
        with pytest.raises(ValueError, match=f"label smoothing is for classification, not task '{name}'"):
            task.loss(outputs, targets, mask, label_smoothing=0.1)


def test_classification_loss_with_label_smoothing_is_the_smoothed_targets_cross_entropy():
    task = get_task("classification")
    outputs, targets, _ = batch_of(task)
    # by hand: the target's probability 1 - 0.2 + 0.2 / K, every other class 0.2 / K, against log-softmax
    smoothed = torch.full((B, K), 0.2 / K)
    smoothed[torch.arange(B), targets] += 1 - 0.2
    expected = -(smoothed * (outputs - outputs.exp().sum(-1, keepdim=True).log())).sum(-1).mean()
    torch.testing.assert_close(task.loss(outputs, targets, label_smoothing=0.2), expected)


def test_forecast_takes_its_loss_as_an_option():
    forecast = get_task("forecast")
    outputs, targets, _ = batch_of(forecast)
    mae = forecast.configured(forecast_loss="mae", pool="mean")
    assert isinstance(mae, Forecast) and mae.forecast_loss == "mae" and forecast.forecast_loss == "mse"
    torch.testing.assert_close(mae.loss(outputs, targets), (outputs - targets).abs().mean())
    torch.testing.assert_close(forecast.loss(outputs, targets), (outputs - targets).square().mean())
    # options of other tasks are left to them
    assert get_task("classification").configured(forecast_loss="mae") == get_task("classification")
    with pytest.raises(ValueError, match="forecast loss 'huber' is not one of 'mse', 'mae'"):
        forecast.configured(forecast_loss="huber")


# the tasks whose training loss may read the labelled positions only (model.sequence.score), from the registry
SCORED = [name for name in list_tasks() if "score" in get_task(name).model_options]


@pytest.mark.parametrize("name", SCORED)
def test_scoring_the_labelled_positions_gives_the_loss_of_all(name):
    task = get_task(name)
    outputs, targets, mask = batch_of(task)
    targets = targets.masked_fill(torch.rand(B, L, generator=torch.Generator().manual_seed(1)) < 0.6, IGNORE_INDEX)
    # every task scores all positions by default
    assert all(get_task(other).loss_positions(targets, mask) is None for other in list_tasks())
    labelled = task.configured(score="labelled")
    positions = labelled.loss_positions(targets, mask)
    assert positions.dtype == torch.bool and int(positions.sum()) == task.loss_units(targets, mask) > 0
    assert not (positions & ~mask).any() and (targets[positions] != IGNORE_INDEX).all()
    # by hand: cross-entropy over the kept, labelled rows
    keep = mask & (targets != IGNORE_INDEX)
    expected = torch.nn.functional.cross_entropy(outputs[keep], targets[keep])
    torch.testing.assert_close(labelled.loss(outputs[positions], targets[positions]), expected)
    torch.testing.assert_close(task.loss(outputs, targets, mask), expected)
    with pytest.raises(ValueError, match="score 'some' is not one of 'all', 'labelled'"):
        task.configured(score="some")


def test_registry_names_and_errors():
    assert list_tasks()[:4] == ["classification", "forecast", "token_classification", "causal_lm"]
    assert IGNORE_INDEX == DATA_IGNORE_INDEX == -100
    with pytest.raises(ValueError, match=r"unknown task 'forcast' \(did you mean 'forecast'\?\); known: "):
        get_task("forcast")
    with pytest.raises(ValueError, match="task 'forecast' is already registered"):
        register_task(Forecast())


def test_prediction_rows_are_the_tasks_own():
    names = ["a", "b", "c"]
    described = {"label_names": names, "inputs": {"tokenizer": {"add_cls": True}}}
    rows = get_task("classification").prediction_rows({"input": "x"}, torch.tensor([0.0, 2.0, 1.0]), None, described, 2)
    assert rows == [{"input": "x", "classes": ["b", "c"], "probabilities": [0.665241, 0.244728]}]
    # per position: the CLS token's row left out, padded positions give none; the causal variant reads alike
    logits = torch.tensor([[9.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0], [5.0, 0, 0]])
    mask = torch.tensor([True, True, True, False])
    meta = {"input": "x", "record": "r", "start": 11}
    for name in ("token_classification", "causal_token_classification"):
        rows = get_task(name).prediction_rows(meta, logits, mask, described, 5)
        assert [(row["position"], row["label"]) for row in rows] == [(11, "b"), (12, "c")]
    inputs = {"columns": ["x", "y"], "targets": ["y"], "mean": [0.0, 10.0], "std": [1.0, 2.0]}
    rows = get_task("forecast").prediction_rows(
        {"input": "f"}, torch.tensor([[1.0], [-1.0]]), None, {"inputs": inputs}, 5
    )
    assert rows == [{"input": "f", "step": 1, "y": 12.0}, {"input": "f", "step": 2, "y": 8.0}]
    predicted = ["classification", "token_classification", "causal_token_classification", "forecast"]
    assert not get_task("causal_lm").predicts and all(get_task(name).predicts for name in predicted)
