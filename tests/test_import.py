"""`import zoo` stays light: no benchmark code (tools/zoo_bench) and no matplotlib, checked in a fresh interpreter."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code`, one per line."""
    script = f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_import_zoo_loads_neither_the_benchmark_nor_matplotlib():
    modules = _loaded_after("import zoo")
    assert "zoo" in modules and "zoo_bench" not in modules
    assert not [m for m in modules if m.split(".")[0] == "matplotlib"]
    # torch itself loads torch.utils.throughput_benchmark; no other module may carry "bench" in its name
    assert not [m for m in modules if "bench" in m and m.split(".")[0] != "torch"]


def test_no_zoo_module_imports_matplotlib_at_top_level():
    # plots import matplotlib inside the function that draws them (read from the source: torchmetrics, which
    # zoo.tasks.metrics imports, loads matplotlib by itself whenever it is installed)
    top_level = []
    for path in sorted((ROOT / "zoo").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            top_level += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] == "matplotlib"]
    assert top_level == []
