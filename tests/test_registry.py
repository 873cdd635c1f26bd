"""zoo._registry.Registry: the one registry behind attention variants, datasets, tasks and model kinds."""

import pytest

from zoo._registry import Registry


class First:
    pass


def test_names_come_in_the_registry_order():
    by_registration = Registry("widget")
    by_name = Registry("widget", order="name")
    for name in ("beta", "alpha", "gamma"):
        by_registration.register(name, First)
        by_name.register(name, First)
    assert by_registration.names() == list(by_registration) == ["beta", "alpha", "gamma"]
    assert by_name.names() == list(by_name) == ["alpha", "beta", "gamma"]
    assert "alpha" in by_name and "delta" not in by_name and len(by_name) == 3
    with pytest.raises(ValueError, match="registry order 'random' is not one of 'registration', 'name'"):
        Registry("widget", order="random")


def test_a_duplicate_name_raises_naming_its_owner():
    registry = Registry("widget")
    assert registry.register("a", First) is First
    with pytest.raises(ValueError, match="^widget 'a' is already registered by First$"):
        registry.register("a", object())
    specs = Registry("widget", owner=lambda entry: f"spec {entry}")
    specs.register("a", 1)
    with pytest.raises(ValueError, match="^widget 'a' is already registered by spec 1$"):
        specs.register("a", 2)


def test_an_unknown_name_raises_one_line_with_close_matches_and_every_name():
    registry = Registry("widget")
    for name in ("softmax", "softmax1", "linear"):
        registry.register(name, name.upper())
    assert registry.get("linear") == "LINEAR"
    with pytest.raises(ValueError) as error:
        registry.get("sofmax")
    assert str(error.value) == (
        "unknown widget 'sofmax' (did you mean 'softmax', 'softmax1'?); known: softmax, softmax1, linear"
    )
    with pytest.raises(ValueError, match=r"^unknown widget 'zzz'; known: softmax, softmax1, linear$"):
        registry.get("zzz")


def test_throwaway_entries_do_not_outlive_their_scope():
    registry = Registry("widget")
    registry.register("kept", 1)
    with registry.scope():
        registry.register("throwaway", 2)
        assert registry.unregister("kept") == 1
        assert registry.names() == ["throwaway"]
    assert registry.names() == ["kept"]
    copied = registry.copy()
    copied.register("only_in_copy", 3)
    assert registry.names() == ["kept"] and copied.names() == ["kept", "only_in_copy"]
    with pytest.raises(ValueError, match="unknown widget 'gone'"):
        registry.unregister("gone")
