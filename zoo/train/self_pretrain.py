"""Self-pretraining: the backbone first learns the task's own training inputs, then fine-tunes on the labels.

Amos, Berant and Gupta, "Never Train from Scratch: Fair Comparison of Long-Sequence Models Requires Data-Driven
Priors", ICLR 2024, https://arxiv.org/abs/2310.02980: denoising pretraining on the downstream task's own inputs
(no other data) lifts plain Transformers on Long Range Arena to the level of state-space models.

A recipe asks for it with ``train.pretrain`` (``zoo.config.PretrainConfig``): ``objective: mlm`` masks
``mask_prob`` of the kept tokens (each replaced by a [MASK] embedding, an extra vocabulary entry that exists only
while pretraining) and predicts them with bidirectional attention, scoring masked positions only; ``objective:
causal`` predicts every next token with ``is_causal`` through the backbone. The model's own embedding and backbone
are trained in place, under a token-prediction head of their own; the head and the [MASK] entry are then dropped,
so the model that fine-tunes (and every checkpoint of it) has exactly the shape it has without pretraining.

This module holds the objective (``PretrainObjective``) and the recipe of its run (``pretrain_recipe``);
``zoo.train.stages.pretrain`` runs it once, before step 0: a run of its own through the Trainer into
``<run>/pretrain`` (the recipe's optimizer, schedule, precision and distribution; ``PretrainObjective`` its only
difference). The Trainer that fine-tunes then records it in the train state of the checkpoint it writes right away;
a resumed run loads that checkpoint and never pretrains again.

Letter legend: b - batch, n - tokens, d - model dim, v - vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import Tensor, nn

from ..attention import get_attention
from ..attention._registry import auxiliary_loss
from ._objective import Objective, objective_recipe

if TYPE_CHECKING:
    from ..config import Recipe
    from ..config._config import PretrainConfig
    from ..models.sequence import SequenceModel

__all__ = [
    "OBJECTIVES",
    "PretrainObjective",
    "TokenPredictor",
    "causal_lm_loss",
    "draw_mask",
    "masked_lm_loss",
    "pretrain_recipe",
]

OBJECTIVES = ("mlm", "causal")


def draw_mask(tokens: Tensor, keep: Tensor | None, prob: float, generator: torch.Generator | None = None) -> Tensor:
    """Positions to mask: each kept position with probability `prob`, and at least one per sequence that has any.

    tokens `[b, n]`, keep `[b, n]` bool (True = a real token, None = all) -> `[b, n]` bool.
    """
    keep = torch.ones_like(tokens, dtype=torch.bool) if keep is None else keep
    scores = torch.rand(tokens.shape, device=tokens.device, generator=generator)
    chosen = (scores < prob) & keep
    # a sequence with nothing masked would teach nothing: its kept position of lowest score is masked
    first = scores.masked_fill(~keep, 2.0).argmin(dim=1)
    forced = torch.zeros_like(chosen).scatter_(1, first[:, None], True) & keep
    return chosen | (forced & ~chosen.any(dim=1, keepdim=True))


def masked_lm_loss(logits: Tensor, tokens: Tensor, masked: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Cross-entropy of the masked positions only: logits `[b, n, v]`, the original tokens `[b, n]`, masked `[b, n]`
    -> (mean loss, correct predictions, scored positions)."""
    return _scored_loss(logits, tokens, masked)


def causal_lm_loss(logits: Tensor, tokens: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Next-token cross-entropy: logits `[b, n, v]` at position i predict `tokens[:, i + 1]`; a padded next token
    (keep `[b, n]`, None = all kept) is not scored -> (mean loss, correct predictions, scored positions)."""
    scored = torch.ones_like(tokens[:, 1:], dtype=torch.bool) if keep is None else keep[:, 1:]
    return _scored_loss(logits[:, :-1], tokens[:, 1:], scored)


def _scored_loss(logits: Tensor, targets: Tensor, scored: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    logits, targets = logits[scored].float(), targets[scored]
    count = scored.sum()
    loss = F.cross_entropy(logits, targets, reduction="sum") / count.clamp_min(1)
    return loss, (logits.argmax(dim=-1) == targets).sum(), count


class TokenPredictor(nn.Module):
    """A `SequenceModel`'s embedding and backbone (shared, not copied) under a token-prediction head.

    `forward(tokens, keep, masked)`: tokens `[b, n]`, keep `[b, n]` bool (True = a real token, None = all), masked
    `[b, n]` bool or None (mlm: where the [MASK] embedding replaces the token's) -> logits `[b, n, v]`. With
    `causal=True` every attention runs with `is_causal` (the backbone's own setting is restored afterwards).
    """

    def __init__(self, model: SequenceModel, *, causal: bool) -> None:
        super().__init__()
        embed, backbone = model.embed, model.backbone
        vocab_size = getattr(embed, "vocab_size", None)
        if vocab_size is None:
            raise ValueError(f"self-pretraining predicts tokens: input {model.input!r} has no token vocabulary")
        if causal and not get_attention(backbone.attention["name"]).supports_causal:
            raise ValueError(f"causal pretraining: attention {backbone.attention['name']!r} has no causal mode")
        self.embed, self.backbone, self.causal = embed, backbone, causal
        self.mask_embedding = nn.Parameter(torch.randn(backbone.dim) * 0.02)
        self.head = nn.Linear(backbone.dim, vocab_size)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {f"backbone.{name}" for name in self.backbone.no_weight_decay()} | {"mask_embedding"}

    def forward(self, tokens: Tensor, keep: Tensor | None = None, masked: Tensor | None = None) -> Tensor:
        x, keep = self.embed(tokens, keep)
        if masked is not None:
            x = torch.where(masked[..., None], self.mask_embedding.to(x.dtype), x)
        backbone, previous = self.backbone, self.backbone.causal
        backbone.causal = self.causal
        try:
            features = backbone.forward_features(x, keep)
        finally:
            backbone.causal = previous
        return self.head(features[:, backbone.num_prefix_tokens :])


def pretrain_recipe(recipe: Recipe) -> Recipe:
    """The recipe of the pretraining run: `train.pretrain`'s length, rate (default `optim.lr`) and warm-up in the
    recipe's optimizer and schedule, one record and checkpoint per epoch, no validation (nothing to score)."""
    cfg = recipe.train.pretrain
    # with steps only, as many epochs as steps: train.max_steps ends the run
    train = {"pretrain": None, "validate": False, "epochs": cfg.epochs or cfg.steps, "max_steps": cfg.steps}
    return objective_recipe(
        recipe,
        f"{recipe.name}_pretrain",
        train={**train, "eval_every_epochs": 1},
        optim={"lr": cfg.lr or recipe.optim.lr},
        schedule={"warmup_steps": cfg.warmup_steps},
    )


class PretrainObjective(Objective):
    """The loss of `pretrain`'s run: mlm or causal token prediction through a `TokenPredictor` around the model,
    plus the attention's auxiliary loss; the token accuracy is reported with each evaluation record."""

    def __init__(self, cfg: PretrainConfig) -> None:
        self.cfg = cfg
        # [correct, scored] since the last record, on the device
        self._sums: Tensor | None = None

    def module(self, model: nn.Module) -> nn.Module:
        return TokenPredictor(model, causal=self.cfg.objective == "causal")

    def loss(self, module: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        loss, correct, count = _batch_loss(module, batch, self.cfg)
        seen = torch.stack([correct, count]).float()
        self._sums = seen if self._sums is None else self._sums + seen
        return loss + auxiliary_loss(module)

    def metrics(self, accelerator: Accelerator) -> dict[str, float]:
        sums, self._sums = self._sums, None
        if sums is None:
            return {}
        correct, count = accelerator.reduce(sums, "sum").tolist()
        return {"token_top1": correct / max(count, 1)}


def _batch_loss(predictor: nn.Module, batch: dict, cfg: PretrainConfig) -> tuple[Tensor, Tensor, Tensor]:
    tokens, keep = batch["tokens"], batch.get("mask")
    if cfg.objective == "causal":
        return causal_lm_loss(predictor(tokens, keep), tokens, keep)
    masked = draw_mask(tokens, keep, cfg.mask_prob)
    return masked_lm_loss(predictor(tokens, keep, masked), tokens, masked)
