"""Builders shared by the test files, imported by name (`from helpers import tiny_vit_recipe`): the tiny recipes
that train in seconds on a CPU (and the inputs of the suite's torchrun launch, tests/distributed_launch.py), a fresh
accelerate state for the next run in the same process, and the command lines run in this interpreter
(`run_tool_here`, `sweep_runs_here`).

Fixtures live in conftest.py; these are plain functions because test files call them at import time and inside
their own helpers, and a conftest.py cannot be imported reliably (pytest loads one per folder under one name).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import runpy
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import timm
import torch
import yaml
from accelerate.test_utils.testing import AccelerateTestCase
from safetensors.torch import save_file

from zoo import cli

ROOT = Path(__file__).resolve().parents[1]


# Inductor's C++ build of a graph with its cache cold takes longer than the suite can give a test on a small CPU:
# the compiled-path tests run AOTAutograd's graphs (what inductor receives) on `aot_eager` unless
# ZOO_TEST_INDUCTOR=1 (a machine with cores to spare), which compiles them with inductor itself.
def compile_backend() -> str:
    """The backend of the suite's compiled-path tests: `inductor` under ZOO_TEST_INDUCTOR=1, else `aot_eager`."""
    return "inductor" if os.environ.get("ZOO_TEST_INDUCTOR") == "1" else "aot_eager"


def compiled_flex():
    """FlexAttention compiled on `compile_backend()`, for `zoo.attention._flex._compiled_flex` to return: Dynamo
    traces a pattern's mask into the graph either way; under `aot_eager` the graph runs FlexAttention's reference
    implementation, under inductor its fused CPU kernel."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False, backend=compile_backend())


# 32-px MegaMNIST canvases: two 12-px target digits, one other digit and one clutter patch
TINY_CANVAS = {"canvas_size": 32, "digit_size": 12, "num_target": 2, "num_other": 1, "num_clutter": 1}

_TINY_VIT = {
    "name": "tiny",
    "seed": 3,
    "model": {
        "name": "vit_tiny_patch16_224",
        "img_size": 32,
        "patch_size": 8,
        "embed_dim": 32,
        "depth": 1,
        "num_heads": 2,
        "attention": {"name": "performer", "options": {"nb_features": 16}},
    },
    "data": {
        "name": "megamnist",
        "options": TINY_CANVAS,
        "train_samples": 48,
        "val_samples": 16,
        "test_samples": 16,
        "batch_size": 8,
        "num_workers": 0,
    },
    "train": {"epochs": 1, "mixed_precision": "no"},
}

# the 1-D model every sequence test trains: one block, 16 wide, 2 heads
_TINY_SEQUENCE = {"kind": "sequence", "embed_dim": 16, "depth": 1, "num_heads": 2}


def with_sections(tree: dict, **sections) -> dict:
    """A copy of recipe `tree` where a keyword naming a mapping section (`model`, `data`, `train`, `optim`, ...)
    updates that section's top-level keys (`model={"attention": {"name": "linear"}}` replaces the attention) and
    any other sets the value (`name="x"`, `seed=5`)."""
    tree = copy.deepcopy(tree)
    for key, value in sections.items():
        both = isinstance(value, dict) and isinstance(tree.get(key), dict)
        tree[key] = {**tree[key], **value} if both else value
    return copy.deepcopy(tree)


def tiny_vit_recipe(**sections) -> dict:
    """A recipe tree that trains in seconds: a ViT of one block (width 32, 2 heads, 8-px patches, Performer with 16
    features) on 32-px MegaMNIST canvases (48 / 16 / 16 samples, batches of 8, no workers), one fp32 epoch, seed 3;
    `sections` change it as in `with_sections`. Every call returns a fresh copy."""
    return with_sections(_TINY_VIT, **sections)


def tiny_sequence_model(input: str | None = None, **keys) -> dict:
    """The `model` section of a tiny 1-D model (one block, width 16, 2 heads), reading `input` (`tokens`, `series`,
    `dna`; None: the recipe's default) and `keys` on top."""
    model = copy.deepcopy(_TINY_SEQUENCE)
    if input is not None:
        model["sequence"] = {"input": input}
    return {**model, **keys}


def tiny_sequence_recipe(name: str, data: dict, task: str, input: str, *, train: dict, **model) -> dict:
    """A recipe tree for the tiny 1-D model on `data` (batches of 4, no workers; its keys on top), for `task`
    (mse for a forecast, top-1 otherwise); `model` keys go into the model section."""
    return {
        "name": name,
        "task": task,
        "data": {"num_workers": 0, "batch_size": 4, **data},
        "model": tiny_sequence_model(input, **model),
        "train": train,
        "metrics": ["mse"] if task == "forecast" else ["top1"],
    }


def shrink_1d(max_steps: int) -> list[str]:
    """`--set` overrides that shrink a shipped 1-D recipe to seconds: the tiny 1-D model, `max_steps` fp32 steps
    of one epoch, no workers, one warm-up step."""
    return [
        f"model.embed_dim={_TINY_SEQUENCE['embed_dim']}",
        f"model.depth={_TINY_SEQUENCE['depth']}",
        f"model.num_heads={_TINY_SEQUENCE['num_heads']}",
        "data.num_workers=0",
        "train.epochs=1",
        f"train.max_steps={max_steps}",
        "train.mixed_precision=no",
        "schedule.warmup_steps=1",
    ]


def write_recipe(path: Path, tree: dict) -> Path:
    """`tree` written to `path` as YAML."""
    path.write_text(yaml.safe_dump(tree))
    return path


def fsdp_recipe_file(folder: Path, **train) -> Path:
    """tests/train/test_fsdp.py's recipe, written to `folder`/tiny_fsdp.yaml with `train` keys on top of its train
    section: ViTDet's layout in miniature, 2-D windows of 2 x 2 patches on the 4 x 4 grid, softmax in block 1; drop
    path, so that the activation checkpointing of the fsdp runs must replay the random masks to match ddp; a conv
    stem, whose BatchNorm statistics every process updates from its own batch (process 0's are kept under both
    strategies); seed 5, 32 training samples in batches of 4, Adam at 1e-3."""
    tree = tiny_vit_recipe(
        name="tiny_fsdp",
        seed=5,
        model={
            "stem": "conv",
            "depth": 2,
            "drop_path_rate": 0.1,
            "attention": {"name": "window2d", "options": {"window": 2}},
            "global_blocks": [1],
            "global_attention": {"name": "softmax"},
        },
        data={"train_samples": 32, "batch_size": 4},
        optim={"lr": 1e-3},
        # constant: the learning rate of a step does not depend on train.max_steps, which the resume raises
        schedule={"name": "constant"},
        # mixed precision `auto`: bf16 on a GPU that has it
        train={"log_every_steps": 1, "checkpoint_every_steps": 2, "mixed_precision": "auto", **train},
    )
    return write_recipe(folder / "tiny_fsdp.yaml", tree)


# the teacher of tests/convert: a timm ViT of 2 blocks, 32 wide, 2 heads, 8-px patches
TEACHER_SIZES = {"embed_dim": 32, "depth": 2, "num_heads": 2, "patch_size": 8}


def conversion_inputs(folder: Path) -> dict[str, Path]:
    """What tools/convert.py converts in the tests (tests/convert, the suite's torchrun launch), written to
    `folder`: `weights`, a random timm ViT (seed 0, TEACHER_SIZES, 32 px) saved with safetensors, as a user's timm
    checkpoint; `recipe`, the student's recipe (`tiny`, seed 1): that architecture with softmax attention on the tiny
    32-px MegaMNIST canvases (16 / 8 / 8 samples, one batch of 8); and `folder`."""
    torch.manual_seed(0)
    teacher = timm.create_model("vit_tiny_patch16_224", img_size=32, **TEACHER_SIZES)
    save_file(teacher.state_dict(), folder / "vit.safetensors")
    tree = tiny_vit_recipe(
        seed=1,
        model={**TEACHER_SIZES, "attention": {"name": "softmax"}},
        data={"train_samples": 16, "val_samples": 8, "test_samples": 8},
    )
    return {"weights": folder / "vit.safetensors", "recipe": write_recipe(folder / "tiny.yaml", tree), "folder": folder}


def reset_accelerate() -> None:
    """Forget accelerate's process-wide state (its `AcceleratorState`, `PartialState` and `GradientState`
    singletons), so that the next `Accelerator` in this process takes its own settings: what accelerate's own
    tests do between tests (`accelerate.test_utils.testing.AccelerateTestCase.tearDown`)."""
    AccelerateTestCase().tearDown()


def hide_cuda(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The rest of the test as on a machine without a GPU: `torch.cuda.is_available()` is False, so the Trainer,
    `evaluate` and accelerate take the CPU, and `mixed_precision: auto` full precision. For a test whose expected
    values are the CPU's (a replay that must give the same weights or metrics, an fp32 comparison at tight
    tolerances) when `make device-test` runs it where a GPU is visible. accelerate's state is forgotten now and
    after the test, so that neither this test's Accelerators nor the next test's keep the other device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reset_accelerate()
    request.addfinalizer(reset_accelerate)


def run_tool_here(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python ARGS` from `cwd` (a command line as a user runs it: its exit status and captured text output) in this
    process, for a test whose point is not the fresh process (it saves an interpreter's imports; the fresh processes are
    README's, launched by tests/test_docs.py, and the sweep tools' runs): `tools/<name>.py` runs as `__main__` with
    sys.argv, sys.path[0] and the working directory as `python` sets them; its stdout and stderr are captured, log
    records included (the root logger is left without handlers, so `run_cli`'s `logging.basicConfig` writes to the
    captured stderr); the status is its `SystemExit` (0 when it returns; an exception that escapes prints its traceback
    and gives 1, as the interpreter does). accelerate's state is reset before and after; sys.argv, sys.path, the working
    directory, the environment, logging and `zoo.cli`'s log file are restored."""
    script, *rest = map(str, args)
    out, err = io.StringIO(), io.StringIO()
    root, quiet = logging.getLogger(), logging.getLogger("accelerate")
    argv, path, where, environ = sys.argv, sys.path[:], os.getcwd(), dict(os.environ)
    handlers, levels, log_file = root.handlers[:], (root.level, quiet.level), cli._log_file
    root.handlers.clear()
    reset_accelerate()
    try:
        os.chdir(cwd)
        sys.argv = [script, *rest]
        sys.path.insert(0, str(Path(script).resolve().parent))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(script, run_name="__main__")
                status = 0
            except SystemExit as exit_:
                status = exit_.code
                # as the interpreter: a message rather than a number is printed, status 1
                if not isinstance(status, int | None):
                    print(status, file=sys.stderr)
                    status = 1
            except Exception:
                traceback.print_exc()
                status = 1
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(levels[0])
        quiet.setLevel(levels[1])
        cli._log_file = log_file
        sys.argv, sys.path[:] = argv, path
        os.chdir(where)
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
        reset_accelerate()
    return subprocess.CompletedProcess([sys.executable, *map(str, args)], status or 0, out.getvalue(), err.getvalue())


def sweep_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep tools' runs (`zoo_bench.leaderboard.run_child`: `python tools/train.py ... --test` in a fresh
    process each) through `run_tool_here` in this process, for a test of what a tool makes of its runs' own files
    rather than of the fresh process (tests/tools/test_leaderboard.py and README's leaderboard block launch those);
    each saves an interpreter's imports of torch, timm and zoo. The log holds the run's output; its peak memory reads
    0."""
    from zoo_bench import leaderboard

    def run_child(command: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> dict:
        assert command[0] == sys.executable and env is None, command
        start = time.perf_counter()
        result = run_tool_here(*command[1:], cwd=Path.cwd())
        Path(log).write_text(result.stdout + result.stderr)
        return {"returncode": result.returncode, "wall_s": round(time.perf_counter() - start, 2), "peak_rss_mib": 0.0}

    monkeypatch.setattr(leaderboard, "run_child", run_child)


def moved_off_init(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in eval mode with every floating-point weight and statistic moved by seeded noise, so that only
    weights read back from a file reproduce its outputs."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.05 * torch.randn(tensor.shape, generator=generator))
    return model.eval()
