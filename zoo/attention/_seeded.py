"""Seed-and-step buffers for the variants that draw random tensors while training (Performer's features, Reformer's
hash rotations): every draw is a pure function of a seed buffer and a count of optimizer steps."""

from __future__ import annotations

import torch

__all__ = ["SeedStepMixin"]


class SeedStepMixin:
    """Two persistent int64 scalar buffers for an `AttentionBase`: `seed`, drawn once from torch's global RNG at
    construction, and `step`, the optimizer steps seen (`zoo.attention.on_optimizer_step(model)`, which the
    training engine calls after every step).

    A draw takes `seeded_generator(index)`, a CPU generator seeded by (`seed`, index), so it is the same on every
    data-parallel replica (the seed buffer is broadcast with the weights), after resuming (both buffers are
    checkpoint keys) and in every forward of one step (gradient accumulation, recomputation, evaluation).
    """

    def register_seed_and_step(self, device=None) -> None:
        """Create the two buffers (call after `AttentionBase.__init__`)."""
        self.register_buffer("seed", torch.randint(0, 2**62, (), dtype=torch.int64).to(device))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=device))

    def seeded_generator(self, index: int) -> torch.Generator:
        """A CPU generator for draw number `index` (a redraw count, an optimizer step)."""
        # Golden-ratio stride: distinct, well-spread generator seeds for (seed, index), identical on every replica.
        return torch.Generator().manual_seed((int(self.seed) + index * 0x9E3779B97F4A7C15) % 2**64)

    @torch.no_grad()
    def on_optimizer_step(self) -> None:
        """Count an optimizer step."""
        self.step += 1
