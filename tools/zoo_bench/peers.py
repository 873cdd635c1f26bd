"""The peer packages a sweep compares zoo with (`peer:<package>`): installed for the sweeps, never dependencies.

Each peer's layer is built at fixed settings (those of the speed targets) and wrapped behind zoo's forward
signature `[b, n, c] -> [b, n, c]`; `peer_weights` maps its projections to timm's names, so that exact attention
with the peer's own weights is its reference, as zoo's weights are zoo's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo._validate import unknown_name
from zoo.attention import AttentionBase

__all__ = [
    "NON_CAUSAL_PEERS",
    "PEERS",
    "PEER_PREFIX",
    "PEER_VARIANTS",
    "LocalAttentionPeer",
    "PeerAttention",
    "build_peer",
    "peer_weights",
]

PEER_PREFIX = "peer:"
# Peer package -> its import name.
PEERS = {
    "performer-pytorch": "performer_pytorch",
    "linformer": "linformer",
    "nystrom-attention": "nystrom_attention",
    "local-attention": "local_attention",
    "reformer-pytorch": "reformer_pytorch",
}
NON_CAUSAL_PEERS = ("linformer", "nystrom-attention")
# The zoo variant each peer package is compared with, at the peer's settings.
PEER_VARIANTS = {
    "performer-pytorch": "performer",
    "linformer": "linformer",
    "nystrom-attention": "nystrom",
    "local-attention": "local",
    "reformer-pytorch": "reformer",
}


class PeerAttention(nn.Module):
    """A peer package's self-attention layer `[b, n, c] -> [b, n, c]` behind zoo's forward signature."""

    def __init__(self, layer: nn.Module, causal: bool) -> None:
        super().__init__()
        self.layer = layer
        self.causal = causal

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        if attn_mask is not None or is_causal != self.causal:
            raise ValueError(f"this peer layer was built with causal={self.causal} and takes no attn_mask")
        return self.layer(x)


class LocalAttentionPeer(AttentionBase):
    """zoo's `qkv` / `proj` around local-attention's `LocalAttention`: windows of 256, one back, one ahead."""

    supports_causal = True

    def __init__(self, dim: int, num_heads: int = 8, *, causal: bool = False) -> None:
        from local_attention import LocalAttention

        super().__init__(dim, num_heads)
        self.causal = causal
        self.local = LocalAttention(256, causal=causal, look_backward=1, look_forward=int(not causal), autopad=True)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        if is_causal != self.causal or mask is not None:
            raise ValueError(f"this peer layer was built with causal={self.causal} and takes no attn_mask")
        return self.local(q, k, v)


def build_peer(package: str, dim: int, heads: int, length: int, causal: bool) -> nn.Module:
    """A peer package's layer at the comparison's settings (linformer needs the length it is built for)."""
    if package not in PEERS:
        raise unknown_name("peer package", package, PEERS)
    if causal and package in NON_CAUSAL_PEERS:
        raise ValueError(f"{package} has no causal mode")
    if package == "performer-pytorch":
        from performer_pytorch import SelfAttention

        layer = SelfAttention(dim, heads=heads, dim_head=dim // heads, nb_features=256, causal=causal)
        return PeerAttention(layer, causal)
    if package == "linformer":
        from linformer import LinformerSelfAttention

        return PeerAttention(LinformerSelfAttention(dim, seq_len=length, k=256, heads=heads), causal)
    if package == "nystrom-attention":
        from nystrom_attention import NystromAttention

        return PeerAttention(NystromAttention(dim, dim_head=dim // heads, heads=heads, num_landmarks=256), causal)
    if package == "reformer-pytorch":
        from reformer_pytorch import LSHSelfAttention

        return PeerAttention(LSHSelfAttention(dim, heads=heads, bucket_size=64, n_hashes=4, causal=causal), causal)
    return LocalAttentionPeer(dim, heads, causal=causal)


def peer_weights(module: nn.Module) -> dict[str, Tensor]:
    """A peer layer's q, k, v and output projections under timm's names (`qkv`, `proj`), so that exact attention
    with the peer's own weights is its reference, as zoo's weights are zoo's.

    performer-pytorch and linformer keep `to_q`, `to_k`, `to_v`, `to_out`; nystrom-attention a fused `to_qkv` and
    `to_out[0]`. reformer-pytorch shares one projection between queries and keys: it has no such reference.
    """
    layer = getattr(module, "layer", module)
    if hasattr(layer, "to_qkv"):
        inputs, output = [layer.to_qkv], layer.to_out[0]
    elif all(hasattr(layer, name) for name in ("to_q", "to_k", "to_v")):
        inputs, output = [layer.to_q, layer.to_k, layer.to_v], layer.to_out
    else:
        raise ValueError(f"{type(layer).__name__} has no separate q / k / v projections to copy into exact attention")
    if any(linear.bias is not None for linear in inputs):
        raise ValueError(f"{type(layer).__name__} has q / k / v biases; the exact reference has none")
    weights = {"qkv.weight": torch.cat([linear.weight for linear in inputs]), "proj.weight": output.weight}
    return weights if output.bias is None else {**weights, "proj.bias": output.bias}
