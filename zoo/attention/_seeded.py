"""Random numbers as a pure function of seed buffers, drawn on the model's device without a host sync.

A counter-based generator: number i of a draw is a hash of (seed, stream, i), computed with integer tensor ops
that never overflow int64, so it is bit-identical on every device and under `torch.compile`, needs no
`torch.Generator` (a CPU object whose seed would have to be read to the host with `.item()`) and no copy from the
CPU. Reformer hashes with such rotations, BigBird picks its random blocks with them. Performer's feature redraws,
between optimizer steps and through a QR decomposition, keep a CPU generator (`SeedStepMixin.seeded_generator`).

The mixing function is `lowbias32` (C. Wellons, "Prospecting for hash functions", 2018: a 32-bit integer hash
with near-ideal avalanche), applied to 32-bit words held in int64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["SeedStepMixin", "random_bits", "random_normal"]

_WORD = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """`x * c mod 2^32` for x in [0, 2^32) and a 32-bit constant c, in halves so that int64 never overflows (the
    result is then defined, and equal, on every backend)."""
    high = ((x >> 16) * c) & 0xFFFF
    return ((high << 16) + (x & 0xFFFF) * c) & _WORD


def _hash32(x: Tensor) -> Tensor:
    """lowbias32 on words in [0, 2^32) (non-negative, so `>>` is a logical shift)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def random_bits(seed: Tensor, stream: Tensor | int, numel: int) -> Tensor:
    """`[numel]` int64 uniform in [0, 2^32) on `seed`'s device: number i of stream `stream` of `seed`.

    seed: int64 scalar tensor in [0, 2^63); stream: a non-negative int64 scalar (tensor or int, e.g. a step
    count), of which the low 32 bits count. Different (seed, stream) pairs give unrelated sequences.
    """
    if numel > 2**32:
        raise ValueError(f"a draw of {numel} numbers exceeds the counter's 2^32")
    seed = seed.to(torch.int64)
    key = _hash32(seed & _WORD)
    key = _hash32(key ^ (seed >> 32))
    key = _hash32(key ^ (torch.as_tensor(stream, device=seed.device).to(torch.int64) & _WORD))
    counter = torch.arange(numel, device=seed.device, dtype=torch.int64)
    return _hash32(_hash32((counter + key) & _WORD) ^ key)


def random_normal(seed: Tensor, stream: Tensor | int, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Standard normal numbers of `shape` on `seed`'s device (Box-Muller on pairs of `random_bits`).

    Computed in float64, whose log, sqrt and cos round alike on every device, then cast to `dtype`: the same
    values on CPU and CUDA.
    """
    count = math.prod(shape)
    bits = random_bits(seed, stream, 2 * count).to(torch.float64).add_(0.5).mul_(2.0**-32)  # in (0, 1)
    radius = bits[:count].log().mul_(-2.0).sqrt_()
    return (radius * torch.cos(bits[count:] * (2 * math.pi))).view(shape).to(dtype)


class SeedStepMixin:
    """Two persistent int64 scalar buffers for an `AttentionBase`: `seed`, drawn once from torch's global RNG at
    construction, and `step`, the optimizer steps seen (`zoo.attention.on_optimizer_step(model)`, which the
    training engine calls after every step).

    A draw is a pure function of (`seed`, index): `seeded_normal(index, shape)` on the buffers' device (no host
    sync; index may be the `step` buffer itself), `seeded_generator(index)` a CPU generator (reads `seed` on the
    host). Either way it is the same on every data-parallel replica (the seed buffer is broadcast with the
    weights), after resuming (both buffers are checkpoint keys) and in every forward of one step (gradient
    accumulation, recomputation, evaluation).
    """

    def register_seed_and_step(self, device=None) -> None:
        """Create the two buffers (call after `AttentionBase.__init__`)."""
        self.register_buffer("seed", torch.randint(0, 2**62, (), dtype=torch.int64).to(device))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=device))

    def seeded_normal(self, index: Tensor | int, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """Standard normal numbers of `shape` for draw number `index`, on the buffers' device (`random_normal`)."""
        return random_normal(self.seed, index, shape, dtype)

    def seeded_generator(self, index: int) -> torch.Generator:
        """A CPU generator for draw number `index` (a redraw count, an optimizer step)."""
        # Golden-ratio stride: distinct, well-spread generator seeds for (seed, index), identical on every replica.
        return torch.Generator().manual_seed((int(self.seed) + index * 0x9E3779B97F4A7C15) % 2**64)

    @torch.no_grad()
    def on_optimizer_step(self) -> None:
        """Count an optimizer step."""
        self.step += 1
