"""The task heads of the 1-D models, each chosen by its task (`zoo.tasks`, `Task.build_head`); the losses are the
tasks' too.

- Classification: a linear map of the pooled features (per channel, then averaged, for channel-independent series).
- Forecasting: PatchTST's flatten head (https://arxiv.org/abs/2211.14730), all patch tokens of a channel
  flattened and mapped linearly to the horizon.
- Per-token classification, and causal language modelling (next token, tied or untied output embedding).

Every head is called as `head(features, mask)`: the backbone's output and its token mask (True = keep), which
only the heads that read every token (forecasting) need.

Letter legend: b - batch, c - channels, n - tokens, d - model dim, k - classes, t - horizon, v - vocabulary,
u - steps per token (k-mer stride).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

__all__ = ["ClassificationHead", "ForecastHead", "LanguageModelHead", "TokenClassificationHead"]


class ClassificationHead(nn.Module):
    """Pooled features `[b, d]` -> logits `[b, k]`.

    `channels > 1`: the features of a channel-independent series, one pooled vector per channel folded into the
    batch, `(b c) d -> b (c d)`, classified together.
    """

    def __init__(self, dim: int, num_classes: int, *, channels: int = 1, drop: float = 0.0) -> None:
        super().__init__()
        self.channels = channels
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(dim * channels, num_classes)

    def forward(self, pooled: Tensor, mask: Tensor | None = None) -> Tensor:
        """pooled `[(b c), d]` -> `[b, k]`; `mask` is not read (padding is out of the pooled vector)."""
        if self.channels > 1:
            pooled = rearrange(pooled, "(b c) d -> b (c d)", c=self.channels)
        return self.fc(self.drop(pooled))


class TokenClassificationHead(nn.Module):
    """Tokens `[b, n, d]` -> logits per input position `[b, l, k]`.

    A token standing for `steps` input positions (a non-overlapping k-mer) predicts all of them at once,
    `b n (u k) -> b (n u) k`; the model trims the result to the input length `l`.
    """

    def __init__(self, dim: int, num_classes: int, *, steps: int = 1, drop: float = 0.0) -> None:
        super().__init__()
        self.num_classes, self.steps = num_classes, steps
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(dim, num_classes * steps)

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens `[b, n, d]` -> `[b, (n u), k]`; `mask` is not read (padded positions are the loss's to drop)."""
        return rearrange(self.fc(self.drop(tokens)), "b n (u k) -> b (n u) k", u=self.steps)


class ForecastHead(nn.Module):
    """PatchTST flatten head: patch tokens -> forecast `[b, c, t]` in normalised units.

    Channel-independent: `(b c) n d -> (b c) (n d) -> (b c) t`, weights shared by channels. Channel-mixing:
    `b n d -> b (n d) -> b (c t)`. Padded patches are zeroed before flattening so they never reach the forecast.
    """

    def __init__(
        self,
        dim: int,
        num_patches: int,
        horizon: int,
        *,
        num_channels: int,
        channel_independent: bool = True,
        drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_patches, self.horizon, self.num_channels = num_patches, horizon, num_channels
        self.channel_independent = channel_independent
        self.drop = nn.Dropout(drop)
        out = horizon if channel_independent else num_channels * horizon
        self.fc = nn.Linear(num_patches * dim, out)

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens `[(b c), n, d]` or `[b, n, d]`, mask `[(b c), n]` / `[b, n]` -> `[b, c, t]`."""
        if tokens.shape[1] != self.num_patches:
            raise ValueError(
                f"forecast head was built for {self.num_patches} patches, got {tokens.shape[1]}: the series "
                "length must be the model's seq_len"
            )
        if mask is not None:
            tokens = tokens.masked_fill(~mask[..., None], 0.0)
        out = self.fc(self.drop(rearrange(tokens, "b n d -> b (n d)")))
        if self.channel_independent:
            return rearrange(out, "(b c) t -> b c t", c=self.num_channels)
        return rearrange(out, "b (c t) -> b c t", c=self.num_channels)


class LanguageModelHead(nn.Module):
    """Tokens `[b, n, d]` -> next-token logits `[b, n, v]`; `tied_weight` (the input embedding's `[v, d]`)
    shares the output embedding with the input one (Press & Wolf 2017, https://arxiv.org/abs/1608.05859)."""

    def __init__(self, dim: int, vocab_size: int, *, tied_weight: nn.Parameter | None = None) -> None:
        super().__init__()
        if tied_weight is not None and tied_weight.shape != (vocab_size, dim):
            raise ValueError(f"tied weight {tuple(tied_weight.shape)} does not fit vocab {vocab_size} x dim {dim}")
        self.tied = tied_weight is not None
        self.weight = tied_weight if self.tied else nn.Parameter(torch.randn(vocab_size, dim) * 0.02)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens `[b, n, d]` -> `[b, n, v]`; `mask` is not read (padded positions are the loss's to drop)."""
        return F.linear(tokens, self.weight, self.bias)
