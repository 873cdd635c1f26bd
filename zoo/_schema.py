"""The recipe validator: builds dataclasses from plain YAML data, checking each value against its annotation.

Read annotations: scalars (`int`, `float`, `str`, `bool`), `Optional[X]`, `Literal[...]`, `list[X]`,
`dict[str, X]`, `Any` (plain YAML data) and nested dataclasses. Field metadata adds `min` / `max` (with
`min_exclusive` / `max_exclusive`), `length` and `unique` for lists, `choices` (a tuple, or a function returning
one, for a name checked against a registry), `schema_of` for a mapping checked against the dataclass that a
sibling field picks (`data.options` by `data.name`) and `options_of` for that dataclass's keys written flat beside
the section's own (a model kind's options by `model.kind`). A dataclass may define `problems()` returning
`(field, message)` pairs for checks across its fields. Every problem is one `RecipeError` naming the key path.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Mapping
from dataclasses import field
from datetime import date
from typing import Any, Literal, Union

from ._validate import did_you_mean

__all__ = ["RecipeError", "bounded", "build", "check", "join", "show", "unit_interval", "unknown_key"]


class RecipeError(ValueError):
    """A recipe problem, as one line: ``<source>: <key.path>: <problem>``."""

    def __init__(self, problem: str, *, source: str | None = None, key: str | None = None):
        self.problem, self.source, self.key = problem, source, key
        super().__init__(": ".join(part for part in (source, key, problem) if part))


def bounded(default: Any, **bounds: Any) -> Any:
    """A dataclass field with range constraints (``min``, ``max``, ``min_exclusive``, ``max_exclusive``)."""
    return field(default=default, metadata=bounds)


def unit_interval(default: float) -> Any:
    return bounded(default, min=0, max=1, max_exclusive=True)


def join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


_SCALAR_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLAIN_SCALARS = (type(None), bool, int, float, str, date)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def build(cls: type, value: Any, key: str) -> Any:
    """An instance of dataclass ``cls`` from the mapping ``value`` at key path ``key``, every value checked."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise RecipeError(f"expected a mapping, got {show(value)}", key=key or None)
    flat = next((f for f in dataclasses.fields(cls) if "options_of" in f.metadata), None)
    names = [name for name in _field_names(cls) if flat is None or name != flat.name]
    for name in value:
        if name not in names and flat is None:
            raise RecipeError(unknown_key(name, names), key=join(key, name))
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f is flat:
            picker = f.metadata["options_of"][0]
            kwargs[f.name] = _flat_options(f, value, names, kwargs.get(picker, getattr(cls, picker)), key)
        elif "schema_of" in f.metadata:
            # checked even when left out: the schema may require keys
            picker, schema_for = f.metadata["schema_of"]
            schema = schema_for(kwargs.get(picker, getattr(cls, picker)))
            kwargs[f.name] = _check_options(schema, value.get(f.name), join(key, f.name))
        elif f.name in value:
            kwargs[f.name] = check(value[f.name], _hints(cls)[f.name], f.metadata, join(key, f.name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecipeError("missing required key", key=join(key, f.name))
    obj = cls(**kwargs)
    for name, problem in getattr(obj, "problems", list)():
        raise RecipeError(problem, key=join(key, name))
    return obj


def _field_names(cls: type) -> list[str]:
    """The dataclass's field names, its own before those it inherits: an error lists the keys a section is about
    first (a series dataset's own options before the augmentation options every series dataset takes)."""
    own = inspect.get_annotations(cls)
    return sorted((f.name for f in dataclasses.fields(cls)), key=lambda name: name not in own)


def _flat_options(f: dataclasses.Field, value: Mapping, names: list[str], picked: Any, key: str) -> Any:
    """The options dataclass that the sibling field picks (``model.kind``), built from the keys of ``value`` that
    are not the section's own (``names``). A key of another choice's dataclass is taken only at its default there
    (a resolved recipe lists every key); any other key is unknown."""
    picker, schema_for, every_schema = f.metadata["options_of"]
    schema = schema_for(picked)
    allowed = _field_names(schema)
    elsewhere = {
        g.name: (owner, other)
        for owner, other in every_schema().items()
        if owner != picked
        for g in dataclasses.fields(other)
    }
    own = {}
    for name, item in value.items():
        if name in names:
            continue
        if name in allowed:
            own[name] = item
        elif name in elsewhere:
            owner, other = elsewhere[name]
            if getattr(build(other, {name: item}, key), name) != getattr(other(), name):
                by = join(key, picker)
                problem = f"an option of {by} {owner!r}, unused by {by} {picked!r}; leave it out"
                raise RecipeError(f"{problem}, got {show(item)}", key=join(key, name))
        else:
            raise RecipeError(unknown_key(name, names + allowed), key=join(key, name))
    return build(schema, own, key)


def _check_options(schema: type, value: Any, key: str) -> dict[str, Any]:
    """The keys ``value`` sets, checked as the dataclass ``schema`` (its defaults fill the rest for the checks
    across fields, but are not stored: a left-out option keeps the schema's default)."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise _expected("a mapping", value, key, False)
    checked = build(schema, value, key)
    return {name: getattr(checked, name) for name in value}


def unknown_key(name: Any, names: list[str], what: str = "key") -> str:
    if not names:
        return f"unknown {what}; this section takes none"
    return f"unknown {what}{did_you_mean(name, names, n=1)}; allowed: {', '.join(names)}"


def check(value: Any, tp: Any, meta: Mapping, key: str, nullable: bool = False) -> Any:
    """``value`` checked against the annotation ``tp`` (and range ``meta``), converted where allowed."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [arg for arg in args if arg is not type(None)]
        if len(inner) != 1 or len(args) != 2:
            raise TypeError(f"unsupported annotation {tp!r}: only Optional[X] unions")
        return None if value is None else check(value, inner[0], meta, key, nullable=True)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin is Literal:
        return _check_choice(value, args, key, nullable)
    if origin is list:
        return _check_list(value, args[0], meta, key, nullable)
    if origin is dict:
        return _check_dict(value, args, key, nullable)
    if tp is Any:
        return _plain(value, key)
    if tp in _SCALAR_NAMES and "choices" in meta:
        choices = meta["choices"]
        return _check_choice(value, tuple(choices() if callable(choices) else choices), key, nullable)
    if tp in _SCALAR_NAMES:
        return _check_scalar(value, tp, meta, key, nullable)
    raise TypeError(f"unsupported annotation {tp!r}")


def _expected(what: str, value: Any, key: str, nullable: bool) -> RecipeError:
    return RecipeError(f"expected {what}{' or null' if nullable else ''}, got {show(value)}", key=key)


def _check_scalar(value: Any, tp: type, meta: Mapping, key: str, nullable: bool) -> Any:
    # a float field takes an integer too (converted); bool is never taken as a number
    allowed = (int, float) if tp is float else tp
    if not isinstance(value, allowed) or (isinstance(value, bool) and tp is not bool):
        raise _expected(_SCALAR_NAMES[tp], value, key, nullable)
    if tp in (int, float) and not _in_range(value, meta):
        raise _expected(f"{_SCALAR_NAMES[tp]} {_range_text(meta)}", value, key, nullable)
    if tp is float:
        try:
            return float(value)
        except OverflowError:
            raise _expected("a number that fits a float", value, key, nullable) from None
    return value


def _in_range(value: float, meta: Mapping) -> bool:
    # written as `not (value >= low)` so that NaN is out of every range
    if "min" in meta and not (value > meta["min"] if meta.get("min_exclusive") else value >= meta["min"]):
        return False
    return "max" not in meta or bool(value < meta["max"] if meta.get("max_exclusive") else value <= meta["max"])


def _range_text(meta: Mapping) -> str:
    low, high = meta.get("min"), meta.get("max")
    if low is not None and high is not None:
        left = "(" if meta.get("min_exclusive") else "["
        right = ")" if meta.get("max_exclusive") else "]"
        return f"in {left}{low}, {high}{right}"
    if low is not None:
        return f"{'>' if meta.get('min_exclusive') else '>='} {low}"
    if high is not None:
        return f"{'<' if meta.get('max_exclusive') else '<='} {high}"
    return ""


def _check_choice(value: Any, choices: tuple, key: str, nullable: bool) -> Any:
    if any(type(value) is type(choice) and value == choice for choice in choices):
        return value
    # a boolean choice as YAML writes it
    named = (str(choice).lower() if isinstance(choice, bool) else repr(choice) for choice in choices)
    raise _expected(f"one of {', '.join(named)}", value, key, nullable)


def _check_list(value: Any, item_tp: Any, meta: Mapping, key: str, nullable: bool) -> list:
    length = meta.get("length")
    if not isinstance(value, (list, tuple)) or (length is not None and len(value) != length):
        raise _expected("a list" if length is None else f"a list of length {length}", value, key, nullable)
    items = [check(item, item_tp, meta, f"{key}[{i}]") for i, item in enumerate(value)]
    if meta.get("unique"):
        for i, item in enumerate(items):
            if item in items[:i]:
                raise RecipeError(f"duplicate entry {show(item)}", key=f"{key}[{i}]")
    return items


def _check_dict(value: Any, args: tuple, key: str, nullable: bool) -> dict:
    if not isinstance(value, Mapping):
        raise _expected("a mapping", value, key, nullable)
    key_tp, value_tp = args
    result = {}
    for name, item in value.items():
        if not isinstance(name, key_tp):
            raise RecipeError(f"expected {_SCALAR_NAMES[key_tp]} as key, got {show(name)}", key=key)
        result[name] = check(item, value_tp, {}, join(key, name))
    return result


def _plain(value: Any, key: str) -> Any:
    """A copy of ``value`` if it is plain YAML data (scalars, lists, mappings), else an error."""
    if isinstance(value, _PLAIN_SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{key}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        for name in value:
            if not isinstance(name, _PLAIN_SCALARS):
                raise RecipeError(f"expected a string or number as key, got {show(name)}", key=key)
        return {name: _plain(item, join(key, name)) for name, item in value.items()}
    raise _expected("plain YAML data (null, true/false, number, string, list or mapping)", value, key, False)
