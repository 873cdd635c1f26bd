"""Random numbers as a pure function of seed buffers, drawn on the model's device without a host sync.

A counter-based generator: number i of a draw is a hash of (seed, stream, i), computed with integer tensor ops
that never overflow int64, so it is bit-identical on every device and under `torch.compile`, needs no
`torch.Generator` (a CPU object whose seed would have to be read to the host with `.item()`) and no copy from the
CPU. Reformer hashes with such rotations, BigBird picks its random blocks with them. Performer's feature redraws,
between optimizer steps and through a QR decomposition, keep a CPU generator (`SeedStepMixin.seeded_generator`).

The mixing function is a two-round multiply-xorshift hash of 32-bit words (the `lowbias32` family of C. Wellons'
hash-prospector, with multipliers below 2^31 so that a word times a multiplier fits int64); its avalanche bias
is at the sampling noise floor of a test on random words, as lowbias32's is.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

__all__ = ["SeedStepMixin", "host_int", "random_bits", "random_normal"]

_WORD = 0xFFFFFFFF


def _hash32_(x: Tensor) -> Tensor:
    """Hash int64 words in [0, 2^32) in place (non-negative, so `>>` is a logical shift; the products stay below
    2^63, so nothing overflows)."""
    x.bitwise_xor_(x >> 16).mul_(0x21F0AAAD).bitwise_and_(_WORD)
    x.bitwise_xor_(x >> 15).mul_(0x735A2D97).bitwise_and_(_WORD)
    return x.bitwise_xor_(x >> 15)


def random_bits(seed: Tensor, stream: Tensor | int, numel: int) -> Tensor:
    """`[numel]` int64 uniform in [0, 2^32) on `seed`'s device: number i of stream `stream` of `seed`.

    seed: int64 scalar tensor in [0, 2^63); stream: a non-negative int64 scalar (tensor or int, e.g. a step
    count), of which the low 32 bits count. Different (seed, stream) pairs give unrelated sequences: a word is
    hashed twice, with a key added before the first round and another xored in before the second, so streams
    whose first keys are close are not shifted copies of each other.
    """
    if numel > 2**32:
        raise ValueError(f"a draw of {numel} numbers exceeds the counter's 2^32")
    seed = seed.to(torch.int64)
    stream = torch.as_tensor(stream, device=seed.device).to(torch.int64) & _WORD
    first = _hash32_(_hash32_(_hash32_(seed & _WORD) ^ (seed >> 32)) ^ stream)
    second = _hash32_(first ^ 0x5BD1E995)
    words = torch.arange(numel, device=seed.device, dtype=torch.int64).add_(first).bitwise_and_(_WORD)
    return _hash32_(_hash32_(words).bitwise_xor_(second))


def host_int(x: Tensor | int) -> int | None:
    """The value of `x` when reading it costs no device sync: an int, or a CPU tensor outside `torch.compile`;
    else None. What the draws below are cached by on the CPU, where hashing costs more than a GPU's microseconds."""
    if isinstance(x, int):
        return x
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        return int(x)
    return None


def random_normal(seed: Tensor, stream: Tensor | int, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Standard normal numbers of `shape` on `seed`'s device: Box-Muller on pairs of `random_bits` (the first half
    of the words as radii, the second as angles), both the cosine and the sine of each pair.

    Computed in float64, whose log, sqrt, cos and sin round alike on every device to well below float32's
    resolution, then cast to `dtype`: the same values on CPU and CUDA. On the CPU the last few draws are cached
    (every forward of a step, every batch of an evaluation, draws the same).
    """
    key = (host_int(seed), host_int(stream))
    if None not in key:
        return _normal_on_cpu(*key, tuple(shape), dtype).clone()
    return _normal(seed, stream, shape, dtype)


@functools.lru_cache(maxsize=8)
def _normal_on_cpu(seed: int, stream: int, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return _normal(torch.tensor(seed), stream, shape, dtype)


def _normal(seed: Tensor, stream: Tensor | int, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    count = math.prod(shape)
    pairs = (count + 1) // 2
    uniform = random_bits(seed, stream, 2 * pairs).to(torch.float64).add_(0.5).mul_(2.0**-32)  # in (0, 1)
    radius = uniform[:pairs].log_().mul_(-2.0).sqrt_()
    angle = uniform[pairs:].mul_(2 * math.pi)
    normal = torch.cat([radius * angle.cos(), radius * angle.sin()])
    return normal[:count].view(shape).to(dtype)


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
