"""Quadratic reference shared by the kernel-attention tests (linear attention, Performer)."""

import torch


def naive_kernel_attention(phi_q, phi_k, v, key_log_scale=None, is_causal=False):
    """Quadratic reference: weights phi_q . phi_k * exp(key_log_scale), masked, normalised over the keys."""
    weights = phi_q @ phi_k.transpose(-2, -1)
    if key_log_scale is not None:
        weights = weights * key_log_scale.exp()[..., None, :]
    if is_causal:
        n = phi_q.shape[-2]
        weights = weights.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), 0.0)
    return (weights @ v) / weights.sum(-1, keepdim=True)
