"""`train.compile` (zoo.train._compile): the Trainer's steps compiled by torch.compile through accelerate against the
same run in eager mode, graph breaks and recompiles in the compiled step, checkpoints under the plain model's keys,
and the recipe key's errors."""

import json
import logging
import runpy
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo
from accelerate.utils import DynamoBackend
from helpers import compile_backend, reset_accelerate, tiny_vit_recipe, write_recipe
from safetensors.torch import load_file
from torch._dynamo.utils import counters

import zoo
import zoo.train.parts
from zoo._schema import RecipeError
from zoo.cli import run_cli
from zoo.config import load_recipe, recipe_from_dict
from zoo.train._compile import dynamo_plugin
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]

OPTIONS = {"performer": {"nb_features": 16, "redraw_interval": 2}}


def tiny(attention: str, *, compile, steps: int, validate: bool = False, **model) -> dict:
    """The tiny ViT at 2 blocks with `attention`, `steps` fp32 steps of batch 8; by default no validation split,
    so that nothing but the training step is compiled."""
    return tiny_vit_recipe(
        model={"depth": 2, "attention": {"name": attention, "options": OPTIONS.get(attention, {})}, **model},
        train={"max_steps": steps, "mixed_precision": "no", "validate": validate, "compile": compile},
    )


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters empty before the test, and emptied after it (compiled graphs hold memory)."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def train(tree: dict, run_dir, *, resume: bool = False) -> tuple[Trainer, list[float]]:
    """A Trainer fitted on recipe `tree`, and the loss of every batch it trained on."""
    reset_accelerate()
    trainer = Trainer(recipe_from_dict(tree), run_dir, resume=resume)
    losses, step = [], trainer.train_batch

    def recorded(batch):
        loss = step(batch)
        losses.append(loss.item())
        return loss

    trainer.train_batch = recorded
    trainer.fit()
    return trainer, losses


def weights(run_dir, which: str = "last") -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / which / "model.safetensors"))


def assert_same_state(actual, expected, **tolerance) -> None:
    """`actual` and `expected` (state dicts) hold the same keys and close values, compared on the CPU."""
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(
            actual[key].cpu(), value.cpu(), **tolerance, msg=lambda text, key=key: f"{key}: {text}"
        )


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_training_matches_eager_and_checkpoints_load_eagerly(tmp_path, caplog, monkeypatch):
    # `helpers.compile_backend`: AOTAutograd's graphs run without code generation, or inductor under
    # ZOO_TEST_INDUCTOR=1 (within the tolerances below). Performer's features are redrawn after steps 2 and 4,
    # into the buffer the compiled graph reads; blocks are checkpointed. SGD, whose update is linear in the
    # gradient: Adam's first steps move a weight by about the learning rate whatever its gradient's size, so a
    # gradient near 0 that rounds to the other sign moves it the other way.
    if compile_backend() != "inductor":
        monkeypatch.setattr(zoo.train.parts, "dynamo_plugin", _aot_traced)
    tree = tiny("performer", compile=True, steps=4, grad_checkpointing=True)
    tree["optim"] = {"name": "sgd", "lr": 0.05}
    eager, eager_losses = train({**tree, "train": {**tree["train"], "compile": False}}, tmp_path / "eager")
    with caplog.at_level(logging.INFO, logger="zoo.train.loop"):
        compiled, compiled_losses = train(tree, tmp_path / "compiled")
    assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
    assert not isinstance(eager.model, torch._dynamo.eval_frame.OptimizedModule)
    assert not counters["graph_break"], dict(counters["graph_break"])

    assert len(compiled_losses) == len(eager_losses) == 4
    torch.testing.assert_close(torch.tensor(compiled_losses), torch.tensor(eager_losses), rtol=1e-4, atol=1e-5)
    by_eager, by_compiled = weights(tmp_path / "eager"), weights(tmp_path / "compiled")
    # the keys of an eager run (no `_orig_mod.` prefix); the values as close as float32 sums taken in another order
    # allow (inductor's fused kernels reduce in their own order, on a GPU most)
    assert_same_state(by_compiled, by_eager, rtol=1e-3, atol=1e-4)
    # the redraws reached the modules through the compiled wrapper
    assert int(by_compiled["blocks.0.attn.step"]) == 4

    summary = json.loads((tmp_path / "compiled" / "train_summary.json").read_text())
    assert summary["compile"] == "default"
    assert summary["first_step_s"] > summary["step_s"] > 0 and summary["compile_s"] > 0
    assert json.loads((tmp_path / "eager" / "train_summary.json").read_text())["compile_s"] is None
    assert "first training step" in caplog.text and "compiling the model" in caplog.text

    # the checkpoint loads into an eager model as tools/eval.py loads it, with the trained weights
    assert_same_state(
        zoo.load_model(tmp_path / "compiled", checkpoint="last").state_dict(), by_compiled, rtol=0, atol=0
    )


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_compiled_run_evaluates_and_resumes_from_its_checkpoints(tmp_path, monkeypatch):
    # dynamo's eager backend: the model is wrapped and traced as under inductor, without generating code; the
    # validation split is evaluated through the compiled model and picks checkpoints/best
    monkeypatch.setattr(zoo.train.parts, "dynamo_plugin", _traced_only)
    tree = tiny("performer", compile=True, steps=2, validate=True)
    trainer, _ = train(tree, tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0 <= metrics["val_top1"] <= 1
    saved = weights(tmp_path / "run")
    for which in ("last", "best"):
        assert not [key for key in weights(tmp_path / "run", which) if "_orig_mod" in key]
    # the wrapper's state_dict is the plain model's, as replica checksums and the weights check read it
    assert trainer.model.state_dict().keys() == trainer.model._orig_mod.state_dict().keys()

    reset_accelerate()
    resumed = Trainer(recipe_from_dict(tree), tmp_path / "run", resume=True)
    with torch.no_grad():
        for p in resumed.model.parameters():
            p.zero_()
    resumed.restore()
    assert resumed.state.step == 2
    assert_same_state(resumed.model.state_dict(), saved, rtol=0, atol=0)


def _aot_traced(mode):
    """`zoo.train._compile.dynamo_plugin` with AOTAutograd's graphs run eagerly (no code generation); eager stays
    eager."""
    plugin = dynamo_plugin(mode)
    if mode:
        plugin.backend = DynamoBackend.AOT_EAGER
    return plugin


def _traced_only(mode):
    """`zoo.train._compile.dynamo_plugin` with dynamo's eager backend: graphs captured, run as they are."""
    plugin = dynamo_plugin(mode)
    plugin.backend = DynamoBackend.EAGER
    return plugin


@pytest.mark.parametrize(
    "attention, checkpointed",
    [("softmax", False), ("linear", False), ("performer", False), ("performer", True)],
    ids=["softmax", "linear", "performer", "performer-checkpointed"],
)
@pytest.mark.usefixtures("fresh_dynamo")
def test_the_compiled_step_has_no_graph_break_and_no_recompile(tmp_path, monkeypatch, attention, checkpointed):
    # what dynamo captures does not depend on the backend: the eager one skips code generation (seconds, not a
    # minute). Three steps: Performer redraws its features after the second, which must not recompile.
    monkeypatch.setattr(zoo.train.parts, "dynamo_plugin", _traced_only)
    train(tiny(attention, compile=True, steps=3, grad_checkpointing=checkpointed), tmp_path / "run")
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize(
    "value, expected", [("true", True), ("false", False), ("default", "default"), ("max-autotune", "max-autotune")]
)
def test_compile_takes_a_mode_from_the_command_line(tmp_path, value, expected):
    path = write_recipe(tmp_path / "tiny.yaml", tiny_vit_recipe())
    train_cfg = load_recipe(path, [f"train.compile={value}"]).train
    assert train_cfg.compile is expected if isinstance(expected, bool) else train_cfg.compile == expected
    assert train_cfg.compile_mode == {True: "default", False: None}.get(expected, expected)


@pytest.mark.parametrize("cuda, mode", [(False, None), (True, "default")], ids=["cpu", "gpu"])
def test_compile_cuda_compiles_only_where_the_run_has_a_gpu(monkeypatch, cuda, mode):
    """`train.compile: cuda` (`vit_linear_1024`'s): torch.compile's default mode on a CUDA machine, eager on a CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert recipe_from_dict(tiny_vit_recipe(train={"compile": "cuda"})).train.compile_mode == mode


ALLOWED = (
    "expected one of false, true, 'cuda', 'default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'"
)


@pytest.mark.parametrize("value, shown", [("fast", "'fast'"), (1, "1"), ("True", "'True'"), (None, "None")])
def test_a_bad_compile_value_names_the_key_and_the_modes(value, shown):
    with pytest.raises(RecipeError) as error:
        recipe_from_dict(tiny_vit_recipe(train={"compile": value}))
    assert str(error.value) == f"<dict>: train.compile: {ALLOWED}, got {shown}"


def test_a_bad_compile_value_on_the_command_line_is_one_line(tmp_path, monkeypatch, capsys):
    # tools/train.py as its command line runs it, in this process
    path = write_recipe(tmp_path / "tiny.yaml", tiny_vit_recipe())
    tool = runpy.run_path(str(ROOT / "tools" / "train.py"))
    argv = ["train.py", str(path), "--set", "train.compile=fastest", "--output", str(tmp_path / "run")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        run_cli(tool["main"])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: override 'train.compile=fastest': train.compile: {ALLOWED}, got 'fastest'"], stderr
