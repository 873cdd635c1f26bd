"""Triton's interpreter (`TRITON_INTERPRET=1`), which runs the fused kernels on CPU tensors for the test suite:
whether the kernels were defined for it, and the one patch an older interpreter needs to run them."""

from __future__ import annotations

import triton

from .kernels import _state_kernel

__all__ = ["INTERPRETED"]

# Triton chose, when the kernels were defined, between compiling them and interpreting them
INTERPRETED = not isinstance(_state_kernel, triton.runtime.JITFunction)


def _interpreter_loop_bounds() -> None:
    """Triton 3.6's interpreter (torch 2.11's) takes a scalar argument used as a loop bound (`range(tiles)`) as
    `int()` of a one-element array, which numpy 2.4 refuses ("only 0-dimensional arrays can be converted"); later
    interpreters squeeze it first. Every interpreted kernel call re-patches triton's tensor class, so the squeeze is
    added where it does that, the same on an interpreter that already has it."""
    from triton.runtime import interpreter

    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None:  # an interpreter laid out otherwise: left as it is
        return

    def patch_with_squeeze(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_with_squeeze


if INTERPRETED:
    _interpreter_loop_bounds()
