"""Where a measurement ran: the device's name, its results folder (`benchmarks/<slug>`), package versions, and
paths as a committed report shows them."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from zoo import __version__

__all__ = ["REPO_ROOT", "default_device", "device_name", "device_slug", "shown_path", "versions"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def shown_path(path: Path, root: Path = REPO_ROOT) -> str:
    """`path` relative to `root` where it lies below it: committed reports name no home folder."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.cache
def device_name(device: str) -> str:
    """The GPU's name, or the CPU model."""
    if device == "cuda":
        # asked in a child: a CUDA context in the sweep's process would hold GPU memory the configurations need
        code = "import torch; print(torch.cuda.get_device_name())"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def device_slug(device: str) -> str:
    """The results folder: `cpu`, or the GPU's name as a slug (`nvidia-h100-80gb-hbm3`)."""
    return "cpu" if device == "cpu" else re.sub(r"[^a-z0-9]+", "-", device_name(device).lower()).strip("-")


def versions(packages: Iterable[str] = ()) -> dict[str, str | None]:
    """Python, torch and zoo, then timm, einops, numpy and `packages`: their installed versions (None: absent)."""
    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "zoo": __version__,
    }
    for package in ["timm", "einops", "numpy", *packages]:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found
