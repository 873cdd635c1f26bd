"""Converting a softmax ViT: attention swap at a new resolution, stage 1 (attention transfer), stage 2 (fine-tuning),
each stage a Trainer run on a tiny MegaMNIST recipe (64-px canvases, 16 training samples in batches of 8)."""

import dataclasses
import json
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import reset_accelerate, tiny_vit_recipe
from timm.layers import resample_abs_pos_embed

import zoo
from zoo.attention.hedgehog import HedgehogAttention
from zoo.config import recipe_from_dict
from zoo.convert.model import Distillation, attention_mse, attention_parameters, swap_attention
from zoo.convert.run import convert_run, finetune, transfer_attention
from zoo.kinds import get_model_kind
from zoo.splits import build_loader, build_split

CLASSES = 3
# the students of the stage tests: MegaMNIST's 10 digits on one channel, at the recipe's 64 px
DIGITS = {"num_classes": 10, "in_chans": 1}
RECIPE = recipe_from_dict(
    tiny_vit_recipe(
        name="tiny_convert",
        model={"img_size": 64, "patch_size": 8, "depth": 2, "embed_dim": 64, "num_heads": 2},
        data={
            "options": {"canvas_size": 64, "digit_size": 24, "num_target": 1, "num_other": 0, "num_clutter": 1},
            "train_samples": 16,
        },
        # constant: a stage's rate is the one it is given; no clipping: the steps as plain AdamW takes them
        schedule={"name": "constant"},
        train={"clip_grad": None},
        optim={"weight_decay": 0.0},
    )
)


@pytest.fixture(autouse=True)
def fresh_accelerate():
    reset_accelerate()


def spiky_teacher(**overrides) -> torch.nn.Module:
    """A tiny softmax ViT at 32 px (16 tokens) whose qkv weights are scaled up, so its attention is as peaked as a
    trained model's (timm's 0.02-std initialisation gives near-uniform attention that any variant matches)."""
    torch.manual_seed(0)
    options = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 64, "num_heads": 2, "num_classes": CLASSES}
    teacher = zoo.create_model("vit_tiny_patch16_224", attention="softmax", **{**options, **overrides})
    with torch.no_grad():
        for block in teacher.blocks:
            torch.nn.init.normal_(block.attn.qkv.weight, std=4 * 64**-0.5)
    return teacher.eval()


def images(count: int = 4, size: int = 64, batch: int = 8) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(batch, 3, size, size, generator=generator) for _ in range(count)]


def test_swap_copies_every_timm_weight_at_the_target_resolution():
    teacher = spiky_teacher(qkv_bias=True)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = swap_attention(teacher, "hedgehog", {"feature_dim": 32}, img_size=64)
    assert all(isinstance(block.attn, HedgehogAttention) for block in student.blocks)
    assert (student.zoo_args["attention"], student.zoo_args["attention_options"]) == ("hedgehog", {"feature_dim": 32})
    assert tuple(student.patch_embed.img_size) == (64, 64)
    expected_pos = resample_abs_pos_embed(teacher.pos_embed, new_size=(8, 8), old_size=(4, 4), num_prefix_tokens=1)
    torch.testing.assert_close(student.pos_embed, expected_pos)
    state = student.state_dict()
    own = set(attention_parameters(student))
    assert own == {f"blocks.{i}.attn.feature_map_{x}" for i in range(2) for x in "qk"}
    for key, value in teacher.state_dict().items():
        if key != "pos_embed":
            assert torch.equal(state[key], value), key
    assert set(state) - set(before) == own
    # the teacher is untouched
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert student(images(1)[0]).shape == (8, CLASSES)


@pytest.mark.parametrize("overrides", [{}, {"qk_norm": True, "qkv_bias": True}])
def test_swapping_to_softmax_reproduces_the_teacher(overrides):
    # Every copied weight and norm (eps included) is used as the teacher uses it.
    teacher = spiky_teacher(**overrides)
    x = images(1, size=32)[0]
    torch.testing.assert_close(swap_attention(teacher, "softmax")(x), teacher(x))
    resized = swap_attention(teacher, "softmax", img_size=64)
    teacher.set_input_size(img_size=(64, 64))
    torch.testing.assert_close(resized(images(1)[0]), teacher(images(1)[0]))


def test_swap_errors_name_the_value():
    teacher = spiky_teacher()
    with pytest.raises(ValueError, match="'hedgehgo'.*did you mean 'hedgehog'"):
        swap_attention(teacher, "hedgehgo")
    with pytest.raises(ValueError, match="no option 'feature_dims'"):
        swap_attention(teacher, "hedgehog", {"feature_dims": 8})
    with pytest.raises(ValueError, match="img_size=-3"):
        swap_attention(teacher, "hedgehog", img_size=-3)
    gau = zoo.create_model(
        "vit_tiny_patch16_224",
        attention="gau",
        block="gau",
        img_size=32,
        patch_size=8,
        depth=1,
        embed_dim=64,
        num_heads=1,
        attention_options={"group_size": 8},
    )
    with pytest.raises(TypeError, match="GAU"):
        swap_attention(gau, "hedgehog")


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 8])
def test_stage1_lowers_the_attention_mse_and_moves_only_the_feature_maps(window, tmp_path):
    teacher = spiky_teacher(**DIGITS)
    teacher_state = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = swap_attention(teacher, "hedgehog", {"feature_dim": 64, "window": window}, img_size=64)
    student.train()
    batches = training_images()
    before = attention_mse(teacher, student, batches)
    start = {k: v.clone() for k, v in student.state_dict().items()}
    report = transfer_attention(teacher, student, RECIPE, steps=40, lr=1e-2, run_dir=tmp_path)
    after = attention_mse(teacher, student, batches)
    # every block's error falls well below where it started
    assert all(a < 0.7 * b for a, b in zip(after, before, strict=True)), (before, after)
    assert not report.skipped and report.steps == 40 and len(report.losses) == 40
    assert report.losses[-1] < report.losses[0]
    own = set(attention_parameters(student))
    assert set(report.parameters) == own and ({"blocks.0.attn.window_factor"} <= own) == bool(window)
    for key, value in student.state_dict().items():
        assert torch.equal(value, start[key]) != (key in own), key
    # flags, mode and the teacher come back as they were
    assert all(p.requires_grad for p in student.parameters()) and student.training
    assert all(torch.equal(teacher_state[k], v) for k, v in teacher.state_dict().items())
    # a run of the Trainer, with its checkpoint
    assert (tmp_path / "checkpoints" / "last" / "manifest.json").is_file()


def _last_lr(run_dir) -> float:
    """The learning rate a stage's run recorded at its end (its one evaluation record)."""
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["lr"]


@pytest.mark.parametrize("stage1,last_lr", [({}, 1e-2), ({"schedule": "cosine"}, 1e-5)])
def test_stage1_holds_its_rate_where_stage2_follows_the_recipes_cosine(stage1, last_lr, tmp_path):
    # the recipe decays to 1e-5 by the run's last step; stage 1 keeps the rate it is given unless told the recipe's
    recipe = dataclasses.replace(RECIPE, schedule=dataclasses.replace(RECIPE.schedule, name="cosine", min_lr=1e-5))
    teacher = spiky_teacher(**DIGITS)
    student = swap_attention(teacher, "hedgehog", {"feature_dim": 32}, img_size=64)
    transfer_attention(teacher, student, recipe, steps=2, lr=1e-2, run_dir=tmp_path / "stage1", **stage1)
    assert _last_lr(tmp_path / "stage1") == pytest.approx(last_lr)
    finetune(student, recipe, steps=2, lr=1e-3, run_dir=tmp_path / "stage2")
    assert _last_lr(tmp_path / "stage2") == pytest.approx(1e-5)


def test_stage1_names_a_schedule_that_is_not_one(tmp_path):
    teacher = spiky_teacher(**DIGITS)
    student = swap_attention(teacher, "hedgehog", {"feature_dim": 32}, img_size=64)
    with pytest.raises(ValueError, match=r"schedule='linear' is not a schedule: use one of cosine, constant, step"):
        transfer_attention(teacher, student, RECIPE, steps=1, run_dir=tmp_path, schedule="linear")
    # convert_run refuses it before it reads the teacher
    with pytest.raises(ValueError, match="stage1_schedule='warm'"):
        convert_run(tmp_path / "missing", RECIPE, stage1_schedule="warm")


@pytest.mark.parametrize("name,own", [("linear", []), ("performer", []), ("nystrom", ["conv.weight"])])
def test_own_parameters_of_other_variants(name, own):
    student = swap_attention(spiky_teacher(), name, img_size=64)
    names = sorted({key.split(".attn.")[1] for key in attention_parameters(student)})
    assert names == own


def test_a_variant_without_parameters_of_its_own_skips_stage1(tmp_path):
    teacher = spiky_teacher(**DIGITS)
    student = swap_attention(teacher, "linear", img_size=64)
    start = {k: v.clone() for k, v in student.state_dict().items()}
    report = transfer_attention(teacher, student, RECIPE, steps=10, run_dir=tmp_path)
    assert report.skipped and report.steps == 0 and report.losses == []
    assert all(torch.equal(start[k], v) for k, v in student.state_dict().items())
    assert not tmp_path.joinpath("checkpoints").exists()


def training_images() -> list[torch.Tensor]:
    """The images of the recipe's training batches, in order."""
    return [batch["image"] for batch in training_batches()]


def training_batches() -> list[dict]:
    return list(build_loader(RECIPE, build_split(RECIPE, "train"), train=False))


def _task_loss(model: torch.nn.Module, batches: list[dict]) -> float:
    """The mean cross-entropy over the training split, in eval mode."""
    model.eval()
    with torch.no_grad():
        return sum(F.cross_entropy(model(b["image"]), b["label"]).item() for b in batches) / len(batches)


@pytest.mark.slow
def test_stage2_changes_the_weights_and_lowers_the_task_loss(tmp_path):
    student = swap_attention(spiky_teacher(**DIGITS), "hedgehog", {"feature_dim": 32}, img_size=64)
    batches = training_batches()
    start = {k: v.clone() for k, v in student.state_dict().items()}
    before = _task_loss(student, batches)
    report = finetune(student, RECIPE, steps=30, lr=1e-3, run_dir=tmp_path)
    assert report.steps == 30 and len(report.losses) == 30 and report.distill_losses == []
    assert _task_loss(student, batches) < 0.5 * before
    changed = {k for k, v in student.state_dict().items() if not torch.equal(v, start[k])}
    assert {"head.weight", "blocks.0.attn.qkv.weight", "blocks.1.mlp.fc1.weight", "pos_embed"} <= changed
    assert student.training is False  # the mode it had before (set by _task_loss)


@pytest.mark.slow
def test_stage2_distils_the_teachers_logits(tmp_path):
    teacher = spiky_teacher(**DIGITS)
    student = swap_attention(teacher, "hedgehog", {"feature_dim": 32}, img_size=64)
    # distill_weight=1: the teacher's logits are the only target
    report = finetune(
        student, RECIPE, steps=30, lr=1e-3, run_dir=tmp_path, teacher=teacher, distill_weight=1.0, temperature=2.0
    )
    assert len(report.distill_losses) == 30
    assert report.distill_losses[-1] < 0.5 * report.distill_losses[0]
    torch.testing.assert_close(torch.tensor(report.losses), torch.tensor(report.distill_losses))


def test_the_distillation_loss_is_hintons():
    # timm's LogitDistillationTask against the formula written out: (1 - w) CE + w T^2 KL(teacher || student), both
    # models reading the same input although their pretrained_cfg normalisations differ (as a built student's timm
    # 0.5 / 0.5 and a loaded zoo run's 0 / 1 do)
    teacher = spiky_teacher(**DIGITS)
    student = swap_attention(teacher, "hedgehog", {"feature_dim": 32}, img_size=64).eval()
    channels = len(teacher.pretrained_cfg["mean"])
    teacher.pretrained_cfg = {**teacher.pretrained_cfg, "mean": (0.0,) * channels, "std": (1.0,) * channels}
    student.pretrained_cfg = {**student.pretrained_cfg, "mean": (0.5,) * channels, "std": (0.5,) * channels}
    kind = get_model_kind("vit")
    objective = Distillation(kind, kind.task(RECIPE), teacher=teacher, distill_weight=0.3, temperature=2.0)
    module = objective.module(student)
    objective.setup(SimpleNamespace(device=torch.device("cpu")), module)
    batch = training_batches()[0]
    with torch.no_grad():
        loss = objective.loss(module, batch)
        student_logits = student(batch["image"])
        teacher.set_input_size(img_size=(64, 64))
        teacher_logits = teacher(batch["image"])
    p_teacher = (teacher_logits / 2).softmax(-1)
    kl = (p_teacher * (p_teacher.log() - (student_logits / 2).log_softmax(-1))).sum(-1).mean()
    expected = 0.7 * F.cross_entropy(student_logits, batch["label"]) + 0.3 * 4 * kl
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(objective.parts[0][2], 4 * kl, rtol=1e-5, atol=1e-6)


def test_stage2_checks_its_arguments(tmp_path):
    student = swap_attention(spiky_teacher(**DIGITS), "linear", img_size=64)
    with pytest.raises(ValueError, match="distill_weight=1.5"):
        finetune(student, RECIPE, steps=1, distill_weight=1.5, run_dir=tmp_path)
    with pytest.raises(ValueError, match="temperature=0"):
        finetune(student, RECIPE, steps=1, temperature=0, run_dir=tmp_path)
    with pytest.raises(ValueError, match="lr=-1"):
        finetune(student, RECIPE, steps=1, lr=-1, run_dir=tmp_path)
    with pytest.raises(ValueError, match="lora_rank"):
        finetune(student, RECIPE, steps=1, lora_rank=0, run_dir=tmp_path)


def test_lora_without_peft_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError, installed or not
    student = swap_attention(spiky_teacher(**DIGITS), "linear", img_size=64)
    with pytest.raises(ImportError, match="pip install peft"):
        finetune(student, RECIPE, steps=1, lora_rank=4, run_dir=tmp_path)
    assert all(p.requires_grad for p in student.parameters())


@pytest.mark.slow
def test_lora_trains_adapters_on_qkv_and_proj_and_merges_them(tmp_path):
    # peft is in the dev extras: this route runs wherever the suite does
    student = swap_attention(spiky_teacher(**DIGITS), "hedgehog", {"feature_dim": 32}, img_size=64)
    plain, batches = type(student), training_batches()
    start = {k: v.clone() for k, v in student.state_dict().items()}
    before = _task_loss(student, batches)
    report = finetune(student, RECIPE, steps=30, lr=3e-3, lora_rank=4, run_dir=tmp_path)
    assert report.lora_rank == 4 and _task_loss(student, batches) < 0.5 * before
    # merged back: the same plain timm model, only the adapted weights and the classifier changed
    assert type(student) is plain and set(student.state_dict()) == set(start)
    changed = {k for k, v in student.state_dict().items() if not torch.equal(v, start[k])}
    adapted = {f"blocks.{i}.attn.{m}.weight" for i in range(2) for m in ("qkv", "proj")}
    assert changed == adapted | {"head.weight", "head.bias"}
    assert all(p.requires_grad for p in student.parameters())
