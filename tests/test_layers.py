"""The package's folders are its layers: every import in zoo/ (at module level or inside a function; not those
under `if TYPE_CHECKING:`) goes down the list below or stays inside its own layer, and no modules import each other
in a cycle. A new module belongs to the layer of its folder; a new folder is added to `LAYERS` where it sits.

The tools' packages (`tools/zoo_bench`, the library of the commands, and `tools/dev`, the development tools above it)
are held to the same: no import cycle among their modules, and `zoo_bench` never imports `dev`."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# lowest first; a module may import its own layer and any below it
LAYERS = (
    ("zoo._validate", "zoo._registry", "zoo._schema", "zoo._weights"),
    ("zoo.attention",),
    ("zoo.data",),
    ("zoo.tasks",),
    ("zoo.models",),
    ("zoo.kinds",),
    ("zoo.config", "zoo.splits"),
    ("zoo.hub",),
    ("zoo.train",),
    ("zoo.evaluate", "zoo.predict", "zoo.convert"),
    ("zoo.cli", "zoo"),
)


def _module(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _prefixes(module: str) -> list[str]:
    """The entries of `LAYERS` that hold `module`: itself, or a package above it; `zoo` holds only its own
    `__init__` (a prefix of every module, it would give a new top-level folder the top layer unnoticed)."""
    return [
        prefix
        for layer in LAYERS
        for prefix in layer
        if module == prefix or (prefix != "zoo" and module.startswith(prefix + "."))
    ]


def _layer(module: str) -> int:
    best = max(_prefixes(module), key=len)
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def unlayered(modules) -> list[str]:
    """The modules of `modules` that no entry of `LAYERS` holds."""
    return [module for module in sorted(modules) if not _prefixes(module)]


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _imports(path: Path, modules: set[str], root: Path = ROOT, packages: tuple[str, ...] = ("zoo",)) -> set[str]:
    """The modules of `packages` that `path` imports (a name imported from a package counts as its submodule when it
    is one)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = _module(path, root) if path.name == "__init__.py" else _module(path, root).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] in packages)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] not in packages:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return found


@cache  # parsed when a test first asks (every file of zoo/), not at collection in every xdist worker
def _graph() -> dict[str, set[str]]:
    paths = {_module(p): p for p in (ROOT / "zoo").rglob("*.py")}
    return {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}


# the tools' packages, lowest first: `tools/<package>/`
TOOL_PACKAGES = ("zoo_bench", "dev")


@cache
def _tools_graph() -> dict[str, set[str]]:
    tools = ROOT / "tools"
    paths = {_module(p, tools): p for package in TOOL_PACKAGES for p in (tools / package).rglob("*.py")}
    return {name: _imports(path, set(paths), tools, TOOL_PACKAGES) - {name} for name, path in paths.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`module -> target` for every import of a higher layer."""
    return [f"{m} -> {t}" for m in sorted(graph) for t in sorted(graph[m]) if _layer(t) > _layer(m)]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as `[a, b, ..., a]`, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if not state.get(target) and (cycle := visit(target)):
                return cycle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if not state.get(name) and (cycle := visit(name)):
            return cycle
    return None


def test_imports_only_go_down():
    upward = upward_imports(_graph())
    assert not upward, "a lower layer imports a higher one:\n" + "\n".join(upward)


def test_no_import_cycles():
    assert find_cycle(_graph()) is None, "import cycle: " + " -> ".join(find_cycle(_graph()) or [])


def test_the_tools_packages_have_no_import_cycle():
    graph = _tools_graph()
    assert {"zoo_bench.cards", "dev.kernel_profile"} <= set(graph)
    assert find_cycle(graph) is None, "import cycle: " + " -> ".join(find_cycle(graph) or [])


def test_the_tools_library_never_imports_the_development_tools():
    upward = [f"{m} -> {t}" for m in sorted(_tools_graph()) if m.startswith("zoo_bench") for t in _tools_graph()[m]]
    upward = [line for line in upward if line.split(" -> ")[1].startswith("dev")]
    assert not upward, "zoo_bench imports tools/dev:\n" + "\n".join(upward)


def test_the_tools_graph_sees_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / "zoo_bench"
    package.mkdir()
    (package / "a.py").write_text("from .b import x\n")
    (package / "b.py").write_text("def f():\n    from .a import y\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import z\n")
    modules = {"zoo_bench.a", "zoo_bench.b", "zoo_bench.c"}
    graph = {m: _imports(package / f"{m[-1]}.py", modules, tmp_path, TOOL_PACKAGES) for m in sorted(modules)}
    assert graph == {"zoo_bench.a": {"zoo_bench.b"}, "zoo_bench.b": {"zoo_bench.a"}, "zoo_bench.c": set()}
    assert find_cycle(graph) == ["zoo_bench.a", "zoo_bench.b", "zoo_bench.a"]


def test_every_module_has_a_layer():
    assert not unlayered(_graph()), f"modules of no layer (add their folder to LAYERS): {unlayered(_graph())}"


def test_a_new_top_level_folder_has_no_layer_until_listed():
    modules = {"zoo", "zoo.cli", "zoo.models.vit", "zoo.train.loop", "zoo.newfolder", "zoo.newfolder.part"}
    assert unlayered(modules) == ["zoo.newfolder", "zoo.newfolder.part"]
    assert [_layer(m) for m in ("zoo._validate", "zoo.models.vit", "zoo.cli", "zoo")] == [0, 4, 10, 10]


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    graph = {"zoo.attention.local": {"zoo.train.loop"}, "zoo.train.loop": {"zoo.attention.local"}}
    assert upward_imports(graph) == ["zoo.attention.local -> zoo.train.loop"]
    assert find_cycle(graph) == ["zoo.attention.local", "zoo.train.loop", "zoo.attention.local"]
    module = tmp_path / "zoo" / "models" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..train import loop\n"
        "def f():\n    from ..data import x\n"
    )
    assert _imports(module, {"zoo.data.x"}, root=tmp_path) == {"zoo.data.x"}
