"""What every attention variant shares: timm-compatible projections, key padding masks, the head layout.

Letter legend for the einops patterns in this package:
    b - batch, h - heads, n - query length, m - key length, d - head dim, c - model dim,
    r - random features / landmarks / projected length, w - window or chunk length, k - number of chunks
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

__all__ = [
    "TIMM_ATTENTION_KEYS",
    "AttentionBase",
    "SplitHeads",
    "key_padding_mask",
    "masked_fill_keys",
    "pad_to_multiple",
]

# Parameter prefixes of timm's `Attention`: the weights that copy between every variant and timm checkpoints.
TIMM_ATTENTION_KEYS = ("qkv", "q_norm", "k_norm", "norm", "gate", "proj")


def key_padding_mask(attn_mask: Tensor | None, batch: int, length: int) -> Tensor | None:
    """Normalise a key padding mask to `[b, m]` bool, True = keep.

    Accepts `[b, m]` or timm's `[b, 1, 1, m]`, bool (True = keep) or additive float (0 = keep, -inf or a large
    negative number = drop). Anything else (a per-query mask, an additive bias) is an error: only exact softmax
    can take those.
    """
    if attn_mask is None:
        return None
    mask = attn_mask
    if mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        mask = mask[:, 0, 0]
    if mask.dim() != 2 or mask.shape[-1] != length or mask.shape[0] not in (1, batch):
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} is not a key padding mask for batch {batch} and "
            f"length {length}: expected [{batch}, {length}] or [{batch}, 1, 1, {length}]"
        )
    if mask.dtype != torch.bool:
        keep = mask > torch.finfo(mask.dtype).min / 2
        if (mask[keep] != 0).any():
            raise ValueError("additive attn_mask holds a bias (values other than 0 and -inf): not a padding mask")
        mask = keep
    return mask.expand(batch, length)


def masked_fill_keys(x: Tensor, mask: Tensor | None, value: float = 0.0) -> Tensor:
    """Set padded positions of `x: [b, h, m, *]` to `value`; `mask: [b, m]` bool, True = keep."""
    if mask is None:
        return x
    return x.masked_fill(~mask[:, None, :, None], value)


def pad_to_multiple(x: Tensor, multiple: int, dim: int = -2, value: float = 0.0) -> tuple[Tensor, int]:
    """Pad `x` along `dim` to a multiple of `multiple`; returns the padded tensor and the pad length."""
    length = x.shape[dim]
    pad = -length % multiple
    if pad == 0:
        return x, 0
    widths = [0, 0] * (x.dim() - (dim % x.dim()) - 1) + [0, pad]
    return F.pad(x, widths, value=value), pad


class SplitHeads(torch.autograd.Function):
    """`qkv: [b, n, 3 h d]` -> q, k, v `[b, h, n, d]`, views (`AttentionBase.project_qkv`).

    The point is the backward: unbind's would stack the three gradients and then copy again to undo the head
    permutation, a sizeable share of a fast attention layer's time on a GPU. Here, when the gradients are the
    three views of one `[b, n, 3, h, d]` buffer (what the blocked kernels of `performer` and `linear` and the fused
    GPU kernels write), that buffer is the gradient of qkv as it is; otherwise each is copied into its slot of one,
    a single pass.
    """

    @staticmethod
    def forward(ctx, qkv: Tensor, num_heads: int):
        b, n, c = qkv.shape
        ctx.shape = (b, n, 3, num_heads, c // (3 * num_heads))
        return tuple(qkv.view(ctx.shape)[:, :, i].permute(0, 2, 1, 3) for i in range(3))

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        # made of differentiable ops, so double backward works through it
        b, n, _, h, d = ctx.shape
        base = grads[0]._base if grads[0] is not None else None
        if (
            base is not None
            and base.shape == ctx.shape
            and base.is_contiguous()
            and all(
                g is not None
                and g._base is base
                and g.storage_offset() == base.storage_offset() + i * h * d
                and g.stride() == (n * 3 * h * d, d, 3 * h * d, 1)
                for i, g in enumerate(grads)
            )
        ):
            return base.view(b, n, 3 * h * d), None
        like = next(g for g in grads if g is not None)
        packed = like.new_empty(ctx.shape)  # every slot written below
        for i, grad in enumerate(grads):
            if grad is None:
                packed[:, :, i] = 0.0
            else:
                packed[:, :, i] = grad.permute(0, 2, 1, 3)
        return packed.view(b, n, 3 * h * d), None


class AttentionBase(nn.Module):
    """timm-compatible multi-head self-attention; subclasses implement `attend` on `[b, h, n, d]` tensors.

    The constructor takes timm's `Attention` arguments and creates the same submodules (`qkv`, `q_norm`,
    `k_norm`, `norm`, `gate`, `proj`), so weights copy between variants and stock timm checkpoints load. A
    variant's constructor is `__init__(self, dim, num_heads=8, *, <its own options>, **timm_args)`: its options
    keyword-only after `*`, timm's other arguments passed on unchanged with `super().__init__(dim, num_heads,
    **timm_args)`, where this signature rejects an unknown name. After that call a variant reads them from the
    module (`self.num_heads`, `self.head_dim`, `self.attn_drop.p`, `self.factory_kwargs`). A variant with a fast
    path takes `reference: bool = False`: True selects the explicit pure-PyTorch reference path the tests compare
    with (on outputs and every gradient, for every variant whose options include `reference`).
    """

    supports_causal: ClassVar[bool] = False
    # Small options for the registry-driven test suite (B=2, N=37, dim 32, 2 heads): every per-variant test builds
    # the variant with these, so a new variant needs no test edit.
    test_options: ClassVar[dict] = {}
    # 2-D variants attend on the patch grid: they take `grid_size` and `num_prefix_tokens` options and the model
    # calls `set_grid` before each forward when the image size may change.
    needs_grid: ClassVar[bool] = False
    # Variants that never form attention weights cannot apply attention dropout and refuse `attn_drop > 0`.
    has_attention_weights: ClassVar[bool] = False
    attention_name: ClassVar[str] = ""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if attn_head_dim is None and dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}; set attn_head_dim")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("qk_norm and scale_norm need a norm_layer")
        if attn_drop > 0 and not self.has_attention_weights:
            raise ValueError(
                f"attention {self.attention_name!r} forms no attention weights, so attn_drop={attn_drop} cannot "
                "apply; set attn_drop (attn_drop_rate in a recipe) to 0"
            )
        self.num_heads = num_heads
        self.head_dim = attn_head_dim or dim // num_heads
        self.attn_dim = self.num_heads * self.head_dim
        self.scale = self.head_dim**-0.5

        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(self.attn_dim, **dd) if scale_norm else nn.Identity()
        self.gate = nn.Linear(dim, self.attn_dim, bias=qkv_bias, **dd) if gated else None
        self.proj = nn.Linear(self.attn_dim, dim_out or dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    @property
    def factory_kwargs(self) -> dict:
        """`{"device", "dtype"}` of the projections: what timm's `device` and `dtype` arguments built them with, for
        the parameters and buffers a variant adds after `AttentionBase.__init__`."""
        return {"device": self.qkv.weight.device, "dtype": self.qkv.weight.dtype}

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`x: [b, n, c]` -> q, k, v, each `[b, h, n, d]` (q and k normalised when qk_norm is on): views of the
        projection, whose gradients `SplitHeads` hands back in one pass."""
        q, k, v = SplitHeads.apply(self.qkv(x), self.num_heads)
        return self.q_norm(q), self.k_norm(k), v

    def project_out(self, out: Tensor, x: Tensor) -> Tensor:
        """`out: [b, h, n, d]` -> `[b, n, c]` through the optional gate, `norm` and `proj`."""
        out = rearrange(out, "b h n d -> b n (h d)")
        if self.gate is not None:
            out = out * self.gate(x).sigmoid()
        return self.proj_drop(self.proj(self.norm(out)))

    def prepare_mask(self, attn_mask: Tensor | None, batch: int, length: int) -> Tensor | None:
        """The mask `attend` receives; by default a `[b, m]` key padding mask (True = keep)."""
        return key_padding_mask(attn_mask, batch, length)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """`x: [b, n, c]` -> `[b, n, c]`."""
        if is_causal and not self.supports_causal:
            raise ValueError(f"attention {self.attention_name!r} has no causal mode")
        mask = self.prepare_mask(attn_mask, x.shape[0], x.shape[1])
        q, k, v = self.project_qkv(x)
        return self.project_out(self.attend(q, k, v, mask, is_causal), x)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """q, k, v: `[b, h, n, d]`; mask: what `prepare_mask` returned -> `[b, h, n, d]`."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"name={self.attention_name!r}, num_heads={self.num_heads}, head_dim={self.head_dim}"
