"""The window gathers of windowed 2-D attention (`zoo.attention.window2d`) where the windows tile the grid: q, k, v
moved into their windows in one write each, and the windows' output written back once, with autograd Functions
whose backwards do the reverse moves in one pass each.

Letter legend: b - batch, h - heads, n - tokens, d - head dim, p - prefix tokens, gy / gx - windows along the grid
rows / columns, wy / wx - rows / columns of a window.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FromWindows", "ToWindows"]


class ToWindows(torch.autograd.Function):
    """`[b, h, p + y x, d]` (any strides) -> `[(b gy gx), h, wy wx (+ p), d]`: each window's cells (then, with
    `with_prefix`, the p prefix tokens), written once. Autograd through the slice, rearrange and cat would copy each
    full-size tensor two or three times and zero-fill it for the slice; the backward here writes the gradient back
    in one pass."""

    @staticmethod
    def forward(ctx, x: Tensor, p: int, tiles: tuple, with_prefix: bool) -> Tensor:
        gy, wy, gx, wx = tiles
        b, h, _, d = x.shape
        ctx.p, ctx.tiles, ctx.with_prefix, ctx.shape = p, tiles, with_prefix, x.shape
        windows = x.new_empty(b, gy, gx, h, wy * wx + (p if with_prefix else 0), d)
        _cells_of(windows, wy, wx).copy_(_grid_of(x, p, tiles))
        if with_prefix:
            windows[..., wy * wx :, :] = x[:, None, None, :, :p]
        return windows.flatten(0, 2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        gy, wy, gx, wx = ctx.tiles
        b, h, n, d = ctx.shape
        p = ctx.p
        grad = grad.unflatten(0, (b, gy, gx))
        grad_x = grad.new_empty(b, n, h, d).transpose(1, 2)  # [b, h, n, d] laid out as qkv's parts are
        _grid_of(grad_x, p, ctx.tiles).copy_(_cells_of(grad, wy, wx))
        if p:
            grad_x[:, :, :p] = grad[..., wy * wx :, :].sum((1, 2)) if ctx.with_prefix else 0.0
        return grad_x, None, None, None


class FromWindows(torch.autograd.Function):
    """The windows' output `[(b gy gx), h, wy wx, d]` and the prefix tokens' `[b, h, p, d]` (or None) ->
    `[b, h, p + y x, d]` laid out as `[b, n, h, d]`, written once; the backward reads the gradient back in one pass."""

    @staticmethod
    def forward(ctx, windows: Tensor, prefix: Tensor | None, p: int, tiles: tuple) -> Tensor:
        gy, wy, gx, wx = tiles
        bg, h, _, d = windows.shape
        b = bg // (gy * gx)
        ctx.p, ctx.tiles = p, tiles
        out = windows.new_empty(b, p + gy * wy * gx * wx, h, d).transpose(1, 2)
        _grid_of(out, p, tiles).copy_(_cells_of(windows.unflatten(0, (b, gy, gx)), wy, wx))
        if p:
            out[:, :, :p] = prefix
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        gy, wy, gx, wx = ctx.tiles
        b, h, _, d = grad.shape
        p = ctx.p
        grad_windows = grad.new_empty(b, gy, gx, h, wy * wx, d)
        _cells_of(grad_windows, wy, wx).copy_(_grid_of(grad, p, ctx.tiles))
        return grad_windows.flatten(0, 2), (grad[:, :, :p] if p else None), None, None


def _grid_of(x: Tensor, p: int, tiles: tuple) -> Tensor:
    """The grid cells of `[b, h, p + y x, d]` as a `[b, gy, gx, h, wy, wx, d]` view."""
    gy, wy, gx, wx = tiles
    return x[:, :, p:].unflatten(2, (gy, wy, gx, wx)).permute(0, 2, 4, 1, 3, 5, 6)


def _cells_of(windows: Tensor, wy: int, wx: int) -> Tensor:
    """The cells of `[b, gy, gx, h, wy wx (+ p), d]` windows as a `[b, gy, gx, h, wy, wx, d]` view."""
    return windows[..., : wy * wx, :].unflatten(-2, (wy, wx))
