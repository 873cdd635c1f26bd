"""Sampling from a causal sequence model (`create_sequence_model("causal_lm")`), token by token.

When every block's attention decodes recurrently, `decode_step(x_t, state) -> (out_t, state)` (linear
attention and Performer through `zoo.attention._kernel.KernelStepMixin`: "Transformers are RNNs", Katharopoulos
et al. 2020, https://arxiv.org/abs/2006.16236), decoding is O(1) per token: each block carries its attention
state, and the rest of a block is per token (norm1 -> attn.decode_step -> residual -> norm2 -> mlp ->
residual). Otherwise every new token re-runs the full forward on the whole sequence. Both give the same
tokens; greedy decoding (`temperature=0`) gives them exactly.

Letter legend: b - batch, n - tokens, d - model dim, v - vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["block_step", "generate", "has_step", "recurrent_logits", "sample_next", "supports_recurrent"]


def has_step(attn: nn.Module) -> bool:
    """True when `attn` decodes token by token (`decode_step(x_t, state) -> (out_t, state)`)."""
    return callable(getattr(attn, "decode_step", None))


def supports_recurrent(model: nn.Module) -> bool:
    """True when every block's attention has a recurrent `decode_step` (and no block has a short convolution,
    whose window `block_step` does not carry)."""
    blocks = model.backbone.blocks
    return all(has_step(block.attn) and getattr(block, "short_conv", None) is None for block in blocks)


def block_step(block: nn.Module, x: Tensor, state: Any) -> tuple[Tensor, Any]:
    """One token through a timm `Block`: `x: [b, 1, d]` and the attention state (None before the first token)
    -> `[b, 1, d]` and the new state."""
    out, state = block.attn.decode_step(block.norm1(x), state)
    x = x + block.drop_path1(block.ls1(out))
    x = x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
    return x, state


def _token_step(model: nn.Module, token: Tensor, position: int, states: list) -> Tensor:
    """token `[b]` at `position` -> next-token logits `[b, v]`; updates `states` (one per block) in place."""
    backbone = model.backbone
    x, _ = model.embed(token[:, None])
    x = backbone.pos_drop(backbone.add_positions(x, offset=position))
    for i, block in enumerate(backbone.blocks):
        x, states[i] = block_step(block, x, states[i])
    return model.head(backbone.norm(x))[:, 0]


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    # Dropout would make the recurrent and the full forward differ; restore the caller's mode afterwards.
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _check_model(model: nn.Module) -> None:
    task = getattr(model, "task", None)
    if not getattr(task, "causal", False):
        name = getattr(task, "name", task)
        raise ValueError(f"generation needs a causal (causal_lm) SequenceModel, got task {name!r}")


@torch.no_grad()
def recurrent_logits(model: nn.Module, tokens: Tensor) -> Tensor:
    """Next-token logits `[b, n, v]` of tokens `[b, n]` by recurrent steps; equals `model(tokens)` (no padding)."""
    _check_model(model)
    if not supports_recurrent(model):
        raise ValueError(f"attention {model.backbone.attention['name']!r} has no recurrent decode_step")
    with _eval_mode(model):
        states: list = [None] * len(model.backbone.blocks)
        return torch.stack([_token_step(model, tokens[:, t], t, states) for t in range(tokens.shape[1])], dim=1)


def sample_next(
    logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> Tensor:
    """logits `[b, v]` -> token ids `[b]`: argmax when `temperature == 0`, else a draw from
    `softmax(logits / temperature)` restricted to the `top_k` most likely tokens."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1")
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_tokens: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    recurrent: bool | None = None,
) -> Tensor:
    """Continue prompts `[b, n]` (same length, no padding, n >= 1) by `max_new_tokens` -> `[b, n + new]`.

    `recurrent=None` decodes recurrently when every attention has `decode_step` and re-runs the full forward
    otherwise; True / False force one path (True raises when one is missing). The model runs in eval mode.
    """
    _check_model(model)
    if prompt_tokens.dim() != 2 or prompt_tokens.shape[1] < 1:
        raise ValueError(f"prompt_tokens must be [b, n] with n >= 1, got {list(prompt_tokens.shape)}")
    if recurrent is None:
        recurrent = supports_recurrent(model)
    elif recurrent and not supports_recurrent(model):
        raise ValueError(f"attention {model.backbone.attention['name']!r} has no recurrent decode_step")
    options = {"temperature": temperature, "top_k": top_k, "generator": generator}
    tokens = prompt_tokens
    with _eval_mode(model):
        if recurrent:
            states: list = [None] * len(model.backbone.blocks)
            for t in range(tokens.shape[1]):
                logits = _token_step(model, tokens[:, t], t, states)
        for i in range(max_new_tokens):
            if not recurrent:
                logits = model(tokens)[:, -1]
            token = sample_next(logits, **options)
            tokens = torch.cat([tokens, token[:, None]], dim=1)
            if recurrent and i + 1 < max_new_tokens:
                logits = _token_step(model, token, tokens.shape[1] - 1, states)
    return tokens
