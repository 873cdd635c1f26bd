"""Which implementation one attention call takes: the single place every variant asks.

A variant implements its equation once as a plain reference function and may have faster paths for the same
result. `choose_path` picks among those the variant offers for this call, in this order (the first that applies
wins):

1. `reference`: the variant was built with `reference=True` (the tests' oracle; slow, exact).
2. `flex`: FlexAttention, where the variant offers a block pattern and either its `backend` option says `flex`, or
   it says `auto` on CUDA tensors with no attention dropout (FlexAttention has none).
3. `fused`: fused Triton kernels, where the variant says its tensors fit them (CUDA, triton importable, `ZOO_FUSED`
   not `0`, shapes the kernels take); `torch.export` records them as one custom op.
4. `kernel`: the CPU kernels with hand-written backwards (row-blocked linear maps, flash parts of the windowed
   families), where the variant says they apply, never under `torch.export` (their `out=` workspaces cannot be
   traced).
5. `torch`: the variant's general torch path (every device, every mode; fla's chunked kernel is a choice inside
   the causal kernel-attention path, `_fla.use_fla`).

The variant passes what it offers as predicates, evaluated lazily in that order, so a check that costs something
(a triton import, a mask scan) runs only when the earlier paths did not apply.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["Path", "choose_path", "exporting"]


class Path(enum.Enum):
    """An implementation of a variant's equation."""

    REFERENCE = "reference"
    FLEX = "flex"
    FUSED = "fused"
    KERNEL = "kernel"
    TORCH = "torch"


def exporting() -> bool:
    """True while `torch.export` traces: the CPU kernels' callers then take their torch path.

    Export traces a custom autograd Function's forward with autograd on, where an `out=` write into a workspace is
    refused ("functions with out=... arguments don't support automatic differentiation"). torch.compile runs that
    forward as eager does, without autograd, so compiled models keep the CPU kernels and their memory bounds.
    """
    return torch.compiler.is_exporting()


def choose_path(
    q: Tensor,
    *,
    reference: bool = False,
    backend: str = "auto",
    dropout_p: float = 0.0,
    flex: bool = False,
    fused: Callable[[], bool] | None = None,
    kernel: Callable[[], bool] | None = None,
) -> Path:
    """The path of one call on queries `q: [b, h, n, d]`, in the order of the module docstring.

    reference: the variant's `reference` option. backend: its `backend` option (`auto`, `torch` or `flex`; a
    variant without one passes `auto`). dropout_p: the attention dropout of this call. flex: whether the variant
    has a FlexAttention pattern for this call. fused / kernel: whether its fused Triton kernels / CPU kernels take
    these tensors (None: the variant has none).
    """
    if reference:
        return Path.REFERENCE
    if flex and (backend == "flex" or (backend == "auto" and q.is_cuda and dropout_p == 0.0)):
        return Path.FLEX
    if fused is not None and fused():
        return Path.FUSED
    if kernel is not None and not exporting() and kernel():
        return Path.KERNEL
    return Path.TORCH
