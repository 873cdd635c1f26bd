"""tools/convert.py end to end: a locally made timm checkpoint (a random timm ViT saved with safetensors) converted
to hedgehog at four times the tokens on MegaMNIST, and the result read by tools/eval.py, zoo.predict and zoo.load_model;
a run directory as the teacher; two processes under torchrun (the `convert` run of the suite's one torchrun launch,
tests/distributed_worker.py); one-line errors. Tiny sizes (depth 2, width 32, 32 -> 64 px)."""

import json
from pathlib import Path

import pytest
import timm
import torch
from helpers import TEACHER_SIZES, conversion_inputs, reset_accelerate, run_tool_here
from safetensors.torch import save_file

import zoo
from zoo.config import load_recipe
from zoo.convert.run import convert_run
from zoo.evaluate import evaluate
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("no_network")

AT_64 = ["model.img_size=64", "data.options.canvas_size=64"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return conversion_inputs(tmp_path_factory.mktemp("convert"))


def test_a_timm_checkpoint_converts_end_to_end_into_a_run(files, tmp_path):
    run_dir = tmp_path / "hedgehog"
    proc = run_tool_here(
        "tools/convert.py", files["weights"], files["recipe"], "--attention", "hedgehog", "--img-size", "64",
        "--set", "data.options.canvas_size=64", "--stage1-steps", "2", "--stage2-steps", "2", "--output", run_dir,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "val after stage2: " in proc.stdout
    recipe = load_recipe(run_dir / "recipe.yaml")
    assert recipe.model.attention.name == "hedgehog" and recipe.model.img_size == 64
    stages = [json.loads(line)["stage"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert stages == ["swap", "stage1", "stage2"]
    summary = json.loads((run_dir / "conversion.json").read_text())
    assert summary["stage1"]["steps"] == 2 and len(summary["stage1"]["losses"]) == 2
    assert summary["stage2"]["steps"] == 2 and summary["stage2"]["distill_losses"] == []
    # tools/eval.py's path and zoo.load_model read the run as a trained one
    reset_accelerate()
    assert evaluate(run_dir, split="test")["metrics"]["samples"] == 8
    model = zoo.load_model(run_dir)
    assert [type(b.attn).attention_name for b in model.blocks] == ["hedgehog", "hedgehog"]
    assert model.pretrained_cfg["input_size"] == (1, 64, 64)
    from zoo.predict import predict

    image = tmp_path / "canvas.png"
    from PIL import Image

    Image.new("L", (64, 64), 0).save(image)
    rows = predict(model, [image], top_k=3).rows
    assert len(rows) == 1 and len(rows[0]["classes"]) == 3


def test_the_teacher_weights_reach_the_student_and_stage_one_trains_only_the_feature_maps(files):
    reset_accelerate()
    recipe = load_recipe(files["recipe"], ["model.attention={name: hedgehog}", *AT_64])
    result = convert_run(files["weights"], recipe, stage1_steps=3, stage2_steps=0, eval_split=None)
    teacher, student = result.teacher.state_dict(), result.student.state_dict()
    assert not result.transfer.skipped and len(result.transfer.losses) == 3
    assert set(result.transfer.parameters) == {f"blocks.{i}.attn.feature_map_{x}" for i in range(2) for x in "qk"}
    for key, value in teacher.items():
        if not key.startswith("head"):
            assert torch.equal(student[key], value), key
    assert tuple(result.student.patch_embed.img_size) == (64, 64)


def test_a_run_directory_is_a_teacher_and_distils_its_logits(files, tmp_path):
    reset_accelerate()
    teacher_run = tmp_path / "teacher"
    Trainer(load_recipe(files["recipe"]), teacher_run).fit()
    reset_accelerate()
    recipe = load_recipe(files["recipe"], ["model.attention={name: linear}", *AT_64])
    result = convert_run(
        teacher_run, recipe, stage1_steps=2, stage2_steps=2, eval_split="val", run_dir=tmp_path / "run"
    )
    # linear attention has no parameters of its own: stage 1 is skipped, stage 2 distils the teacher
    assert result.transfer.skipped and list(result.metrics) == ["swap", "stage2"]
    assert len(result.finetune.distill_losses) == 2
    images = torch.rand(2, 1, 64, 64)
    torch.testing.assert_close(zoo.load_model(tmp_path / "run")(images), result.student(images))


def test_what_cannot_be_converted_is_a_one_line_error(files, tmp_path):
    wide = tmp_path / "wide.safetensors"
    save_file(
        timm.create_model("vit_tiny_patch16_224", img_size=32, **{**TEACHER_SIZES, "embed_dim": 64}).state_dict(), wide
    )
    recipe = files["recipe"]
    proc = run_tool_here("tools/convert.py", wide, recipe, "--attention", "hedgehog", "--output", tmp_path / "x")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "wide.safetensors" in proc.stderr and "64" in proc.stderr.splitlines()[-1]
    splice = ROOT / "recipes" / "splice_quick.yaml"
    with pytest.raises(ValueError, match="converts ViTs; the recipe's model.kind is 'sequence'"):
        convert_run(files["weights"], load_recipe(splice), stage1_steps=0, stage2_steps=0)
    with pytest.raises(FileNotFoundError, match="teacher .*missing.safetensors does not exist"):
        convert_run(tmp_path / "missing.safetensors", load_recipe(files["recipe"]), stage1_steps=0, stage2_steps=0)


@pytest.mark.slow
def test_torchrun_converts_on_two_processes_as_training_does(distributed_runs):
    # each stage a data-parallel Trainer run (gloo): both processes end with the same weights, the run is readable;
    # tools/convert.py converts helpers.conversion_inputs' teacher to hedgehog at 64 px, 2 + 2 steps
    distributed_runs.check("convert")
    run_dir = distributed_runs.folder / "convert"
    assert distributed_runs.runs("stdout")["convert"].count("val after stage2: ") == 1
    for stage in ("stage1", "stage2"):
        summary = json.loads((run_dir / "stages" / stage / "train_summary.json").read_text())
        assert summary["num_processes"] == 2 and summary["replicas_identical"] and summary["steps"] == 2, stage
    conversion = json.loads((run_dir / "conversion.json").read_text())
    assert conversion["stage1"]["steps"] == 2 and conversion["stage2"]["steps"] == 2
    reset_accelerate()
    assert [type(b.attn).attention_name for b in zoo.load_model(run_dir).blocks] == ["hedgehog", "hedgehog"]


def test_a_teacher_that_is_not_softmax_is_named_in_a_warning(files, tmp_path, caplog):
    # a Performer-trained ViT as the teacher: the student would learn Performer's approximation, not softmax
    teacher = zoo.create_model(
        "vit_tiny_patch16_224", img_size=32, in_chans=1, num_classes=10, attention="performer", **TEACHER_SIZES
    )
    zoo.save_pretrained(teacher, tmp_path / "performer")
    recipe = load_recipe(files["recipe"], ["model.attention={name: linear}"])
    for source, warned in ((tmp_path / "performer", True), (files["weights"], False)):
        caplog.clear()
        reset_accelerate()
        with caplog.at_level("WARNING", logger="zoo.convert.run"):
            convert_run(source, recipe, stage1_steps=0, stage2_steps=0, eval_split=None)
        expected = f"teacher {source} uses 'performer' attention in 2 of its 2 blocks, not softmax"
        assert (expected in caplog.text) is warned, caplog.text
        assert ("not softmax" in caplog.text) is warned
