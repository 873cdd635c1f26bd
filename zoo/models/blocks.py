"""Transformer blocks and block stacks that work with any zoo attention: the backbone options.

- `block`: `timm` (timm's pre-norm `Block`: attention + MLP, same parameter names, so timm weights load) or `gau`
  (FLASH: two gated attention units replace attention + MLP; "Transformer Quality in Linear Time", Hua et al.
  2022, https://arxiv.org/abs/2202.10447). Every block exposes its two residual branches, `branch1` and `branch2`.
- `reversible`: RevNet couplings ("The Reversible Residual Network", Gomez et al. 2017,
  https://arxiv.org/abs/1707.04585, as used by "Reformer: The Efficient Transformer", Kitaev et al. 2020,
  https://arxiv.org/abs/2001.04451): `y1 = x1 + F(x2)`, `y2 = x2 + G(y1)` with F, G the two branches. The
  input is duplicated (`x1 = x2 = x`, as Reformer and RevViT do, rather than split in half: every branch keeps
  the full width, so the weights are those of the plain model) and the two streams are averaged at the end.
  Backward recomputes each block's inputs from its outputs, so activation memory does not grow with depth.
- `ff_chunks`: the feed-forward runs over that many chunks of the sequence, each checkpointed, so its
  `[n, 4 c]` hidden activations exist for one chunk at a time (Reformer's chunked feed-forward).
- `short_conv`: a causal depthwise convolution of that many taps (`ShortConv`) on the normed input of every
  attention, as the recall models of Zoology (https://arxiv.org/abs/2312.04927) and Based
  (https://arxiv.org/abs/2402.18668) put one before every sequence mixer: binding a token to its neighbours is
  then the convolution's job, and the attention's is only to look up.

`block_class` gives a class for timm's `block_fn` slot, optionally with another attention in chosen blocks
(`attn_layers`, the per-block layouts of `zoo.create_model(global_blocks=...)`); `ReversibleSequence` holds a
stack of them as couplings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm
from timm.models.vision_transformer import Block as TimmBlock
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._validate import check_int, did_you_mean, unknown_name
from ..attention import attention_class
from ..attention.gau import GatedAttentionUnit

__all__ = [
    "BLOCKS",
    "Block",
    "GAUBlock",
    "ReversibleSequence",
    "ShortConv",
    "block_class",
    "chunked_feed_forward",
]

BLOCKS = ("timm", "gau")
# Options of a GAU block that are not attention options (group_size comes from the `gau` attention's options).
GAU_BLOCK_OPTIONS = ("z_dim", "expansion")


def chunked_feed_forward(fn: Callable[[Tensor], Tensor], x: Tensor, chunks: int) -> Tensor:
    """`fn` applied to `x: [b, n, c]` in `chunks` pieces along n -> `[b, n, c']`; 0 or 1: in one piece.

    `fn` must treat positions independently. With gradients on, each piece is checkpointed: its hidden
    activations are recomputed in backward instead of kept, which is where the memory saving comes from.
    """
    if chunks <= 1 or x.shape[1] <= 1:
        return fn(x)
    if torch.is_grad_enabled():
        return torch.cat([checkpoint(fn, part, use_reentrant=False) for part in x.chunk(chunks, dim=1)], dim=1)
    return torch.cat([fn(part) for part in x.chunk(chunks, dim=1)], dim=1)


def _check_chunks(ff_chunks: int) -> int:
    return check_int("ff_chunks", ff_chunks, minimum=0)


class ShortConv(nn.Module):
    """Causal depthwise convolution over tokens: `x: [b, n, c]` -> `[b, n, c]`, output i from inputs i - k + 1 .. i.

    Causal whatever the attention is, so a causal model stays causal and padding at the end never reaches a kept
    token; positions a `[b, n]` keep mask drops are zeroed first, so they do not reach their neighbours either.

    Initialised to `x_i + x_{i-1}` (the last two taps 1, bias 0): every token starts bound to the one before it,
    the one-token shift that lets small models learn MQAR, where a key's value is the token after it. The start
    matters for the linear-cost variants: on `recall_mqar_quick` with `linear`, PyTorch's random start and the
    identity leave the model far below what this start reaches in the same steps; softmax learns from any of them.
    timm's ViT initialisation resets every `Conv1d` it meets and then calls `init_weights`, which puts this start
    back.
    """

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.kernel_size = check_int("short_conv", kernel_size, minimum=1)
        self.conv = nn.Conv1d(dim, dim, kernel_size, groups=dim, padding=0)
        self.init_weights()

    def init_weights(self) -> None:
        """`x_i + x_{i-1}`: the last tap and the one before it 1 (the last alone for one tap), the others and the
        bias 0."""
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.weight[:, 0, -2:] = 1.0
            self.conv.bias.zero_()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is not None and mask.dim() == 2 and mask.dtype == torch.bool and mask.shape == x.shape[:2]:
            x = x.masked_fill(~mask[..., None], 0.0)
        x = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))  # [b, c, k - 1 + n]
        return self.conv(x).transpose(1, 2)


class Block(TimmBlock):
    """timm's pre-norm `Block` (same submodules, so checkpoints load strictly) with its residual branches exposed,
    an optional chunked feed-forward, and an optional `ShortConv` of `short_conv` taps (0: none) between `norm1`
    and the attention. Takes timm's `Block` arguments, then `ff_chunks` and `short_conv`."""

    def __init__(self, *args: Any, ff_chunks: int = 0, short_conv: int = 0, **timm_args: Any) -> None:
        super().__init__(*args, **timm_args)
        self.ff_chunks = _check_chunks(ff_chunks)
        check_int("short_conv", short_conv, minimum=0)
        self.short_conv = ShortConv(self.norm1.normalized_shape[0], short_conv) if short_conv else None

    def mixer_input(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """What the attention reads: `norm1(x)`, through the short convolution when there is one."""
        x = self.norm1(x)
        return x if self.short_conv is None else self.short_conv(x, attn_mask)

    def branch1(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """Attention branch, `[b, n, c]` -> `[b, n, c]`."""
        out = self.attn(self.mixer_input(x, attn_mask), attn_mask=attn_mask, is_causal=is_causal)
        return self.drop_path1(self.ls1(out))

    def branch2(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """Feed-forward branch, `[b, n, c]` -> `[b, n, c]` (position-wise: the mask and causality do not apply).

        Only the norm and MLP are chunked: drop path draws one mask per sample and must see the whole sequence.
        """
        return self.drop_path2(self.ls2(chunked_feed_forward(self._feed_forward, x, self.ff_chunks)))

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.mlp(self.norm2(x))

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        x = x + self.branch1(x, attn_mask, is_causal)
        return x + self.branch2(x, attn_mask, is_causal)


class GAUBlock(nn.Module):
    """FLASH block: two gated attention units (`gau1`, `gau2`), each pre-norm with a residual, in place of
    attention + MLP; two GAUs with expansion 2 have about the parameters of one attention + MLP.

    Takes timm's `Block` arguments so it fits `block_fn`: `dim`, `qkv_bias` (bias of the `uv` projection),
    `proj_bias`, `proj_drop`, `init_values`, `drop_path`, `norm_layer` apply; `num_heads`, `mlp_ratio`,
    `act_layer`, `mlp_layer` and `attn_layer` describe what a GAU replaces (one head, SiLU, expansion instead of
    mlp_ratio) and are not used; `qk_norm`, `scale_attn_norm`, `scale_mlp_norm` and `attn_drop` have no GAU
    counterpart and are refused.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 1,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        init_values: float | None = None,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] | None = None,
        norm_layer: type[nn.Module] = LayerNorm,
        mlp_layer: type[nn.Module] | None = None,
        attn_layer: type[nn.Module] | None = None,
        depth: int = 0,
        device=None,
        dtype=None,
        *,
        z_dim: int = 128,
        expansion: float = 2.0,
        group_size: int = 256,
    ) -> None:
        super().__init__()
        refused = {"qk_norm": qk_norm, "scale_attn_norm": scale_attn_norm, "scale_mlp_norm": scale_mlp_norm}
        for name, value in refused.items():
            if value:
                raise ValueError(f"{name}={value!r} has no counterpart in a GAU block; set it to False")
        if attn_drop > 0:
            raise ValueError(f"attn_drop={attn_drop} cannot apply: a GAU block forms no softmax weights; set it to 0")
        options = {
            "z_dim": z_dim,
            "expansion": expansion,
            "group_size": group_size,
            "bias": qkv_bias,
            "proj_bias": proj_bias,
            "proj_drop": proj_drop,
            "init_values": init_values,
            "drop_path": drop_path,
            "norm_layer": norm_layer,
            "device": device,
            "dtype": dtype,
        }
        self.gau1 = GatedAttentionUnit(dim, **options)
        self.gau2 = GatedAttentionUnit(dim, **options)

    def branch1(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        return self.gau1(x, attn_mask, is_causal)

    def branch2(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        return self.gau2(x, attn_mask, is_causal)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        x = x + self.branch1(x, attn_mask, is_causal)
        return x + self.branch2(x, attn_mask, is_causal)


def block_class(
    block: str = "timm",
    *,
    attention: str = "softmax",
    attention_options: dict[str, Any] | None = None,
    block_options: dict[str, Any] | None = None,
    ff_chunks: int = 0,
    attn_layers: Mapping[int, type[nn.Module]] | None = None,
) -> type[nn.Module]:
    """A block class with the options bound, for timm's `block_fn` slot (called with timm's `Block` arguments).

    `timm`: `Block` with `ff_chunks`; the attention comes through `attn_layer` as usual, `block_options` must be
    empty; `attn_layers` maps block indices (timm's `depth` argument) to the attention class those blocks use
    instead of `attn_layer` (same submodule names, so the weights load as before). `gau`: `GAUBlock`, which
    brings its own attention, so `attention` must be `gau` (its `group_size` option is used), `attn_layers` must
    be empty and `block_options` may set `z_dim` and `expansion`; `ff_chunks` must be 0 or 1 (a GAU block has no
    separate feed-forward).
    """
    if block not in BLOCKS:
        raise unknown_name("block", block, BLOCKS)
    _check_chunks(ff_chunks)
    block_options = dict(block_options or {})
    if block == "timm":
        if block_options:
            raise ValueError(f"block 'timm' takes no block_options, got {block_options}")
        return _bind(Block, {"ff_chunks": ff_chunks}, dict(attn_layers or {}))
    if attention != "gau":
        raise ValueError(
            f"block 'gau' brings its own attention (FLASH mixed chunk attention), so attention must be 'gau', "
            f"got {attention!r}"
        )
    if attn_layers:
        raise ValueError(
            f"block 'gau' brings its own attention, so no block can take another one (blocks {sorted(attn_layers)}); "
            "use block 'timm' for per-block attention"
        )
    if ff_chunks > 1:
        raise ValueError(f"ff_chunks={ff_chunks} applies to the MLP of timm blocks; block 'gau' has none")
    for key in block_options:
        if key not in GAU_BLOCK_OPTIONS:
            raise ValueError(
                f"block 'gau' has no option {key!r}{did_you_mean(key, GAU_BLOCK_OPTIONS)}; its options: "
                f"{', '.join(GAU_BLOCK_OPTIONS)} (group_size is an option of attention 'gau')"
            )
    # Validates the attention options (unknown keys raise) and reads them back with the defaults filled in.
    group_size = getattr(attention_class("gau", **(attention_options or {})), "bound_options", {})
    return _bind(GAUBlock, {**group_size, **block_options})


def _bind(
    cls: type[nn.Module], bound: dict[str, Any], attn_layers: dict[int, type[nn.Module]] | None = None
) -> type[nn.Module]:
    """A subclass of `cls` with keyword options bound (timm's `block_fn` is called with keywords only); block
    `depth` takes `attn_layers[depth]` as its `attn_layer` when there is one."""
    attn_layers = attn_layers or {}

    def __init__(self, *args, **kwargs):
        if kwargs.get("depth") in attn_layers:
            kwargs["attn_layer"] = attn_layers[kwargs["depth"]]
        cls.__init__(self, *args, **{**bound, **kwargs})

    namespace = {"__init__": __init__, "__module__": cls.__module__, "bound_options": bound}
    return type(cls.__name__, (cls,), namespace)


def _aux_modules(block: nn.Module) -> list[nn.Module]:
    """The modules of `block` that leave an auxiliary loss in `aux_loss` (see `zoo.attention.auxiliary_loss`)."""
    return [module for module in block.modules() if hasattr(module, "aux_loss")]


class ReversibleSequence(nn.Sequential):
    """Blocks as RevNet couplings: `x: [b, n, c]` -> `(y1 + y2) / 2`, `[b, n, c]` (see the module docstring).

    Each block must expose `branch1` and `branch2` (`Block`, `GAUBlock`). `recompute=True` (the fast path) keeps
    only the last block's outputs and recomputes the rest in backward, replaying the random state of dropout and
    drop path and the autocast state; `recompute=False` is the reference: the same computation through ordinary
    autograd. Parameter gradients flow through the autograd graph, so `.backward()` and `torch.autograd.grad`
    both work. The children keep timm's names (`0`, `1`, ...), so a plain model's weights load.

    Auxiliary losses (a module's `aux_loss`, e.g. VQ's commitment loss) keep their gradient on the fast path:
    its forward builds no graph, so each loss is handed out as an output of the couplings' autograd function
    (`aux_loss` then holds that output), and backward adds the loss's gradient when it recomputes the block.
    """

    def __init__(self, *blocks: nn.Module, recompute: bool = True) -> None:
        super().__init__(*blocks)
        for index, block in enumerate(self):
            if not (hasattr(block, "branch1") and hasattr(block, "branch2")):
                raise TypeError(
                    f"block {index} ({type(block).__name__}) exposes no branch1/branch2: use "
                    "zoo.models.blocks.Block or GAUBlock"
                )
        self.recompute = recompute

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        blocks = list(self)
        params = [p for p in self.parameters() if p.requires_grad]
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or bool(params))
        if self.recompute and needs_grad and blocks:
            aux = [_aux_modules(block) for block in blocks]
            y1, y2, *losses = _ReversibleCouplings.apply(x, blocks, aux, attn_mask, is_causal, *params)
            for module, loss in zip((module for modules in aux for module in modules), losses, strict=True):
                if module.aux_loss is not None:
                    module.aux_loss = loss
        else:
            y1 = y2 = x
            for block in blocks:
                y1, y2 = _couple(block, y1, y2, attn_mask, is_causal)
        return (y1 + y2) / 2


def _couple(block: nn.Module, x1: Tensor, x2: Tensor, attn_mask, is_causal: bool) -> tuple[Tensor, Tensor]:
    y1 = x1 + block.branch1(x2, attn_mask, is_causal)
    return y1, x2 + block.branch2(y1, attn_mask, is_causal)


class _RngState:
    """The CPU (and the tensor's CUDA device) random state, to replay dropout and drop path in backward."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    @contextmanager
    def replay(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=[self.device] if self.cuda is not None else []):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda, self.device)
            yield


class _ReversibleCouplings(torch.autograd.Function):
    """Forward without a graph, keeping only the last outputs; backward rebuilds each block's inputs from its
    outputs (`x2 = y2 - G(y1)`, `x1 = y1 - F(x2)`) while back-propagating through the recomputed branches.

    `aux[i]` lists block i's modules with an `aux_loss`; forward returns their losses (0 where a module set none)
    after `y1, y2`, and backward back-propagates each loss's gradient through its recomputed block.
    """

    @staticmethod
    def forward(ctx, x: Tensor, blocks: list[nn.Module], aux: list[list[nn.Module]], attn_mask, is_causal, *params):
        device_type = x.device.type
        ctx.autocast = {
            "device_type": device_type,
            "dtype": torch.get_autocast_dtype(device_type),
            "enabled": torch.is_autocast_enabled(device_type),
        }
        ctx.blocks, ctx.aux, ctx.attn_mask, ctx.is_causal, ctx.params = blocks, aux, attn_mask, is_causal, params
        ctx.rng = []
        y1 = y2 = x
        for block in blocks:
            rng1 = _RngState(x.device)
            y1 = y1 + block.branch1(y2, attn_mask, is_causal)
            rng2 = _RngState(x.device)
            y2 = y2 + block.branch2(y1, attn_mask, is_causal)
            ctx.rng.append((rng1, rng2))
        ctx.save_for_backward(y1, y2)
        modules = [module for modules in aux for module in modules]
        losses = [x.new_zeros((), dtype=torch.float32) if m.aux_loss is None else m.aux_loss.detach() for m in modules]
        return (y1, y2, *losses)

    @staticmethod
    def backward(ctx, dy1: Tensor, dy2: Tensor, *dlosses: Tensor):
        y1, y2 = (t.detach() for t in ctx.saved_tensors)
        grads: dict[int, Tensor] = {}
        # Each block's auxiliary modules with the gradients of their losses, in block order.
        dlosses = iter(dlosses)
        aux = [[(module, next(dlosses)) for module in modules] for modules in ctx.aux]
        for block, (rng1, rng2), block_aux in zip(reversed(ctx.blocks), reversed(ctx.rng), reversed(aux), strict=True):
            params = [p for p in block.parameters() if p.requires_grad]
            g, (dy1_g, *dparams) = _branch_grad(ctx, block.branch2, rng2, y1, params, dy2, block_aux)
            _accumulate(grads, params, dparams)
            x2 = y2 - g
            dy1 = dy1 + dy1_g
            f, (dx2_f, *dparams) = _branch_grad(ctx, block.branch1, rng1, x2, params, dy1, block_aux)
            _accumulate(grads, params, dparams)
            y1, y2, dy2 = y1 - f, x2, dy2 + dx2_f
        return (dy1 + dy2, None, None, None, None, *(grads.get(id(p)) for p in ctx.params))


def _branch_grad(ctx, branch, rng: _RngState, x: Tensor, params: list[Tensor], grad_out: Tensor, aux):
    """Recompute `branch(x)` as in forward; returns its value (detached) and the gradients for x and params.

    `aux`: `(module, gradient of its loss)` pairs. Their `aux_loss` is emptied for the recompute, so a module in
    this branch leaves its loss there with a graph (a recomputation only fills an empty `aux_loss`), and that
    loss's gradient joins the branch's; the forward's losses are put back after.
    """
    x = x.detach().requires_grad_()
    kept = [module.aux_loss for module, _ in aux]
    for module, _ in aux:
        module.aux_loss = None
    try:
        with torch.enable_grad(), rng.replay(), torch.autocast(**ctx.autocast):
            out = branch(x, ctx.attn_mask, ctx.is_causal)
        losses = [(m.aux_loss, grad) for m, grad in aux if m.aux_loss is not None and m.aux_loss.requires_grad]
    finally:
        for (module, _), loss in zip(aux, kept, strict=True):
            module.aux_loss = loss
    outputs = [out] + [loss for loss, _ in losses]
    grad_outputs = [grad_out] + [grad.to(loss.dtype) for loss, grad in losses]
    grads = torch.autograd.grad(outputs, (x, *params), grad_outputs, allow_unused=True)
    return out.detach(), grads


def _accumulate(grads: dict[int, Tensor], params: list[Tensor], values) -> None:
    for param, value in zip(params, values, strict=True):
        if value is not None:
            grads[id(param)] = value if id(param) not in grads else grads[id(param)] + value
