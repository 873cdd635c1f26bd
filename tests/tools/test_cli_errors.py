"""The command-line wrapper: one line for every error a user can cause (exit 2), one line and a logged traceback for
a bug (exit 1), the traceback itself with --debug or ZOO_DEBUG=1; errors raised in DataLoader workers reported by
their own message; and the readable outputs (samples/s of slow steps, confusion matrices of non-ASCII classes)."""

import errno
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import run_tool_here, tiny_sequence_model
from PIL import Image
from torch.utils.data import DataLoader

from zoo import cli
from zoo.cli import log_to, run_cli
from zoo.data.images.folder import ImageFolderDataset
from zoo.evaluate import plot_confusion
from zoo.train._tracking import format_rate as _rate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_cli(monkeypatch):
    """No log file from an earlier test, no debug flag from the environment or pytest's own arguments."""
    monkeypatch.setattr(cli, "_log_file", None)
    monkeypatch.delenv("ZOO_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["tool"])


def exit_of(main, capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as info:
        run_cli(main)
    return info.value.code, capsys.readouterr().err.strip().splitlines()


def raise_(error: BaseException):
    def main():
        raise error

    return main


@pytest.mark.parametrize(
    "error, line",
    [
        (
            ValueError("recipe.yaml: train.epocs: unknown key\nmore detail"),
            "error: recipe.yaml: train.epocs: unknown key",
        ),
        (FileNotFoundError("weights x.safetensors do not exist"), "error: weights x.safetensors do not exist"),
        (OSError(errno.ENOSPC, "No space left on device", "runs/x"), "error: [Errno 28] No space left on device"),
        (ImportError("pip install sktime"), "error: pip install sktime"),
    ],
    ids=["value", "missing-file", "disk-full", "import"],
)
def test_user_errors_are_one_line_and_exit_2(capsys, tmp_path, error, line):
    log = log_to(tmp_path / "run" / "train.log")
    code, lines = exit_of(raise_(error), capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(line)
    # the traceback is kept in the run's log all the same
    assert "Traceback (most recent call last)" in log.read_text()


def test_a_bug_is_one_line_pointing_at_its_logged_traceback(capsys, tmp_path):
    log = log_to(tmp_path / "train.log")
    code, lines = exit_of(raise_(TypeError("unsupported operand")), capsys)
    assert code == 1 and len(lines) == 1
    assert (
        lines[0] == f"error: internal error, a bug in zoo (TypeError: unsupported operand); its traceback is in {log}"
    )
    assert "TypeError: unsupported operand" in log.read_text()


def test_without_a_run_dir_a_bug_s_traceback_goes_to_a_temporary_file(capsys):
    code, lines = exit_of(raise_(KeyError("model")), capsys)
    logged = Path(lines[0].rsplit("its traceback is in ", 1)[1])
    assert code == 1 and "Traceback" in logged.read_text()
    logged.unlink()


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_debug_prints_the_traceback(monkeypatch, how):
    if how == "flag":
        monkeypatch.setattr(sys, "argv", ["tool", "recipe.yaml", "--debug"])
    else:
        monkeypatch.setenv("ZOO_DEBUG", "1")
    with pytest.raises(ValueError, match="bad value"):
        run_cli(raise_(ValueError("bad value")))


def test_ctrl_c_is_interrupted_and_exit_130(capsys):
    assert exit_of(raise_(KeyboardInterrupt()), capsys) == (130, ["interrupted"])


def test_an_error_in_a_data_loader_worker_is_reported_by_its_own_message(tmp_path, capsys):
    folder = tmp_path / "train" / "cat"
    folder.mkdir(parents=True)
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / "cut.png")
    (folder / "cut.png").write_bytes((folder / "cut.png").read_bytes()[:100])
    dataset = ImageFolderDataset(tmp_path, "train", img_size=16, is_training=False)
    code, lines = exit_of(lambda: next(iter(DataLoader(dataset, num_workers=1))), capsys)
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(f"error: image {folder / 'cut.png'}: ") and "DataLoader worker" not in lines[0]
    # a class that torch cannot rebuild from the message comes back as RuntimeError: still the user's error
    wrapped = RuntimeError(
        "Caught ImageError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\nzoo.data.images.decode.ImageError: a.png: not an image file PIL can read\n'
    )
    assert exit_of(raise_(wrapped), capsys) == (2, ["error: a.png: not an image file PIL can read"])


def test_samples_per_second_keeps_three_digits_on_slow_steps():
    assert [_rate(r) for r in (0.0312, 0.5, 7.25, 234.4, 12345.6)] == ["0.0312", "0.5", "7.25", "234", "12346"]


def test_confusion_matrix_of_non_ascii_class_names(tmp_path):
    names = ["кошка", "σκύλος", "$\\frac$", "naïve", "猫"]
    with warnings.catch_warnings():
        # a glyph missing from the font would warn (and draw a box)
        warnings.simplefilter("error")
        plot_confusion(np.eye(5, dtype=int).tolist(), tmp_path / "c.png", names)
    assert Image.open(tmp_path / "c.png").size[0] > 100


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_tools_train_empty_recipe_and_patch_size(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    result = run_tool_here("tools/train.py", str(tmp_path / "empty.yaml"))
    assert result.returncode == 2 and one_error_line(result).endswith(
        "empty.yaml: empty recipe: the file holds no settings (nor a base: line)"
    )
    (tmp_path / "odd.yaml").write_text(yaml.safe_dump({"model": {"img_size": 30, "patch_size": 8}}))
    result = run_tool_here("tools/train.py", str(tmp_path / "odd.yaml"), "--output", str(tmp_path / "run"))
    assert result.returncode == 2
    assert (
        "odd.yaml: model.img_size: must be a multiple of the patch size 8 (model.patch_size), got 30: use 24 or "
        "32" in one_error_line(result)
    )


def test_tools_train_on_a_csv_with_a_missing_target_value(tmp_path):
    rows = [f"{i},{np.sin(i / 5):.4f}" for i in range(200)]
    rows[30] = "30,"
    (tmp_path / "load.csv").write_text("step,load\n" + "\n".join(rows) + "\n")
    recipe = {
        "task": "forecast",
        "model": tiny_sequence_model("series"),
        "data": {"name": "forecast_csv", "root": str(tmp_path / "load.csv"), "num_workers": 0},
        "metrics": ["mse"],
    }
    recipe["data"]["options"] = {"targets": ["load"], "lookback": 32, "horizon": 8}
    (tmp_path / "fc.yaml").write_text(yaml.safe_dump(recipe))
    result = run_tool_here("tools/train.py", str(tmp_path / "fc.yaml"), "--output", str(tmp_path / "run"))
    assert result.returncode == 2
    line = one_error_line(result)
    assert f"{tmp_path / 'load.csv'}' line 32, column 2 ('load'): missing value" in line
    assert "data.options.nan: mask or interpolate" in line
    assert "Traceback (most recent call last)" in (tmp_path / "run" / "train.log").read_text()
