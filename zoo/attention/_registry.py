"""Attention registry: every variant registers its class under one name.

`create_attention(name, dim, num_heads, **options)` builds a module; `attention_class(name, **options)` returns a
class with the options bound, for timm's `attn_layer` slot (which must be a class, not a partial).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from .._registry import Registry
from .._validate import did_you_mean
from ._common import AttentionBase

__all__ = [
    "attention_class",
    "attention_options",
    "auxiliary_loss",
    "create_attention",
    "get_attention",
    "list_attentions",
    "on_optimizer_step",
    "register_attention",
]

# listed by name: the cards, leaderboards and sweeps read variants in this order
_ATTENTIONS: Registry[type[nn.Module]] = Registry("attention", order="name")


def register_attention(name: str):
    """Class decorator: register an attention variant under `name` (a duplicate name raises)."""

    def decorator(cls: type[nn.Module]) -> type[nn.Module]:
        _ATTENTIONS.register(name, cls)
        cls.attention_name = name
        return cls

    return decorator


def list_attentions() -> list[str]:
    """Registered variant names, sorted."""
    return _ATTENTIONS.names()


def get_attention(name: str) -> type[nn.Module]:
    return _ATTENTIONS.get(name)


def attention_options(name: str) -> dict[str, Any]:
    """The variant's own keyword-only options and their defaults."""
    params = inspect.signature(get_attention(name).__init__).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _check_options(name: str, options: dict[str, Any]) -> None:
    allowed = attention_options(name)
    for key in options:
        if key not in allowed:
            listed = ", ".join(allowed) or "none"
            hint = did_you_mean(key, allowed, n=1)
            raise ValueError(f"attention {name!r} has no option {key!r}{hint}; its options: {listed}")


def attention_class(name: str, **options: Any) -> type[nn.Module]:
    """A subclass of variant `name` whose constructor has `options` bound, usable as timm's `attn_layer`."""
    cls = get_attention(name)
    _check_options(name, options)
    if not options:
        return cls
    bound = dict(options)

    def __init__(self, *args, **kwargs):
        cls.__init__(self, *args, **{**bound, **kwargs})

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__, "bound_options": bound})


def create_attention(name: str, dim: int, num_heads: int = 8, **options: Any) -> nn.Module:
    """Build variant `name`. `options` mixes timm's shared arguments (qkv_bias, qk_norm, ...) and its own."""
    cls = get_attention(name)
    shared = {k: v for k, v in options.items() if k in _TIMM_ARGS}
    own = {k: v for k, v in options.items() if k not in _TIMM_ARGS}
    _check_options(name, own)
    return cls(dim, num_heads=num_heads, **shared, **own)


def on_optimizer_step(model: nn.Module) -> None:
    """Tell every attention module that an optimizer step happened (e.g. Performer feature redraws)."""
    for module in model.modules():
        hook = getattr(module, "on_optimizer_step", None)
        if hook is not None:
            hook()


# timm's shared `Attention` arguments (every variant's constructor takes them before its own options after `*`).
_TIMM_ARGS = frozenset(list(inspect.signature(AttentionBase.__init__).parameters)[3:])


def auxiliary_loss(model: nn.Module):
    """Sum of the `aux_loss` tensors that modules left in their last forward (e.g. VQ's commitment loss), 0.0 if
    none: add it to the task loss before backward.

    Each loss keeps its graph and counts once per forward, also when backward recomputes the forward (gradient
    checkpointing, reversible blocks; see `zoo.models.blocks.ReversibleSequence`).
    """
    losses = [m.aux_loss for m in model.modules() if getattr(m, "aux_loss", None) is not None]
    return sum(losses) if losses else 0.0
