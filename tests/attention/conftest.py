"""Fixtures of the attention tests."""

import helpers
import pytest
import torch

from zoo.attention import _flex


@pytest.fixture
def compiled_flex(monkeypatch):
    """`flex_attend`'s FlexAttention compiled on the suite's backend (`helpers.compiled_flex`), with Dynamo started
    afresh, so that each pattern is traced, not taken from a graph guarded on another."""
    torch._dynamo.reset()
    compiled = helpers.compiled_flex()
    monkeypatch.setattr(_flex, "_compiled_flex", lambda: compiled)
    yield
    torch._dynamo.reset()
