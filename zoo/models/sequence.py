"""A 1-D transformer over long sequences (DNA, time series, token sequences) with any registered attention.

`SequenceTransformer` is a stack of timm `Block`s (pre-norm; `blocks.{i}.norm1 / attn.qkv / attn.proj / norm2 /
mlp.fc1 / mlp.fc2`, then `norm` and `cls_token`, the names of timm's `VisionTransformer`), so an image ViT's
block weights load into it (`load_vit_weights`). `short_conv=k` puts a causal depthwise convolution of k taps
before every attention (`zoo.models.blocks.ShortConv`, `blocks.{i}.short_conv.conv`), as Zoology's and Based's
recall models do. Every block gets the key padding mask and `is_causal`.
`create_sequence_model(task, input=...)` puts an input embedding (`embeddings.py`), the backbone and the head of
the task (`zoo.tasks`, which also owns the loss) together behind `forward(inputs, mask)` and
`loss(outputs, targets, mask)`.

Positions: `learned` (a table of `max_len`, linearly resampled for longer inputs), `sinusoidal`, `rotary`
(RoFormer, https://arxiv.org/abs/2104.09864: q and k rotated inside every attention, see `with_rotary`), or
`none`. Rotary is the one that suits causal models: relative, and nothing to resample.

Letter legend: b - batch, c - channels, n - tokens, d - model dim, h - heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from einops import rearrange
from timm.layers import trunc_normal_
from timm.models._manipulate import named_apply
from timm.models.vision_transformer import init_weights_vit_timm
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._validate import did_you_mean
from ..attention import AttentionBase, attention_class
from ..attention._common import TIMM_ATTENTION_KEYS
from ..tasks import HeadSpec, Task, get_task
from .blocks import Block
from .embeddings import (
    DNA_BASE_IDS,
    DNA_PAD,
    DNA_TOKENS,
    KmerEmbedding,
    PatchEmbedding,
    RevIN,
    RevINStatsEmbedding,
    TokenEmbedding,
    apply_rotary,
    resample_positions,
    rotary_tables,
    sinusoidal_positions,
)
from .pooling import POOLS, AttentionPool, masked_mean

__all__ = [
    "INPUTS",
    "POSITIONS",
    "SequenceModel",
    "SequenceTransformer",
    "create_sequence_model",
    "load_vit_weights",
    "with_rotary",
]

# dna: one token per nucleotide; kmer: k-mers embedded from nucleotides; series: PatchTST patches; tokens: integer
# ids of a dataset's own vocabulary (its `vocab_size`), padding given by the mask
INPUTS = ("dna", "kmer", "series", "tokens")
POSITIONS = ("learned", "sinusoidal", "rotary", "none")


def _choice(what: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        hint = did_you_mean(value, allowed, n=1)
        raise ValueError(f"unknown {what} {value!r}{hint}; allowed: {', '.join(map(repr, allowed))}")


class RotaryMixin:
    """Rotary positions for any `AttentionBase` subclass: `project_qkv` rotates q and k (RoFormer).

    Every zoo attention computes q, k and v through `project_qkv` and attends on what it returns, so rotating
    there works for all of them without touching their code; a variant that derives its keys from q (Reformer's
    shared QK) sees keys rotated the same way. Positions are `rotary_offset + 0 .. n - 1`. When the wrapped
    attention decodes token by token (`decode_step`, `init_state`: `zoo.attention._kernel.KernelStepMixin`), the
    state becomes `(position, inner state)` and each step sets the offset to its position.
    """

    rotary_base: float = 10000.0
    rotary_offset: int = 0

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().project_qkv(x)
        positions = torch.arange(self.rotary_offset, self.rotary_offset + q.shape[-2], device=q.device)
        cos, sin = rotary_tables(positions, q.shape[-1], base=self.rotary_base)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


def _rotary_init_state(self, batch: int):
    return 0, super(RotaryMixin, self).init_state(batch)


def _rotary_decode_step(self, x: Tensor, state=None, *, keep: Tensor | None = None):
    """The wrapped attention's `decode_step` at the state's position: state `(position, inner state)`."""
    position, inner = (0, None) if state is None else state
    self.rotary_offset = position
    try:
        out, inner = super(RotaryMixin, self).decode_step(x, inner, keep=keep)
    finally:
        self.rotary_offset = 0
    return out, (position + 1, inner)


def with_rotary(cls: type[nn.Module], base: float = 10000.0) -> type[nn.Module]:
    """Subclass of attention class `cls` (an `AttentionBase`) that applies rotary positions to q and k."""
    if not (isinstance(cls, type) and issubclass(cls, AttentionBase)):
        raise TypeError(f"rotary positions need an AttentionBase subclass, got {cls!r}")
    namespace = {"rotary_base": float(base), "__module__": __name__, "__doc__": cls.__doc__}
    if callable(getattr(cls, "decode_step", None)):
        namespace["decode_step"] = _rotary_decode_step
    if callable(getattr(cls, "init_state", None)):
        namespace["init_state"] = _rotary_init_state
    return type(f"Rotary{cls.__name__}", (RotaryMixin, cls), namespace)


def _timm_blocks(
    depth: int, dim: int, num_heads: int, attn_layer: type[nn.Module], *, drop_path_rate: float = 0.0, **block_args
) -> nn.Sequential:
    """`depth` timm `Block`s (zoo's subclass, which adds `short_conv`) with stochastic depth rising linearly to
    `drop_path_rate` (as in timm's ViT)."""
    rates = torch.linspace(0, drop_path_rate, depth).tolist() if depth else []
    return nn.Sequential(
        *[
            Block(dim, num_heads, attn_layer=attn_layer, drop_path=rate, depth=i, **block_args)
            for i, rate in enumerate(rates)
        ]
    )


class SequenceTransformer(nn.Module):
    """Pre-norm transformer on embedded tokens `[b, n, d]` with a key padding mask `[b, n]` (True = keep).

    `forward_features` -> `[b, p + n, d]` after the final norm (p = 1 class token when `pool='cls'`, else 0);
    `forward` -> pooled `[b, d]` when `pool` is set, else the tokens `[b, n, d]`. `causal=True` passes
    `is_causal` to every attention (then `pool` may not be `cls`: a leading class token would see nothing).
    `short_conv`: taps of the causal depthwise convolution before every attention (0: none).
    """

    def __init__(
        self,
        *,
        dim: int,
        depth: int,
        num_heads: int,
        attention: str = "softmax",
        attention_options: dict[str, Any] | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        positions: Literal["learned", "sinusoidal", "rotary", "none"] = "learned",
        max_len: int = 1024,
        rotary_base: float = 10000.0,
        pool: Literal["cls", "mean", "attention"] | None = "cls",
        causal: bool = False,
        pos_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        short_conv: int = 0,
    ) -> None:
        super().__init__()
        _choice("positions", positions, POSITIONS)
        if pool is not None:
            _choice("pool", pool, POOLS)
        if causal and pool == "cls":
            raise ValueError("pool='cls' cannot be causal: the class token comes first and would see no token")
        attn_layer = attention_class(attention, **(attention_options or {}))
        if causal and not getattr(attn_layer, "supports_causal", False):
            raise ValueError(f"attention {attention!r} has no causal mode")
        if positions == "rotary":
            attn_layer = with_rotary(attn_layer, rotary_base)
        self.dim, self.positions, self.pool_type, self.causal = dim, positions, pool, causal
        self.attention = {"name": attention, "options": dict(attention_options or {})}
        self.grad_checkpointing = False
        self.num_prefix_tokens = 1 if pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if pool == "cls" else None
        self.pos_embed = nn.Parameter(torch.zeros(1, max_len, dim)) if positions == "learned" else None
        self.pos_drop = nn.Dropout(pos_drop_rate)
        self.blocks = _timm_blocks(
            depth,
            dim,
            num_heads,
            attn_layer,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            attn_drop=attn_drop_rate,
            proj_drop=proj_drop_rate,
            drop_path_rate=drop_path_rate,
            short_conv=short_conv,
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.attn_pool = AttentionPool(dim) if pool == "attention" else None
        self._init_weights()

    def _init_weights(self) -> None:
        # timm's ViT initialisation, so a backbone trained from scratch starts like one.
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        named_apply(init_weights_vit_timm, self.blocks)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def add_positions(self, x: Tensor, offset: int = 0) -> Tensor:
        """`x: [b, n, d]` at positions `offset ..` -> `[b, n, d]` with absolute positions added (none for rotary).

        Learned positions past the table are resampled to `offset + n`, so a prefix then depends on the total
        length: decoding token by token equals the full forward only within `max_len`.
        """
        n = x.shape[1]
        if self.pos_embed is not None:
            return x + resample_positions(self.pos_embed, offset + n)[:, offset:].to(x.dtype)
        if self.positions == "sinusoidal":
            return x + sinusoidal_positions(n, self.dim, offset=offset, device=x.device).to(x.dtype)
        return x

    def forward_features(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """`x: [b, n, d]`, mask `[b, n]` bool (True = keep) -> `[b, p + n, d]`."""
        if mask is not None and mask.shape != x.shape[:2]:
            raise ValueError(f"mask {list(mask.shape)} does not fit tokens {list(x.shape[:2])}")
        x = self.add_positions(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
            mask = None if mask is None else torch.cat([mask.new_ones(x.shape[0], 1), mask], dim=1)
        # Without padding, no mask: the fused kernels (flash attention) only run without one.
        if mask is not None and bool(mask.all()):
            mask = None
        x = self.pos_drop(x)
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, mask, self.causal, use_reentrant=False)
            else:
                x = block(x, attn_mask=mask, is_causal=self.causal)
        return self.norm(x)

    def pool(self, features: Tensor, mask: Tensor | None = None) -> Tensor:
        """features `[b, p + n, d]`, mask `[b, n]` -> `[b, d]`; padded tokens never enter."""
        if self.pool_type == "cls":
            return features[:, 0]
        tokens = features[:, self.num_prefix_tokens :]
        if self.pool_type == "mean":
            return masked_mean(tokens, mask)
        return self.attn_pool(tokens, mask)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """`x: [b, n, d]`, mask `[b, n]` -> `[b, d]` when pooling, else `[b, n, d]`."""
        features = self.forward_features(x, mask)
        if self.pool_type is None:
            return features[:, self.num_prefix_tokens :]
        return self.pool(features, mask)


def _is_attention_extra(key: str) -> bool:
    """A parameter of a zoo variant that timm's `Attention` does not have (kept at its initialisation)."""
    return ".attn." in key and not key.split(".attn.", 1)[1].startswith(TIMM_ATTENTION_KEYS)


def load_vit_weights(backbone: SequenceTransformer, state: dict[str, Tensor]) -> list[str]:
    """Copy an image ViT's `blocks.*`, `norm.*` (and `cls_token` when both have one) into `backbone`.

    Strict for the blocks: every block key must be filled with the same shape, except a variant's own attention
    parameters and the short convolution's, whose names are returned. Image-only keys (`patch_embed`,
    `pos_embed`, `head`) are skipped.
    """
    own = backbone.state_dict()
    wanted = [k for k in own if k.startswith(("blocks.", "norm."))]
    taken = {k: v for k, v in state.items() if k.startswith(("blocks.", "norm.")) or (k == "cls_token" and k in own)}
    unexpected = [k for k in taken if k not in own]
    # an image ViT has no short convolution: it keeps its initial x_i + x_{i-1}, as in a model trained from scratch
    missing = [k for k in wanted if k not in taken and not (_is_attention_extra(k) or ".short_conv." in k)]
    if k := next((k for k in taken if k in own and taken[k].shape != own[k].shape), None):
        raise ValueError(f"ViT weight {k} has shape {tuple(taken[k].shape)}, the backbone {tuple(own[k].shape)}")
    if unexpected or missing:
        raise ValueError(f"ViT weights do not fit the backbone: missing {missing[:8]}, unexpected {unexpected[:8]}")
    backbone.load_state_dict(taken, strict=False)
    return [k for k in wanted if k not in taken]


class SequenceModel(nn.Module):
    """Input embedding -> `SequenceTransformer` -> the task's head, with the task's loss.

    `forward(inputs, mask)`: inputs are token ids `[b, l]` (dna, kmer: nucleotide ids; tokens: the dataset's ids)
    or a series `[b, l, c]` (time last but one, as `zoo.data` batches `values` and as PatchTST); mask `[b, l]`
    bool, True = keep (None = nothing padded). Outputs: classification `[b, k]` logits; forecast `[b, t, c_out]`
    in the input's units (`target_channels` of the input, all by default); token_classification `[b, l, k]`;
    causal_lm `[b, l, v]`. `loss(outputs, targets, mask)` is the task's (`zoo.tasks.Task.loss`).

    `forward(inputs, mask, positions=...)` (per-position tasks): positions `[b, l]` bool -> `[p, k]`, the outputs
    at those positions only, in the order of `outputs[positions]`. With one token per input position (`dna`,
    `tokens`) the head reads only those p tokens (`head_on_positions`); otherwise it reads every token and the p
    rows are selected, the reference the tests compare with.
    """

    def __init__(
        self,
        task: Task,
        input: str,
        embed: nn.Module,
        backbone: SequenceTransformer,
        head: nn.Module,
        *,
        revin: RevIN | None = None,
        stats_embed: RevINStatsEmbedding | None = None,
        target_channels: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.task, self.input = task, input
        self.embed, self.backbone, self.head, self.revin = embed, backbone, head, revin
        self.stats_embed = stats_embed
        self.target_channels = None if target_channels is None else list(target_channels)
        # the heads of per-position tasks map each token by itself: with one token per input position (no k-mer
        # standing for k) the head can run on the chosen positions' tokens alone
        self.head_on_positions = task.per_position and input in ("dna", "tokens")

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {f"backbone.{name}" for name in self.backbone.no_weight_decay()}

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.backbone.set_grad_checkpointing(enable)

    def forward(self, inputs: Tensor, mask: Tensor | None = None, *, positions: Tensor | None = None) -> Tensor:
        if positions is not None and not self.task.per_position:
            raise ValueError(f"positions are for per-position tasks, not task {self.task.name!r}")
        x, stats = inputs, None
        if self.input == "series":
            x = rearrange(inputs, "b l c -> b c l")
            if self.revin is not None:
                x, stats = self.revin.normalize(x, mask)
        tokens, token_mask = self.embed(x, mask)
        if self.stats_embed is not None:
            tokens = tokens + self.stats_embed(stats)
        features = self.backbone(tokens, token_mask)
        if positions is not None and self.head_on_positions:
            # the p chosen tokens as one batch of one sequence: the head maps each token by itself
            return self.head(features[positions][None])[0]
        out = self.head(features, token_mask)
        if self.task.per_position:
            # a k-mer token predicts k positions: the last token may reach past the input
            out = out[:, : inputs.shape[1]]
            return out if positions is None else out[positions]
        if self.task.forecasts_inputs:
            return self._in_input_units(out, stats)
        return out

    def _in_input_units(self, forecast: Tensor, stats: tuple[Tensor, Tensor] | None) -> Tensor:
        """forecast `[b, c, t]` in normalised units -> `[b, t, c_out]` in the input's, target channels only."""
        if stats is not None:
            forecast = self.revin.denormalize(forecast, stats)
        if self.target_channels is not None:
            forecast = forecast[:, self.target_channels]
        return rearrange(forecast, "b c t -> b t c")

    def loss(
        self, outputs: Tensor, targets: Tensor, mask: Tensor | None = None, *, label_smoothing: float = 0.0
    ) -> Tensor:
        """The task's loss: labels `[b]`; target series `[b, t, c_out]` (mask `[b, t]`: observed steps, None = all);
        labels `[b, l]` (mask: the input mask); the input tokens `[b, l]` (mask: the input mask)."""
        return self.task.loss(outputs, targets, mask, label_smoothing=label_smoothing)


def _embedding(
    input: str,
    dim: int,
    *,
    vocab_size: int,
    pad_id: int,
    base_ids: tuple,
    kmer: int,
    kmer_stride: int | None,
    num_channels: int,
    patch_len: int,
    patch_stride: int,
    channel_independent: bool,
) -> nn.Module:
    if input in ("dna", "tokens"):
        return TokenEmbedding(dim, vocab_size=vocab_size, pad_id=pad_id)
    if input == "kmer":
        return KmerEmbedding(dim, k=kmer, stride=kmer_stride, pad_id=pad_id, base_ids=base_ids)
    return PatchEmbedding(
        dim,
        num_channels=num_channels,
        patch_len=patch_len,
        stride=patch_stride,
        channel_independent=channel_independent,
    )


def _num_tokens(input: str, embed: nn.Module, seq_len: int | None) -> int | None:
    if seq_len is None or input in ("dna", "tokens"):
        return seq_len
    return embed.num_tokens(seq_len) if input == "kmer" else embed.num_patches(seq_len)


def create_sequence_model(
    task: Literal["classification", "forecast", "token_classification", "causal_lm"],
    *,
    input: Literal["dna", "kmer", "series", "tokens"] = "dna",
    attention: str = "softmax",
    attention_options: dict[str, Any] | None = None,
    depth: int = 4,
    dim: int = 128,
    num_heads: int = 4,
    mlp_ratio: float = 4.0,
    positions: Literal["learned", "sinusoidal", "rotary", "none"] | None = None,
    pool: Literal["cls", "mean", "attention"] = "cls",
    num_classes: int | None = None,
    seq_len: int | None = None,
    max_len: int | None = None,
    vocab_size: int = len(DNA_TOKENS),
    pad_id: int = DNA_PAD,
    base_ids: tuple[int, int, int, int] = DNA_BASE_IDS,
    kmer: int = 3,
    kmer_stride: int | None = None,
    num_channels: int = 1,
    patch_len: int = 16,
    patch_stride: int = 8,
    channel_independent: bool = True,
    revin: bool = True,
    revin_stats: bool = False,
    horizon: int | None = None,
    forecast_loss: Literal["mse", "mae"] = "mse",
    score: Literal["all", "labelled"] = "all",
    target_channels: Sequence[int] | None = None,
    tie_embeddings: bool = True,
    drop_rate: float = 0.0,
    attn_drop_rate: float = 0.0,
    proj_drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    grad_checkpointing: bool = False,
    short_conv: int = 0,
) -> SequenceModel:
    """A `SequenceModel` for `task` (a name of `zoo.tasks`) on `input`.

    Tasks and inputs: classification (dna, kmer, series, tokens; needs `num_classes`); forecast (series; needs
    `seq_len`, the input length, and `horizon`; `target_channels` picks the channels forecast, `forecast_loss` the
    training error); token_classification (dna, kmer with stride k; needs `num_classes`; `score='labelled'`: its
    training loss reads the labelled positions only, see `SequenceModel`); causal_lm (dna; next nucleotide,
    `tie_embeddings` shares the output embedding with the input one). `tokens` are ids below
    `vocab_size` of a dataset's own vocabulary (padding comes from the mask).
    `short_conv=k` (0: none) puts a causal depthwise convolution of k taps before every attention (Zoology's and
    Based's recall models use 3). `positions` defaults to rotary for causal tasks and learned otherwise; the
    learned table has `max_len` entries (default: the token count of `seq_len`, else 1024). Series are
    `[b, l, c]`, normalised with RevIN when `revin` (forecasts are returned in the input's units), patched with
    `patch_len` / `patch_stride`; `revin_stats` adds RevIN's statistics, embedded, to every token.
    """
    spec = get_task(task).configured(forecast_loss=forecast_loss, score=score)
    _check_choices(spec, input, forecast_loss, score, kmer, kmer_stride, target_channels, num_channels)
    embed = _embedding(
        input,
        dim,
        vocab_size=vocab_size,
        pad_id=pad_id,
        base_ids=base_ids,
        kmer=kmer,
        kmer_stride=kmer_stride,
        num_channels=num_channels,
        patch_len=patch_len,
        patch_stride=patch_stride,
        channel_independent=channel_independent,
    )
    tokens = _num_tokens(input, embed, seq_len)
    backbone = SequenceTransformer(
        dim=dim,
        depth=depth,
        num_heads=num_heads,
        attention=attention,
        attention_options=attention_options,
        mlp_ratio=mlp_ratio,
        positions=positions or ("rotary" if spec.causal else "learned"),
        max_len=max_len or tokens or 1024,
        pool=pool if spec.pooled else None,
        causal=spec.causal,
        pos_drop_rate=drop_rate,
        attn_drop_rate=attn_drop_rate,
        proj_drop_rate=proj_drop_rate,
        drop_path_rate=drop_path_rate,
        short_conv=short_conv,
    )
    backbone.set_grad_checkpointing(grad_checkpointing)
    head = spec.build_head(
        HeadSpec(
            dim,
            drop=drop_rate,
            num_classes=num_classes,
            vocab_size=vocab_size,
            folded_channels=num_channels if input == "series" and channel_independent else 1,
            num_channels=num_channels,
            channel_independent=channel_independent,
            seq_len=seq_len,
            num_tokens=tokens,
            horizon=horizon,
            steps=kmer if input == "kmer" else 1,
            tied_weight=getattr(embed, "weight", None) if tie_embeddings else None,
        )
    )
    revin_layer = RevIN(num_channels) if input == "series" and revin else None
    if revin_stats and revin_layer is None:
        raise ValueError(f"revin_stats=True needs a series input with revin=True, got input={input!r}, revin={revin}")
    stats_embed = RevINStatsEmbedding(dim, num_channels, channel_independent) if revin_stats else None
    return SequenceModel(
        spec, input, embed, backbone, head, revin=revin_layer, stats_embed=stats_embed, target_channels=target_channels
    )


def _check_choices(
    spec: Task,
    input: str,
    forecast_loss: str,
    score: str,
    kmer: int,
    kmer_stride: int | None,
    target_channels: Sequence[int] | None,
    num_channels: int,
) -> None:
    """The input, loss and channel choices of `create_sequence_model`, each against what the task allows."""
    _choice("input", input, INPUTS)
    _choice("forecast_loss", forecast_loss, ("mse", "mae"))
    if score != "all" and "score" not in spec.model_options:
        raise ValueError(f"score={score!r} is for per-position classification; task {spec.name!r} scores all outputs")
    if input not in spec.inputs:
        raise ValueError(f"task {spec.name!r} does not take input {input!r}; it takes {', '.join(spec.inputs)}")
    if spec.per_position and input == "kmer" and kmer_stride not in (None, kmer):
        raise ValueError(
            f"per-position labels on k-mers need non-overlapping k-mers: kmer_stride={kmer_stride} != k={kmer}"
        )
    if target_channels is not None and not all(0 <= c < num_channels for c in target_channels):
        raise ValueError(f"target_channels {list(target_channels)} must be channel indices below {num_channels}")
