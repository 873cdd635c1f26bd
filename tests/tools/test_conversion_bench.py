"""tools/zoo_bench/conversion.py (`make bench-conversion`): the students it builds from the teacher's recipe, and what
its report says of hedgehog over batch orders."""

from pathlib import Path

import pytest

from zoo.config import load_recipe, recipe_to_dict
from zoo_bench.conversion import SETUP_TEXT, paired_change, report, setup_recipe, student_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_a_student_is_the_teacher_at_the_target_size_with_another_attention():
    teacher = load_recipe(ROOT / "recipes" / "conversion_teacher.yaml")
    student = student_recipe(teacher, "hedgehog", {"feature_dim": 32}, 96)
    assert (student.model.img_size, student.data.options["canvas_size"]) == (96, 96)
    assert (student.model.attention.name, student.model.attention.options) == ("hedgehog", {"feature_dim": 32})
    # nothing else moves: the same recipe once the three changed keys are put back
    back = recipe_to_dict(student)
    back["model"]["img_size"] = teacher.model.img_size
    back["model"]["attention"] = recipe_to_dict(teacher)["model"]["attention"]
    back["data"]["options"]["canvas_size"] = teacher.data.options["canvas_size"]
    assert back == recipe_to_dict(teacher)


def test_a_setup_changes_only_its_sections_and_the_batch_order():
    teacher = load_recipe(ROOT / "recipes" / "conversion_teacher.yaml")
    changed = setup_recipe(teacher, "no_weight_decay", seed=3)
    assert (changed.seed, changed.optim.weight_decay, changed.schedule.min_lr) == (3, 0.0, 0.0)
    back = recipe_to_dict(changed)
    back["seed"] = teacher.seed
    back["optim"]["weight_decay"] = teacher.optim.weight_decay
    back["schedule"]["min_lr"] = teacher.schedule.min_lr
    assert back == recipe_to_dict(teacher)
    # stage 1's schedule is convert_run's keyword, not a recipe section
    assert recipe_to_dict(setup_recipe(teacher, "stage1_cosine", seed=0)) == recipe_to_dict(teacher)


def _orders(setup: str, stage2: list[float]) -> list[dict]:
    return [
        {"setup": setup, "seed": seed, "stage1": 0.6, "stage2": value, "stage1_mse": [0.1, 0.01]}
        for seed, value in enumerate(stage2)
    ]


def _results(orders: list[dict]) -> dict:
    settings = {"img_size": 96, "stage1_steps": 30, "stage2_steps": 10, "stage1_lr": 0.03, "stage2_lr": 5e-4}
    teacher = {"recipe": "t.yaml", "img_size": 48, "steps": 400, "batch_size": 64, "top1": 0.8, "top1_at_target": 0.7}
    return {
        "settings": {**settings, "distill_weight": 0.5},
        "teacher": {**teacher, "minutes": 0.0},
        "rows": [],
        "orders": orders,
        "minutes": 1.0,
        "device": "cpu",
        "threads": 1,
        "versions": {},
    }


def test_the_change_against_shipped_is_paired_over_the_orders_both_hold():
    shipped = {row["seed"]: row for row in _orders("shipped", [0.70, 0.74, 0.72])}
    # two orders in common: changes +0.02 and +0.04, mean 0.03, std 0.0141, standard error 0.01
    other = {row["seed"]: row for row in _orders("stage1_cosine", [0.72, 0.78])}
    change, error = paired_change(other, shipped, "stage2")
    assert change == pytest.approx(0.03) and error == pytest.approx(0.01)


def test_the_report_names_a_setting_that_beats_the_shipped_stages_beyond_noise():
    # every order 3 points above shipped: a change of the stages that costs the share
    orders = _orders("shipped", [0.70, 0.72, 0.77]) + _orders("no_weight_decay", [0.73, 0.75, 0.80])
    text = " ".join(report(_results(orders)).split())
    assert "from the shipped stages and stage 2 +3.0 ± 0.0, beyond twice its standard error" in text
    assert f"The shipped stages lose the share to {SETUP_TEXT['no_weight_decay']}" in text
    # 95% of 0.8 is 0.76: one of the three shipped orders reaches it
    assert "95% of the teacher's 0.800 is 0.760" in text and "1 of 3 at 95% or more" in text


def test_the_report_says_what_keeps_the_share_when_no_setting_explains_it():
    orders = _orders("shipped", [0.70, 0.72, 0.74]) + _orders("stage1_cosine", [0.71, 0.70, 0.75])
    text = " ".join(report(_results(orders)).split())
    # changes +1, -2 and +1 points: mean 0, standard error 1 point
    assert "from the shipped stages and stage 2 +0.0 ± 1.0, within twice its standard error" in text
    assert "No setting changed back accounts for the share below 95%" in text
    assert "whose 95% (0.760) lies above the 0.700 that exact softmax attention scores at 96 px" in text


def test_a_share_at_the_goal_is_said_so_and_a_report_without_the_study_has_no_section():
    text = " ".join(report(_results(_orders("shipped", [0.76, 0.78]))).split())
    assert "hedgehog keeps at least 95% of the teacher's top-1 as shipped" in text
    assert "batch orders" not in report(_results([]))
