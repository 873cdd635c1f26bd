"""Reading recipe files: YAML 1.2 scalars, duplicate keys refused, ``base:`` layers merged in order, ``KEY=VALUE``
overrides, and the source (file or override) of every key path, for errors that name it.

Rules a copied recipe survives: a relative ``base:`` not found beside the file is looked up in the project's
``recipes/`` (with a warning naming the file used); a layer that changes ``data.name``, ``model.attention.name`` or
``model.kind`` starts that section's options from empty (the base's options belong to the base's choice); an explicit
``{}`` empties a section (null keeps it)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .._schema import RecipeError, join, show

__all__ = ["PROJECT_RECIPES", "Dumper", "apply_override", "layers", "merge", "parse_yaml", "source_of"]

_logger = logging.getLogger(__name__)

# the shipped recipes: where a copied recipe's relative `base:` is found when it is not beside the copy
PROJECT_RECIPES = Path(__file__).resolve().parents[2] / "recipes"


# YAML 1.2 booleans and floats: `no` stays a string, `1e-3` is a float.
_BOOL_TAG, _FLOAT_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and floats that rejects duplicate keys."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, Hashable) and key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, _BOOL_RE, list("tTfF"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


class Dumper(yaml.SafeDumper):
    """SafeDumper that also quotes strings a YAML 1.2 reader would take for floats (`'1e5'`)."""


Dumper.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = " ".join(str(part) for part in (err.context, err.problem) if part)
        raise RecipeError(f"invalid YAML: {problem}", source=source, key=where) from None
    except yaml.YAMLError as err:
        raise RecipeError(f"invalid YAML: {' '.join(str(err).split())}", source=source) from None


def _read_mapping(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError("file not found", source=str(path)) from None
    except UnicodeDecodeError:
        raise RecipeError("not a UTF-8 text file", source=str(path)) from None
    except OSError as err:
        raise RecipeError(f"cannot read: {err.strerror}", source=str(path)) from None
    data = parse_yaml(text, str(path))
    if data is None:
        # an empty file (or comments only) is not "every default": likely a file cut short or the wrong path
        raise RecipeError("empty recipe: the file holds no settings (nor a base: line)", source=str(path))
    if not isinstance(data, dict):
        raise RecipeError(f"expected a mapping at the top level, got {type(data).__name__}", source=str(path))
    return data


def _base_paths(value: Any, path: Path) -> list[Path]:
    entries = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(entries, list):
        raise RecipeError(f"expected a path or a list of paths, got {show(value)}", source=str(path), key="base")
    bases = []
    for i, entry in enumerate(entries):
        key = "base" if isinstance(value, str) else f"base[{i}]"
        if not isinstance(entry, str) or not entry:
            raise RecipeError(f"expected a path, got {show(entry)}", source=str(path), key=key)
        base = Path(entry).expanduser()
        bases.append(base if base.is_absolute() else _relative_base(base, path))
    return bases


def _relative_base(base: Path, path: Path) -> Path:
    """`base` beside `path`, else the project's (a recipe copied out of recipes/ keeps working, with a warning)."""
    beside = path.parent / base
    shipped = PROJECT_RECIPES / base
    if beside.exists() or not shipped.is_file():
        return beside
    _logger.warning("%s: base %s is not beside it: using the project's %s", path, base, shipped)
    return shipped


def layers(path: Path, chain: tuple[Path, ...] = ()) -> list[tuple[str, dict]]:
    """``(source, mapping)`` for the file and its bases, in merge order (bases first)."""
    data = _read_mapping(path)
    chain = (*chain, path)
    found = []
    for base in _base_paths(data.pop("base", None), path):
        if any(base.resolve() == seen.resolve() for seen in chain):
            cycle = " -> ".join(str(p) for p in (*chain, base))
            raise RecipeError(f"cycle of bases: {cycle}", source=str(path), key="base")
        if not base.exists():
            raise RecipeError(f"file not found: {base}", source=str(path), key="base")
        found += layers(base, chain)
    found.append((str(path), data))
    return found


# section -> the key that picks what its options mean; a layer that changes that key drops the base's options
_SWITCHES = {"data": "name", "model.attention": "name", "model": "kind"}


def _shared_model_keys() -> set[str]:
    from ._config import ModelConfig

    return {f.name for f in dataclasses.fields(ModelConfig)} - {"options"}


def _default_choice(path: str) -> Any:
    """The name or kind a section has when no layer sets it (the dataclasses' defaults)."""
    from ..attention._config import AttentionConfig
    from ._config import DataConfig, ModelConfig

    section = {"data": DataConfig, "model.attention": AttentionConfig, "model": ModelConfig}[path]
    return next(f.default for f in dataclasses.fields(section) if f.name == _SWITCHES[path])


def _switch(dst: dict, src: Mapping, path: str, origins: dict[str, str]) -> None:
    """Drop `dst`'s options when `src` changes the section's name or kind (`_SWITCHES`), and their origins."""
    key = _SWITCHES.get(path)
    if key is None or key not in src or not dst or src[key] == dst.get(key, _default_choice(path)):
        return
    # model.kind's options are flat in `model`: every key but the shared ones
    dropped = [k for k in dst if k not in _shared_model_keys()] if path == "model" else ["options"]
    for name in dropped:
        dst.pop(name, None)
        inner = join(path, name)
        for origin in [o for o in origins if o == inner or o.startswith((inner + ".", inner + "["))]:
            del origins[origin]


def merge(dst: dict, src: Mapping, source: str, origins: dict[str, str], prefix: str = "") -> None:
    """Deep-merge ``src`` into ``dst``, recording which source set each key path.

    An empty section (``model:`` with nothing under it, i.e. null) over a mapping keeps the mapping; an explicit
    ``{}`` empties it. A section whose name or kind ``src`` changes (``_SWITCHES``) starts its options from empty.
    """
    _switch(dst, src, prefix, origins)
    for key, value in src.items():
        path = join(prefix, key)
        old = dst.get(key)
        if isinstance(old, dict) and (value is None or (isinstance(value, Mapping) and value)):
            merge(old, value or {}, source, origins, path)
        else:
            dst[key] = copy.deepcopy(value)
            origins[path] = source


def apply_override(tree: dict, item: str, origins: dict[str, str]) -> None:
    source = f"override {item!r}"
    key, sep, text = item.partition("=")
    parts = [part.strip() for part in key.split(".")]
    if not sep or not all(parts):
        raise RecipeError("expected KEY.PATH=VALUE, e.g. train.epochs=3", source=source)
    value = parse_yaml(text, source)
    node, path = tree, ""
    for part in parts[:-1]:
        path = join(path, part)
        if not isinstance(node.get(part), dict):
            node[part] = {}
            origins[path] = source
        node = node[part]
    node[parts[-1]] = value
    origins[join(path, parts[-1])] = source


def source_of(key: str | None, origins: Mapping[str, str], default: str) -> str:
    """The source that set the longest key path containing ``key``."""
    best, source = -1, default
    for path, origin in origins.items():
        inside = key == path or (key or "").startswith((path + ".", path + "["))
        if inside and len(path) > best:
            best, source = len(path), origin
    return source
