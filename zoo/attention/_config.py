"""A recipe's attention section (`model.attention`, and a layout's or a kind's own, e.g. `global_attention`): a
registered variant's name and its keyword options, each option checked against its annotation in the variant's
constructor. Ranges are checked when the model is built."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from .._schema import RecipeError, check, unknown_key
from ._registry import attention_options, get_attention

__all__ = ["AttentionConfig"]


@dataclass
class AttentionConfig:
    name: str = "softmax"
    # the variant's keyword options (zoo.attention.attention_options), each checked against its annotation here;
    # ranges are checked when the model is built
    options: dict[str, Any] = field(default_factory=dict)

    def problems(self) -> list[tuple[str, str]]:
        try:
            variant = get_attention(self.name)
        except ValueError as error:  # the registry's own message: did-you-mean and the known names
            return [("name", str(error))]
        allowed = attention_options(self.name)
        hints = typing.get_type_hints(variant.__init__)
        for key, value in self.options.items():
            if key not in allowed:
                return [(f"options.{key}", unknown_key(key, list(allowed), f"option of {self.name!r}"))]
            try:
                check(value, hints.get(key, Any), {}, "")
            except RecipeError as error:
                return [(f"options.{key}", error.problem)]
            except TypeError:
                pass  # an annotation this checker does not read (Sequence[int]): the constructor checks the value
        return []
