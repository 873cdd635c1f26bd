"""tools/zoo_bench/conversion.py (`make bench-conversion`): the students it builds from the teacher's recipe."""

from pathlib import Path

from zoo.config import load_recipe, recipe_to_dict
from zoo_bench.conversion import student_recipe

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
