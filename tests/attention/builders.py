"""Builders shared by the attention tests: seeded q / k / v, key-padding masks, post-LayerNorm tokens, variants
built under a fixed seed, and the gradient probe. Each takes the few shapes and seeds its callers differ in, so a
test draws exactly the tensors it always drew."""

import copy
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


# bf16's unit roundoff, 2^-8: one rounding changes a value by at most this fraction. The bf16 tests bound the output
# by 4 of them (the roundings of qkv, the attention's output, proj's input and its output) and a gradient by
# log2(N) of them (a sum over N tokens or keys, summed pairwise in bf16, takes log2(N) roundings).
BF16_ROUNDOFF = torch.finfo(torch.bfloat16).eps / 2


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """`|actual - expected| / |expected|` (Frobenius norms), in float64."""
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm())


def bf16_against(
    low: nn.Module, x: torch.Tensor, expected_out, *, autocast: bool = False, **call
) -> tuple[float, float, dict[str, float]]:
    """Relative errors of a bf16 run of `low` against `expected_out(high, x_high)` (a float32 computation with
    `high`, a float32 copy of `low`, on `x` widened: its own rounding, near float32's 2^-24, is lost beside bf16's
    2^-8, and at 4K tokens an O(n^2) reference costs half the time of float64's), on the output, the input's
    gradient and each parameter's.

    x: `[b, n, c]`, bf16 (or float32 with `autocast`: `low` then runs under CPU autocast to bf16); `call`: keyword
    arguments of `low`'s forward."""
    high = copy.deepcopy(low).float()
    weight = torch.randn(x.shape[:-1] + (high.proj.out_features,), generator=torch.Generator().manual_seed(7))
    x_low, x_high = x.clone().requires_grad_(), x.float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = low(x_low, **call)
    assert out.dtype == torch.bfloat16
    expected = expected_out(high, x_high)
    (out.float() * weight).sum().backward()
    (expected * weight).sum().backward()
    params = {
        name: relative_error(a.grad, b.grad)
        for (name, a), b in zip(low.named_parameters(), high.parameters(), strict=True)
    }
    return relative_error(out, expected), relative_error(x_low.grad, x_high.grad), params
