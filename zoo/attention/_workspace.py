"""What the hand-written blocked kernels share: buffers reused block after block, row blocks, and the pieces of
their custom backwards (the non-causal fast paths of `performer` and `linear` in `_kernels.blocked_linear`,
`linformer.blocked_attention`, the flash parts of the windowed families, `reformer` and `gau`).

Every buffer such a kernel allocates and writes before reading comes from `unwritten`: plain uninitialised memory,
or NaN inside `poison_unwritten()`, which the tests use so that a kernel reading memory it never wrote fails loudly
(as flash-linear-attention's tests fill uninitialised memory with NaN).

Letter legend: b - batch, h - heads, n - length, w - rows in a block, d - value dim, e - value dim + 1.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from ._kernel import DENOMINATOR_EPS
from ._paths import exporting  # defined with the path choice it steers; re-exported for the kernels' callers

__all__ = [
    "Workspace",
    "exporting",
    "first_order_only",
    "keep_in_rows",
    "normalise_backward_into",
    "normalise_into",
    "num_rows",
    "poison_unwritten",
    "row_blocks",
    "rows_per_block",
    "unwritten",
    "with_ones_into",
]

_POISON = False


@contextlib.contextmanager
def poison_unwritten() -> Iterator[None]:
    """Within the block, `unwritten` buffers start as NaN (integer ones at their dtype's max, bool ones True)."""
    global _POISON
    previous, _POISON = _POISON, True
    try:
        yield
    finally:
        _POISON = previous


def unwritten(like: Tensor, shape: Sequence[int], dtype: torch.dtype | None = None) -> Tensor:
    """A tensor of `shape` on `like`'s device (`like`'s dtype by default) that the caller writes before reading."""
    out = like.new_empty(tuple(shape), dtype=dtype)
    if not _POISON:
        return out
    if out.is_floating_point():
        return out.fill_(math.nan)
    return out.fill_(True if out.dtype == torch.bool else torch.iinfo(out.dtype).max)


class Workspace:
    """One flat `unwritten` buffer, viewed as a contiguous tensor of any smaller shape."""

    def __init__(self, like: Tensor, numel: int) -> None:
        self.buffer = unwritten(like, (numel,))

    def view(self, *shape: int) -> Tensor:
        return self.buffer[: math.prod(shape)].view(shape)


def first_order_only(backward: Callable) -> Callable:
    """Decorates a hand-written `backward` that implements no second-order terms: under `create_graph=True`
    it raises instead of returning gradients that silently lack them (`once_differentiable`'s guard never fires
    when the forward's inputs reach it detached, as here). Otherwise autograd already runs it without grad."""

    @functools.wraps(backward)
    def guarded(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(
                f"{type(ctx).__name__.removesuffix('Backward')} has no double backward (create_graph=True); "
                "use the reference path (reference=True)"
            )
        return backward(ctx, *grads)

    return guarded


# A GPU takes the whole sequence as one block up to this many bytes per workspace: the CPU's block sizes fit its
# caches, and on a GPU each block is a dozen kernel launches, whose cost grows with the blocks
# (benchmarks/nvidia-h100-80gb-hbm3/one_block).
_GPU_BLOCK_BYTES = 2**30


def rows_per_block(n: int, row_bytes: int, cpu_block_bytes: int, device: torch.device) -> int:
    """Rows of a blocked kernel's block: `cpu_block_bytes` of rows `row_bytes` wide on the CPU (at least 16), the
    whole sequence on a GPU unless a workspace would pass `_GPU_BLOCK_BYTES`."""
    budget = cpu_block_bytes if device.type == "cpu" else _GPU_BLOCK_BYTES
    return min(n, max(16, budget // row_bytes))


def row_blocks(n: int, block: int) -> list[slice]:
    """Slices of `block` rows covering `n` (the last one ragged)."""
    return [slice(start, min(start + block, n)) for start in range(0, n, block)]


def keep_in_rows(keep: Tensor | None, rows: slice) -> Tensor | None:
    """The key padding mask `[..., n]` (or None) of the positions in `rows`."""
    return None if keep is None else keep[..., rows]


def num_rows(rows: slice) -> int:
    """Rows in a block of `row_blocks`."""
    return rows.stop - rows.start


def with_ones_into(v: Tensor, workspace: Workspace) -> Tensor:
    """`[b, h, w, d]` -> `[b, h, w, e]` in `workspace`: values with a ones column, whose output is the normaliser."""
    values = workspace.view(*v.shape[:-1], v.shape[-1] + 1)
    values[..., :-1] = v
    values[..., -1] = 1.0
    return values


def normalise_into(numden: Tensor, out: Tensor, den: Tensor) -> None:
    """`numden: [b, h, w, d + 1]` (numerators, then the normaliser) -> `out` `[b, h, w, d]` = num / max(den, eps)
    and `den` `[b, h, w]` = the normaliser, both written in place (views of the caller's full buffers)."""
    den.copy_(numden[..., -1])
    # copy_ rather than div(out=out): torch.compile cannot trace an `out=` view that is not contiguous
    out.copy_(numden[..., :-1] / numden[..., -1:].clamp_min(DENOMINATOR_EPS))


def normalise_backward_into(grad_out: Tensor, out: Tensor, den: Tensor, workspace: Workspace) -> Tensor:
    """The gradient of `normalise_into` w.r.t. `numden`, in `workspace`: grad_out, out `[b, h, w, d]`, den
    `[b, h, w]` -> `[b h, w, d + 1]`.

    out = num / clamp_min(den): grad_num = g / den, grad_den = -(g . out) / den (zero where den < eps).
    """
    b, h, w, d = out.shape
    den = den[..., None]
    grad_numden = workspace.view(b, h, w, d + 1)
    grad_numden[..., :d] = grad_out
    grad_den = (grad_out * out).sum(-1, keepdim=True).neg_()
    grad_numden[..., d:] = grad_den.masked_fill_(den < DENOMINATOR_EPS, 0.0)
    return grad_numden.div_(den.clamp_min(DENOMINATOR_EPS)).flatten(0, 1)
