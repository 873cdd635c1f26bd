"""Checks shared by every layer: one did-you-mean and one integer validator for the whole package."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["check_bool", "check_int", "did_you_mean", "first_line", "unknown_name"]


def did_you_mean(name: object, choices: Iterable[object], n: int = 3) -> str:
    """`" (did you mean 'a', 'b'?)"` for the close matches of `name` among `choices`, or `""`."""
    close = difflib.get_close_matches(str(name), [str(choice) for choice in choices], n=n)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


def unknown_name(kind: str, name: object, choices: Iterable[object]) -> ValueError:
    """The error for an unknown registry name: the bad value, close matches and every known name."""
    choices = sorted(str(choice) for choice in choices)
    return ValueError(f"unknown {kind} {name!r}{did_you_mean(name, choices)}; known: {', '.join(choices)}")


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int within [minimum, maximum]; a bool, float or string is refused by name."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be an integer{_range(minimum, maximum)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name}={value!r} must be an integer{_range(minimum, maximum)}")
    return value


def check_bool(name: str, value: object) -> bool:
    """`value` if it is True or False; anything else (0, 1, "yes") is refused by name."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")
    return value


def _range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in {minimum}..{maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    return f" <= {maximum}" if maximum is not None else ""


def first_line(error: BaseException, default: str | None = None) -> str:
    """The first line of `error`'s message: what a one-line error quotes of an error it wraps. An empty message
    gives `default`, else the error's type name."""
    text = str(error).strip()
    if text:
        return text.splitlines()[0]
    return type(error).__name__ if default is None else default
