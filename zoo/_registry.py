"""One registry for every axis that grows by name: attention variants, datasets, tasks and model kinds.

A registry maps a name to an entry (a class, a spec, a task object). A duplicate name raises; an unknown name raises
one line with the close matches and every known name; names are listed in the registry's one defined order::

    _ATTENTIONS = Registry("attention", order="name")
    _ATTENTIONS.register("softmax", SoftmaxAttention)
    _ATTENTIONS.get("sofmax")
    # ValueError: unknown attention 'sofmax' (did you mean 'softmax', 'softmax1'?); known: banded_conv, ...

A test that registers a throwaway entry wraps it in ``with registry.scope():`` (or monkeypatches the module's registry
with ``registry.copy()``) so it does not outlive the test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, Literal, TypeVar

from ._validate import did_you_mean

__all__ = ["Registry"]

T = TypeVar("T")
Order = Literal["registration", "name"]


def _owner(entry: object) -> str:
    """What registered `entry`, for the duplicate-name error: a class or function by its qualified name, an object
    by its type's."""
    qualname = getattr(entry, "__qualname__", None)
    return qualname if isinstance(qualname, str) else type(entry).__qualname__


class Registry(Generic[T]):
    """Entries by name.

    Args:
        what: the kind of entry, as errors name it (``"attention"``, ``"dataset"``, ``"model kind"``).
        order: how ``names()`` lists them (and the unknown-name error): ``"registration"`` (the import order of the
            package's ``__init__``, which lists its files explicitly) or ``"name"`` (sorted).
        owner: names what registered an entry in the duplicate-name error (default: its qualified name).
    """

    def __init__(self, what: str, *, order: Order = "registration", owner: Callable[[T], str] = _owner):
        if order not in ("registration", "name"):
            raise ValueError(f"registry order {order!r} is not one of 'registration', 'name'")
        self.what = what
        self.order = order
        self._owner = owner
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        """Add `entry` under `name` and return it; a name already taken raises ValueError naming its owner."""
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is already registered by {self._owner(self._entries[name])}")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove and return the entry `name` (a throwaway entry in a test); an unknown name raises."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def get(self, name: str) -> T:
        """The entry `name`; an unknown name raises a one-line ValueError with close matches and every known name."""
        if name not in self._entries:
            names = self.names()
            raise ValueError(f"unknown {self.what} {name!r}{did_you_mean(name, names)}; known: {', '.join(names)}")
        return self._entries[name]

    def names(self) -> list[str]:
        """Every registered name, in the registry's order."""
        return sorted(self._entries) if self.order == "name" else list(self._entries)

    def values(self) -> list[T]:
        """Every entry, in the order of ``names()``."""
        return [self._entries[name] for name in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {len(self)} entries)"

    def copy(self) -> Registry[T]:
        """A registry with the same settings and entries (for ``monkeypatch.setattr`` of a module's registry)."""
        copied = Registry(self.what, order=self.order, owner=self._owner)
        copied._entries.update(self._entries)
        return copied

    @contextlib.contextmanager
    def scope(self) -> Iterator[Registry[T]]:
        """Entries registered (or removed) inside the block are undone on exit: a test's throwaway entries."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)
