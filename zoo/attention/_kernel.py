"""Linear attention on feature maps: `out_i = sum_j (phi_q_i . phi_k_j) v_j / sum_j (phi_q_i . phi_k_j)`.

The core every kernelised variant shares (Performer, linear attention): non-causal in two matmuls, causal by
chunked prefix sums (quadratic inside a chunk, a carried state across chunks), and a recurrent step for
token-by-token decoding that equals the causal output. `KernelStepMixin` turns that step into the module-level
decoding API (`init_state`, `decode_step`) of every kernelised variant.

Keys may carry a log-scale `m_j` (the true key feature is `exp(m_j) * phi_k_j`), so features stabilised per key
combine exactly like online softmax: weights `exp(m_j - M_i)` with `M_i` the running max, never above 1.

Letter legend: b - batch, h - heads, n - query length, m - key length, d - value dim, e - value dim + 1
(values with a ones column appended, whose output is the normaliser), r - features, k - chunks, w - chunk length.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from ._common import pad_to_multiple
from ._fla import fla_causal_kernel_attention, use_fla

__all__ = [
    "DENOMINATOR_EPS",
    "KernelState",
    "KernelStepMixin",
    "init_kernel_state",
    "kernel_attention",
    "kernel_attention_reference",
    "kernel_attention_step",
]

# (S: [b, h, r, d], z: [b, h, r], offset: [b, h]): sum_j exp(m_j - offset) phi_k_j v_j^T and phi_k_j.
KernelState = tuple[Tensor, Tensor, Tensor]

# Normaliser floor: only rows with no kept key come near it (a kept key contributes at least ~eps_feature^2).
DENOMINATOR_EPS = 1e-12


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Sums over thousands of keys lose too much in half precision: accumulate in float32 at least.
    return torch.promote_types(dtype, torch.float32)


def _finite(log_scale: Tensor) -> Tensor:
    # -inf marks keys that carry no weight; the lowest finite value keeps differences of two of them at 0, not NaN.
    return log_scale.clamp_min(torch.finfo(log_scale.dtype).min)


def _with_ones(v: Tensor) -> Tensor:
    """`[b, h, m, d]` -> `[b, h, m, e]`: the ones column turns the normaliser into one more output column."""
    return torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)


def _normalise(out: Tensor, eps: float) -> Tensor:
    """`[b, h, n, e]` -> `[b, h, n, d]`: numerator over the normaliser column, guarded for rows with no key."""
    return out[..., :-1] / out[..., -1:].clamp_min(eps)


def kernel_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    key_log_scale: Tensor | None = None,
    is_causal: bool = False,
    chunk_size: int = 128,
    eps: float = DENOMINATOR_EPS,
) -> Tensor:
    """Attention with weights `phi_q_i . phi_k_j * exp(key_log_scale_j)`, normalised over the keys.

    phi_q: `[b, h, n, r]`, phi_k: `[b, h, m, r]` (non-negative; padded keys already zero), v: `[b, h, m, d]`,
    key_log_scale: `[b, h, m]` or None (= 0; -inf gives a key no weight) -> `[b, h, n, d]` in v's dtype.

    Non-causal: `S = phi_k^T v`, `z = phi_k^T 1`, `out = phi_q S / phi_q z`, never forming `[n, m]`.
    Causal (n == m): chunks of `chunk_size` (the length is padded internally), masked quadratic attention inside
    a chunk plus the state of all earlier chunks, so memory is `[n, w]` and `[n / w, r, d]`, never `[n, r, d]`.
    With key_log_scale the weights are `exp(m_j - M_i)`, `M_i` = max of `m_j` over the keys query i sees, so
    nothing overflows and no query depends on a key it does not see.
    A row whose normaliser is below `eps` (no kept key) is divided by `eps`: zero, not NaN.
    Computed in float32 at least, with autocast off. Causal without key_log_scale on CUDA, fla's kernels compute it
    where `_fla.use_fla` allows (16-bit values by default; `ZOO_FLA=0` never, `ZOO_FLA=1` float32 values too, with
    TF32 matmuls); `chunk_size` then goes unused.
    """
    if phi_q.shape[-1] != phi_k.shape[-1] or phi_k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"phi_q {tuple(phi_q.shape)}, phi_k {tuple(phi_k.shape)} and v {tuple(v.shape)} do not fit "
            "[b, h, n, r], [b, h, m, r], [b, h, m, d]"
        )
    if is_causal and phi_q.shape[-2] != phi_k.shape[-2]:
        raise ValueError(
            f"causal kernel attention needs as many queries as keys, got {phi_q.shape[-2]} and {phi_k.shape[-2]}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size {chunk_size} must be a positive integer")
    out_dtype = v.dtype
    dtype = _compute_dtype(torch.promote_types(phi_q.dtype, v.dtype))
    # Features are exponentials: bf16 / fp16 sums over many keys would lose the normaliser, so autocast is off.
    with torch.autocast(v.device.type, enabled=False):
        # Causal without a key log-scale: fla's Triton kernels where they apply (`_fla.use_fla`, on CUDA).
        if is_causal and key_log_scale is None and use_fla(phi_q, phi_k, v):
            out = fla_causal_kernel_attention(phi_q.to(dtype), phi_k.to(dtype), v.to(dtype), eps)
            return out.to(out_dtype)
        phi_q, phi_k, v1 = phi_q.to(dtype), phi_k.to(dtype), _with_ones(v.to(dtype))
        if key_log_scale is not None:
            key_log_scale = _finite(key_log_scale.to(dtype))
        if is_causal:
            out = _causal(phi_q, phi_k, v1, key_log_scale, chunk_size)
        else:
            if key_log_scale is not None:
                weight = torch.exp(key_log_scale - key_log_scale.amax(-1, keepdim=True))
                v1 = v1 * weight[..., None]
            out = torch.matmul(phi_q, torch.matmul(phi_k.transpose(-2, -1), v1))
        return _normalise(out, eps).to(out_dtype)


def kernel_attention_reference(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    key_log_scale: Tensor | None = None,
    is_causal: bool = False,
    eps: float = DENOMINATOR_EPS,
) -> Tensor:
    """`kernel_attention` as its equation reads, the `[n, m]` weights formed: the oracle of its chunked path, of fla's
    kernels and of the variants' fast paths. O(n m) memory; computed in the inputs' dtype.

    phi_q: `[b, h, n, r]`, phi_k: `[b, h, m, r]`, v: `[b, h, m, d]`, key_log_scale: `[b, h, m]` or None
    -> `[b, h, n, d]`: `out_i = sum_j w_ij v_j / sum_j w_ij` over the keys query i sees (j <= i when causal), with
    `w_ij = phi_q_i . phi_k_j exp(m_j - M_i)`, `M_i` the largest `m_j` query i sees (it cancels; it only keeps
    the exponent at or below 0). A row whose normaliser is below `eps` (no kept key) is zero.
    """
    weights = phi_q @ phi_k.transpose(-2, -1)  # [b, h, n, m]
    seen = torch.ones(weights.shape[-2:], dtype=torch.bool, device=weights.device)
    if is_causal:
        seen = seen.tril()
    if key_log_scale is not None:
        log_scale = _finite(key_log_scale)[..., None, :].masked_fill(~seen, torch.finfo(key_log_scale.dtype).min)
        weights = weights * torch.exp(log_scale - log_scale.amax(-1, keepdim=True).detach())
    weights = weights.masked_fill(~seen, 0.0)
    return (weights @ v) / weights.sum(-1, keepdim=True).clamp_min(eps)


def _causal(phi_q: Tensor, phi_k: Tensor, v1: Tensor, log_scale: Tensor | None, chunk_size: int) -> Tensor:
    """Causal numerator and normaliser `[b, h, n, e]` by chunked prefix sums (see `kernel_attention`).

    Chunk states are kept as `[e, r]` (`v^T phi_k`): the transposed `phi_k^T v` runs slower on CPU.
    """
    n = phi_q.shape[-2]
    w = min(chunk_size, n)
    phi_q, _ = pad_to_multiple(phi_q, w)
    phi_k, _ = pad_to_multiple(phi_k, w)
    v1, _ = pad_to_multiple(v1, w)
    qc, kc, vc = (rearrange(t, "b h (k w) x -> b h k w x", w=w) for t in (phi_q, phi_k, v1))
    # [w, w]: key j of a chunk is seen by query i of the same chunk when j <= i.
    keep = torch.ones(w, w, dtype=torch.bool, device=phi_q.device).tril()
    scores = torch.matmul(qc, kc.transpose(-2, -1))
    if log_scale is None:
        intra = torch.matmul(scores.masked_fill_(~keep, 0.0), vc)
        # Per-chunk states sum_j v1_j phi_k_j^T, then an exclusive prefix sum over chunks.
        chunk_states = torch.matmul(vc.transpose(-2, -1), kc)
        states = torch.cat([torch.zeros_like(chunk_states[:, :, :1]), chunk_states[:, :, :-1].cumsum(2)], dim=2)
        return _unchunk(intra.add_(torch.matmul(qc, states.transpose(-2, -1))), n)
    floor = torch.finfo(log_scale.dtype).min
    log_scale, _ = pad_to_multiple(log_scale[..., None], w, value=floor)
    lc = rearrange(log_scale.squeeze(-1), "b h (k w) -> b h k w", w=w)
    # The stabilisers (running max M_i, chunk maxima, carried offsets) cancel between numerator and normaliser,
    # so their gradient is exactly zero: detached, the recurrence below needs no gradient for its factors.
    with torch.no_grad():
        running_max = rearrange(log_scale.squeeze(-1).cummax(-1).values, "b h (k w) -> b h k w", w=w)
        chunk_max = lc.amax(-1)
        # Offset of the state carried into chunk c: the max over all earlier chunks.
        carried = torch.cat([torch.full_like(chunk_max[..., :1], floor), chunk_max[..., :-1].cummax(-1).values], -1)
        grow = torch.exp(carried[..., :-1] - carried[..., 1:])[..., None, None]
        enter = torch.exp(chunk_max[..., :-1] - carried[..., 1:])[..., None, None]
        query_scale = torch.exp(carried[..., None] - running_max)[..., None]
    # exp(m_j - M_i) for j <= i in the chunk: <= 1, and exactly 0 above the diagonal.
    decay = torch.exp((lc[..., None, :] - running_max[..., :, None]).masked_fill_(~keep, float("-inf")))
    intra = torch.matmul(scores * decay, vc)
    # Each chunk's state relative to its own max, then carried across chunks like online softmax: the carried
    # state is rescaled by exp(old offset - new offset) whenever the max grows.
    chunk_states = torch.matmul((vc * torch.exp(lc - chunk_max[..., None])[..., None]).transpose(-2, -1), kc)
    entering = (chunk_states[:, :, :-1] * enter).unbind(2)
    state = torch.zeros_like(chunk_states[:, :, 0])
    states = [state]
    for chunk, factor in zip(entering, grow.unbind(2), strict=True):
        state = torch.addcmul(chunk, state, factor)
        states.append(state)
    inter = torch.matmul(qc, torch.stack(states, dim=2).transpose(-2, -1)).mul_(query_scale)
    return _unchunk(intra.add_(inter), n)


def _unchunk(out: Tensor, n: int) -> Tensor:
    """`[b, h, k, w, e]` -> `[b, h, n, e]`, dropping the internal padding."""
    return rearrange(out, "b h k w e -> b h (k w) e")[:, :, :n]


def kernel_attention_step(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: KernelState | None = None,
    *,
    key_log_scale: Tensor | None = None,
    eps: float = DENOMINATOR_EPS,
) -> tuple[Tensor, KernelState]:
    """One token of causal kernel attention: O(r d) time and memory whatever the position.

    phi_q, phi_k: `[b, h, r]`, v: `[b, h, d]`, key_log_scale: `[b, h]` or None; state: the previous step's
    (S `[b, h, r, d]`, z `[b, h, r]`, offset `[b, h]`), None before the first token -> out `[b, h, d]` in v's
    dtype and the new state (float32 at least). Step by step this equals `kernel_attention(is_causal=True)`.
    """
    out_dtype = v.dtype
    dtype = _compute_dtype(torch.promote_types(phi_q.dtype, v.dtype))
    with torch.autocast(v.device.type, enabled=False):
        phi_q, phi_k, v = phi_q.to(dtype), phi_k.to(dtype), v.to(dtype)
        log_scale = torch.zeros(v.shape[:-1], dtype=dtype, device=v.device)
        if key_log_scale is not None:
            log_scale = _finite(key_log_scale.to(dtype))
        if state is None:
            b, h, r = phi_k.shape
            state = init_kernel_state(b, h, r, v.shape[-1], device=v.device, dtype=dtype)
        kv, z, offset = state
        new_offset = torch.maximum(offset, log_scale)
        grow = torch.exp(offset - new_offset)[..., None]
        enter = torch.exp(log_scale - new_offset)[..., None]
        kv = kv * grow[..., None] + (enter * phi_k)[..., None] * v[..., None, :]
        z = z * grow + enter * phi_k
        num = torch.einsum("bhr,bhrd->bhd", phi_q, kv)
        den = torch.einsum("bhr,bhr->bh", phi_q, z)[..., None]
        return (num / den.clamp_min(eps)).to(out_dtype), (kv, z, new_offset)


def init_kernel_state(
    batch: int,
    heads: int,
    features: int,
    value_dim: int,
    *,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> KernelState:
    """The state before the first token: S `[b, h, r, d]` and z `[b, h, r]` zero, offset `[b, h]` at dtype's min."""
    kv = torch.zeros(batch, heads, features, value_dim, device=device, dtype=dtype)
    z = torch.zeros(batch, heads, features, device=device, dtype=dtype)
    offset = torch.full((batch, heads), torch.finfo(dtype).min, device=device, dtype=dtype)
    return kv, z, offset


class KernelStepMixin:
    """Token-by-token causal decoding for an `AttentionBase` whose causal mode is `kernel_attention`.

    The state is `(S, z, offset)` (`KernelState`, float32 at least): O(r d) per sample and head whatever the
    position, so generating a token costs the same at position 10 and 10^6. Feeding a sequence one token at
    a time through `decode_step` gives the causal forward `module(x, is_causal=True)` (same features: Performer
    in eval mode, no redraw in between). Usage, for a stack of blocks:

        states = [None] * depth
        for t in range(n):
            h = x[:, t]  # [b, c]
            for i, block in enumerate(blocks):
                out, states[i] = block.attn.decode_step(block.norm1(h), states[i])
                ...

    A variant implements `step_features` (its features for one token, exactly as its causal forward computes
    them) and `state_features` (r). The method is not called `step`: Performer and Reformer count optimizer
    steps in a `step` buffer (a checkpoint key).
    """

    state_features: int

    def step_features(self, q: Tensor, k: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """This token's features, as the causal forward computes them.

        q, k: `[b, h, 1, d]`; keep: `[b, 1]` bool or None -> phi_q, phi_k `[b, h, 1, r]` (phi_k zero where not
        kept) and the key log-scale `[b, h, 1]` (-inf where not kept) or None.
        """
        raise NotImplementedError

    def init_state(self, batch: int) -> KernelState:
        """The state before the first token of `batch` sequences, on the module's device; same as state=None."""
        weight = self.qkv.weight
        dtype = _compute_dtype(weight.dtype)
        return init_kernel_state(
            batch, self.num_heads, self.state_features, self.head_dim, device=weight.device, dtype=dtype
        )

    def decode_step(
        self, x: Tensor, state: KernelState | None = None, *, keep: Tensor | None = None
    ) -> tuple[Tensor, KernelState]:
        """One causal step, projections included.

        x: `[b, c]` or `[b, 1, c]`, the current token; state: the previous call's state or None (= `init_state`);
        keep: `[b]` bool or None, False for a padding token (e.g. left-padded prompts), which then adds nothing
        to the state. Returns the output in x's shape (`[b, c_out]` or `[b, 1, c_out]`) and the new state
        (S `[b, h, r, d]`, z `[b, h, r]`, offset `[b, h]`).
        """
        single = x.dim() == 2
        tokens = x[:, None] if single else x
        if tokens.dim() != 3 or tokens.shape[1] != 1:
            raise ValueError(f"decode_step takes one token, x of shape [b, c] or [b, 1, c]; got {tuple(x.shape)}")
        if keep is not None and keep.shape != tokens.shape[:1]:
            raise ValueError(f"keep of shape {tuple(keep.shape)} is not [{tokens.shape[0]}] (one flag per sample)")
        q, k, v = self.project_qkv(tokens)
        phi_q, phi_k, log_scale = self.step_features(q, k, None if keep is None else keep[:, None].bool())
        out, state = kernel_attention_step(
            phi_q[:, :, 0],
            phi_k[:, :, 0],
            v[:, :, 0],
            state,
            key_log_scale=None if log_scale is None else log_scale[..., 0],
        )
        out = self.project_out(out[:, :, None], tokens)
        return (out[:, 0] if single else out), state
