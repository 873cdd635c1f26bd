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

``zoo.train.loop.Trainer`` runs ``pretrain`` once, before step 0, and records it in the train state of the checkpoint it
writes right after; a resumed run loads that checkpoint and never pretrains again.

Letter legend: b - batch, n - tokens, d - model dim, v - vocabulary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ..attention import get_attention, on_optimizer_step
from ..attention._registry import auxiliary_loss
from .distributed import sync_buffers

if TYPE_CHECKING:
    from ..config import Recipe
    from ..config._config import PretrainConfig
    from ..models.sequence import SequenceModel

__all__ = ["OBJECTIVES", "TokenPredictor", "causal_lm_loss", "draw_mask", "masked_lm_loss", "pretrain"]

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


@contextmanager
def _frozen(module: nn.Module | None) -> Iterator[None]:
    """Parameters the pretraining forward never reaches (the attention pool) are frozen while it runs, so that
    data-parallel training finds no parameter without a gradient."""
    params = [] if module is None else [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def pretrain(
    recipe: Recipe, model: SequenceModel, loader: DataLoader, accelerator: Accelerator, run_dir: Path | None = None
) -> list[dict]:
    """Train `model`'s embedding and backbone in place on `recipe.train.pretrain`'s objective over `loader` (the
    training split: inputs only, labels unused). Returns one record per epoch (also `run_dir/pretrain.jsonl`).

    Optimizer and clipping are the recipe's (`optim`, `train.clip_grad`, `train.grad_accum_steps`); the rate is
    `pretrain.lr` (default `optim.lr`), warmed up over `pretrain.warmup_steps`, then cosine to `schedule.min_lr`.
    What this prepares is released from `accelerator` afterwards (`free_memory`): call it before preparing the
    fine-tuning objects.
    """
    cfg, optim = recipe.train.pretrain, recipe.optim
    predictor = TokenPredictor(model, causal=cfg.objective == "causal")
    total = _total_steps(cfg, len(loader) // recipe.train.grad_accum_steps)
    records: list[dict] = []
    with _frozen(model.backbone.attn_pool):
        optimizer = create_optimizer_v2(
            predictor, opt=optim.name, lr=cfg.lr or optim.lr, weight_decay=optim.weight_decay, betas=tuple(optim.betas)
        )
        scheduler = CosineLRScheduler(
            optimizer,
            t_initial=total,
            lr_min=recipe.schedule.min_lr,
            warmup_t=cfg.warmup_steps,
            warmup_lr_init=recipe.schedule.warmup_lr,
            t_in_epochs=False,
        )
        prepared, optimizer, loader = accelerator.prepare(predictor, optimizer, loader)
        step, epoch = 0, 0
        while step < total:
            loader.set_epoch(epoch)
            record, step = _epoch(recipe, prepared, optimizer, scheduler, loader, accelerator, step, total)
            epoch += 1
            records.append({"pretrain_epoch": epoch, "pretrain_step": step, **record})
            accelerator.print("pretrain " + " ".join(f"{k}={v:.4g}" for k, v in records[-1].items()))
        accelerator.free_memory()
    if run_dir is not None and accelerator.is_main_process:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "pretrain.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def _total_steps(cfg: PretrainConfig, steps_per_epoch: int) -> int:
    if steps_per_epoch == 0:
        raise ValueError("data.batch_size x train.grad_accum_steps exceeds the training samples: nothing to pretrain")
    planned = [n for n in (cfg.epochs and cfg.epochs * steps_per_epoch, cfg.steps) if n]
    return min(planned)


def _epoch(recipe, predictor, optimizer, scheduler, loader, accelerator, step: int, total: int) -> tuple[dict, int]:
    """One pass over `loader` (or up to step `total`): the mean loss, token accuracy and samples/s, and the step."""
    cfg = recipe.train
    predictor.train()
    sums, samples, start = torch.zeros(3, device=accelerator.device), 0, time.perf_counter()
    for batch in loader:
        with accelerator.accumulate(predictor):
            with accelerator.autocast():
                loss, correct, count = _batch_loss(predictor, batch, recipe.train.pretrain)
                total_loss = loss + auxiliary_loss(predictor)
            accelerator.backward(total_loss)
            if accelerator.sync_gradients and cfg.clip_grad:
                accelerator.clip_grad_norm_(predictor.parameters(), cfg.clip_grad)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sums += torch.stack([loss.detach() * count, correct, count]).float()
        samples += len(batch["tokens"]) * accelerator.num_processes
        if not accelerator.sync_gradients:
            continue
        step += 1
        scheduler.step_update(step)
        on_optimizer_step(predictor)
        sync_buffers(predictor)  # process 0's buffers, as after a training step (zoo.train.distributed)
        if step >= total:
            break
    loss_sum, correct, count = accelerator.reduce(sums, "sum").tolist()
    rate = samples / max(time.perf_counter() - start, 1e-9)
    return {"loss": loss_sum / max(count, 1), "token_top1": correct / max(count, 1), "samples_per_s": rate}, step


def _batch_loss(predictor: nn.Module, batch: dict, cfg: PretrainConfig) -> tuple[Tensor, Tensor, Tensor]:
    tokens, keep = batch["tokens"], batch.get("mask")
    if cfg.objective == "causal":
        return causal_lm_loss(predictor(tokens, keep), tokens, keep)
    masked = draw_mask(tokens, keep, cfg.mask_prob)
    return masked_lm_loss(predictor(tokens, keep, masked), tokens, masked)
