"""Builders shared by the attention tests: seeded q / k / v, key-padding masks, post-LayerNorm tokens, variants
built under a fixed seed, and the gradient probe. Each takes the few shapes and seeds its callers differ in, so a
test draws exactly the tensors it always drew."""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

import zoo


def qkv(
    batch: int,
    heads: int,
    length: int,
    head_dim: int | Sequence[int] = 8,
    *,
    count: int = 3,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    requires_grad: bool = False,
) -> list[torch.Tensor]:
    """`count` gaussian `[batch, heads, length, head_dim]` tensors drawn in turn from one generator seeded `seed`;
    a sequence `head_dim` gives each tensor its own width (and sets the count)."""
    generator = torch.Generator().manual_seed(seed)
    widths = [head_dim] * count if isinstance(head_dim, int) else list(head_dim)
    return [
        torch.randn(batch, heads, length, width, generator=generator, dtype=dtype).requires_grad_(requires_grad)
        for width in widths
    ]


def padding(batch: int, length: int, *, drop: float, seed: int = 1) -> torch.Tensor:
    """Random `[batch, length]` keep mask: a key is padded where its uniform draw is at most `drop` (about that
    fraction padded; the threshold itself, not 1 - keep, so the masks stay bit-identical); key 0 always kept, so no
    query is left without keys."""
    keep = torch.rand(batch, length, generator=torch.Generator().manual_seed(seed)) > drop
    keep[:, 0] = True
    return keep


def padded_tails(length: int, kept: Sequence[int]) -> torch.Tensor:
    """`[len(kept), length]` keep mask whose row i keeps its first `kept[i]` keys and pads the rest."""
    keep = torch.ones(len(kept), length, dtype=torch.bool)
    for row, n in enumerate(kept):
        keep[row, n:] = False
    return keep


def tokens(batch: int, length: int, dim: int, seed: int = 1) -> torch.Tensor:
    """`[batch, length, dim]` gaussian tokens after a LayerNorm, the scale a block feeds its attention."""
    generator = torch.Generator().manual_seed(seed)
    return F.layer_norm(torch.randn(batch, length, dim, generator=generator), (dim,))


def make(name: str, dim: int, heads: int, *, seed: int = 0, with_test_options: bool = False, **options) -> nn.Module:
    """Variant `name` built right after seeding the global generator with `seed`, in eval mode; `with_test_options`
    starts from its class's `test_options` (which `options` override)."""
    if with_test_options:
        options = {**zoo.attention.get_attention(name).test_options, **options}
    torch.manual_seed(seed)
    return zoo.create_attention(name, dim, heads, **options).eval()


def grads(out: torch.Tensor, tensors, keep: torch.Tensor | None = None, allow_unused: bool = False):
    """Gradients of a fixed random projection of `out` (a plain sum would hide errors that cancel); with `keep`,
    rows of padded queries, whose outputs are unspecified, left out."""
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype).to(out.device)
    if keep is not None:
        weight = weight * keep[..., None]
    return torch.autograd.grad((out * weight).sum(), tensors, allow_unused=allow_unused)
