"""The private ATen operators of the CPU flash-parts path (`zoo.attention._kernels.flash_parts`), checked against the
running torch: their schemas are the ones the parts were written against, and a torch that lacks or changes one
turns the parts off, with a warning, for the masked F.scaled_dot_product_attention path."""

import warnings

import pytest
import torch

import zoo
from zoo.attention._kernels import flash_parts as _flash_parts


@pytest.fixture
def fresh_check():
    """Forget the cached verdict and warning before and after the test."""
    for cached in (_flash_parts.flash_ops_problem, _flash_parts._warn_flash_ops_off):
        cached.cache_clear()
    yield
    for cached in (_flash_parts.flash_ops_problem, _flash_parts._warn_flash_ops_off):
        cached.cache_clear()


@pytest.mark.parametrize("name", sorted(_flash_parts.FLASH_OP_SCHEMAS))
def test_the_private_operators_keep_the_schemas_the_parts_were_written_against(name, fresh_check):
    packet = getattr(torch.ops.aten, name, None)
    assert packet is not None, f"torch {torch.__version__} has no aten::{name}: the CPU flash parts are off"
    actual, expected = str(packet.default._schema), _flash_parts.FLASH_OP_SCHEMAS[name]
    assert actual == expected, (
        f"torch {torch.__version__} changed aten::{name}: the CPU flash parts are off until _kernels/flash_parts.py is "
        f"checked against\n  {actual}\nand FLASH_OP_SCHEMAS updated (was\n  {expected})"
    )
    assert _flash_parts.flash_ops_problem() is None


def _windowed() -> tuple[torch.nn.Module, torch.Tensor]:
    """`local` with a 64-wide window over 200 tokens: the flash parts' case on CPU."""
    torch.manual_seed(0)
    return zoo.create_attention("local", 32, 2, window=64).eval(), torch.randn(2, 200, 32)


@pytest.mark.parametrize("change", ["missing", "schema"])
def test_a_missing_or_changed_operator_turns_the_parts_off_with_one_warning(monkeypatch, fresh_check, change):
    attention, x = _windowed()
    calls = []
    original = _flash_parts._FlashParts.apply
    monkeypatch.setattr(_flash_parts._FlashParts, "apply", lambda *args: calls.append(1) or original(*args))
    with torch.no_grad():
        expected = attention(x)
    assert calls, "the flash-parts path was not taken"
    schemas = dict(_flash_parts.FLASH_OP_SCHEMAS)
    name = _flash_parts._FLASH_BACKWARD
    if change == "missing":
        schemas["_no_such_flash_operator"] = schemas.pop(name)
        match = "has no aten::_no_such_flash_operator"
    else:
        schemas[name] = schemas[name].replace("float? scale=None", "float? scale=None, bool extra=False")
        match = f"changed aten::{name}"
    monkeypatch.setattr(_flash_parts, "FLASH_OP_SCHEMAS", schemas)
    _flash_parts.flash_ops_problem.cache_clear()
    calls.clear()
    with pytest.warns(RuntimeWarning, match=f"flash-parts path of the windowed attentions is off: .*{match}"):
        out = attention(x)
    assert not calls
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # once per process, and training works on the public path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attention(x.requires_grad_()).square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
