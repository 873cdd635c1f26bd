"""LSH attention: "Reformer: The Efficient Transformer" (Kitaev et al. 2020), https://arxiv.org/abs/2001.04451

Shared-QK attention restricted by angular locality-sensitive hashing. Keys are the L2-normalised queries (the
module keeps timm's `qkv` weights so checkpoints copy, but only the q and v rows are used). Each of `n_hashes`
rounds hashes every position with a random rotation R, `h(x) = argmax([xR; -xR])`, into `n_buckets` buckets
(`length / bucket_size` rounded up to even, as in the paper); positions are sorted by (bucket, position), cut
into chunks of `bucket_size`, and each chunk attends to itself and the chunk before it (the paper's
`floor(s_i / m) - 1 <= floor(s_j / m) <= floor(s_i / m)`: chunk 0 has none before it). A query attends to itself
only when nothing else is visible (its logit is set to -5e4). Rounds are combined by their log-sum-exp weights;
with `count_duplicates` (the paper's eq. 6: a key that a query sees in N rounds gets logit - log N in each) the
result is exact softmax over the union of the keys a query saw in any round. The length is padded internally to
a multiple of `bucket_size`; padded positions and masked keys are hashed into a bucket after all real ones and
masked, so they never receive weight.

Causal mode keeps the causal part of the paper's rule with one more restriction: a query sees the keys of its
own bucket at earlier (or equal) positions at most `bucket_size` places back in the sorted order, i.e. the
previous `bucket_size` positions of its bucket. That set depends only on the past (for a given length, which sets
the bucket count); the paper's chunk boundaries move with the hashes of later positions, so future tokens would
decide which past keys a query sees.

`lsh_reference` writes the rules out on dense `[n, n]` matrices with one softmax over the union of the rounds,
O(n^2): the tests' oracle, and the path under `torch.export`. The kernel path (`_kernels.reformer`) evaluates them
with integer arithmetic on blocks of chunks, in an autograd function that saves the attention weights, never
logits or masks.

Letter legend: b - batch, h - heads, r - hash rounds, n - length (padded: l), t - chunks of all rounds and heads,
w - chunk length (`bucket_size`), s - keys a chunk sees (2w, or w with one chunk), d - head dim, u - buckets / 2.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from ._common import AttentionBase, pad_to_multiple
from ._kernels import reformer as lsh_kernel
from ._kernels.reformer import SELF_LOGIT, ChunkLayout, LSHAttention
from ._paths import Path, choose_path
from ._registry import register_attention
from ._seeded import SeedStepMixin

__all__ = ["SELF_LOGIT", "ReformerAttention", "lsh_attention", "lsh_bucket_count", "lsh_buckets", "lsh_reference"]

# Columns per group in the two-level argmax of the hash.
GROUP = 8


def lsh_bucket_count(length: int, bucket_size: int) -> int:
    """Buckets for `length` positions: one per `bucket_size` positions, rounded up to even (one if it fits)."""
    chunks = -(-length // bucket_size)
    return 1 if chunks == 1 else chunks + chunks % 2


def _signed_argmax(x: Tensor, half: int) -> Tensor:
    """`argmax([x; -x])` over the columns of `x: [..., groups, GROUP]` whose column j repeats column j % half (+ half
    for -x) -> `[...]`, in two levels: max / min per group (fast value reductions), the winning group, the column
    inside it. A repeat computed by the matmul may differ from its original in the last bit and win, so the winner
    is folded back to its original column."""
    high, low = x.amax(-1), x.amin(-1)
    group = torch.maximum(high, low.neg()).argmax(-1, keepdim=True)
    positive = high.gather(-1, group) >= -low.gather(-1, group)
    inside = x.gather(-2, group[..., None].expand(*group.shape, x.shape[-1])).squeeze(-2)
    column = torch.where(positive, inside.argmax(-1, keepdim=True), inside.argmin(-1, keepdim=True))
    return ((group * x.shape[-1] + column) % half + half * ~positive).squeeze(-1)


def lsh_buckets(qk: Tensor, rotations: Tensor, keep: Tensor | None = None) -> Tensor:
    """Angular LSH, `argmax([xR; -xR])` in every round.

    qk: `[b, h, n, d]`; rotations: `[h, r, d, u]` (n_buckets = 2u; u = 0 means one bucket); keep: `[b, n]` bool
    or None -> buckets `[b, h, r, n]` int64 in `[0, n_buckets)`; positions with keep False get bucket
    `max(2u, 1)`, after every real one. No gradient flows through the hash.
    """
    b, h, n, _ = qk.shape
    rounds, half = rotations.shape[1], rotations.shape[-1]
    buckets = qk.new_zeros((b, h, n, rounds), dtype=torch.long)
    with torch.no_grad():
        if half:
            # [h, d, r, u'] with u' a multiple of GROUP: extra columns repeat the first ones (folded back by
            # _signed_argmax), so buckets stay in [0, 2u).
            columns = torch.arange(half + -half % GROUP, device=rotations.device) % half
            weight = rotations[..., columns].to(qk.dtype).permute(0, 2, 1, 3).flatten(2)
            step = max(1, lsh_kernel.BLOCK_SCORES // (b * h * weight.shape[-1]))
            for start in range(0, n, step):
                rotated = torch.matmul(qk[:, :, start : start + step], weight).unflatten(-1, (rounds, -1, GROUP))
                buckets[:, :, start : start + step] = _signed_argmax(rotated, half)
        buckets = buckets.transpose(-1, -2)
        if keep is not None:
            buckets = buckets.masked_fill(~keep[:, None, None, :], max(2 * half, 1))
    return buckets.contiguous()


def lsh_reference(
    q: Tensor,
    v: Tensor,
    buckets: Tensor,
    *,
    bucket_size: int,
    n_buckets: int,
    is_causal: bool,
    count_duplicates: bool,
    scale: float,
    dropout_p: float = 0.0,
) -> Tensor:
    """The rules on dense `[l, l]` matrices, O(n^2): per round who meets whom, then one softmax over the union of
    the rounds (each key once with count_duplicates, else once per round it is met in).

    q, v: `[b, h, l, d]` with l a multiple of `bucket_size`; buckets: `[b, h, r, l]` (`lsh_buckets`, padded and
    masked positions in bucket `n_buckets`) -> `[b, h, l, d]`.
    """
    w, length = bucket_size, q.shape[-2]
    order = buckets.sort(dim=-1, stable=True).indices
    # Each position's place in its round's order by (bucket, position).
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(length, device=q.device).expand_as(order))
    meets = torch.zeros(q.shape[:2] + (length, length), dtype=q.dtype, device=q.device)
    for round_ in range(buckets.shape[2]):
        bucket_q, bucket_k = buckets[:, :, round_, :, None], buckets[:, :, round_, None, :]
        rank_q, rank_k = rank[:, :, round_, :, None], rank[:, :, round_, None, :]
        if is_causal:
            meets += (bucket_q == bucket_k) & (rank_q - rank_k >= 0) & (rank_q - rank_k <= w)
        else:
            # Own chunk or the one before (chunk 0 has none), and never a padded key.
            chunk_gap = rank_q.div(w, rounding_mode="floor") - rank_k.div(w, rounding_mode="floor")
            meets += (chunk_gap >= 0) & (chunk_gap <= 1) & (bucket_k != n_buckets)
    scores = (q * scale) @ F.normalize(q, dim=-1).transpose(-1, -2)
    scores = scores.masked_fill(torch.eye(length, dtype=torch.bool, device=q.device), SELF_LOGIT)
    if not count_duplicates:
        scores = scores + meets.clamp_min(1).log()
    # Padded and masked queries meet nobody: their rows stay finite (their outputs are unspecified).
    scores = scores.masked_fill((meets == 0) & meets.any(-1, keepdim=True), float("-inf"))
    return F.dropout(scores.softmax(-1), dropout_p) @ v


def lsh_attention(
    qk: Tensor,
    v: Tensor,
    rotations: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    bucket_size: int = 64,
    scale: float | None = None,
    count_duplicates: bool = True,
    dropout_p: float = 0.0,
    reference: bool = False,
) -> Tensor:
    """Shared-QK LSH attention (see the module docstring).

    qk: `[b, h, n, d]` (queries; keys are `qk / |qk|`), v: `[b, h, n, d]`; rotations: `[h, r, d, u]` with
    `2u = lsh_bucket_count(n, bucket_size)` (u = 0 for one bucket) and r hash rounds; mask: `[b, n]` bool key
    padding mask, True = keep -> `[b, h, n, d]` in v's dtype (outputs at masked positions are finite but
    meaningless). Logits are `scale * q_i . k_j`, scale = d^-1/2 by default. Computed in float32 at least.
    `reference=True`, and under `torch.export` (whose tracing refuses the kernel's `out=` workspaces):
    `lsh_reference` instead of the blocked kernel.
    """
    b, h, n, d = qk.shape
    w, rounds = bucket_size, rotations.shape[1] if rotations.dim() == 4 else 0
    length = n + (-n % w)
    n_buckets = lsh_bucket_count(length, w)
    if rotations.shape != (h, rounds, d, n_buckets // 2) or rounds < 1:
        raise ValueError(
            f"rotations of shape {tuple(rotations.shape)} do not fit [heads={h}, rounds>=1, head_dim={d}, "
            f"n_buckets/2={n_buckets // 2}] for length {n} and bucket_size {w}"
        )
    scale = d**-0.5 if scale is None else scale
    out_dtype = v.dtype
    # Logits, exponentials and normalisers in float32 at least: bf16 would lose the normaliser.
    with torch.autocast(qk.device.type, enabled=False):
        dtype = torch.promote_types(v.dtype, torch.float32)
        q, _ = pad_to_multiple(qk.to(dtype), w)
        v, _ = pad_to_multiple(v.to(dtype), w)
        keep = mask
        if length != n:
            keep = torch.zeros(b, length, dtype=torch.bool, device=q.device)
            keep[:, :n] = True if mask is None else mask
        buckets = lsh_buckets(q, rotations, keep)
        # The kernel is the only fast path; under torch.export (`choose_path`'s torch path) the reference runs.
        if choose_path(q, reference=reference, kernel=lambda: True) is Path.KERNEL:
            layout = ChunkLayout.build(buckets, w, n_buckets, is_causal, count_duplicates)
            q, v = (x.reshape(b * h * length, d) for x in (q, v))
            out = LSHAttention.apply(q, v, layout, scale, dropout_p)
        else:
            out = lsh_reference(
                q,
                v,
                buckets,
                bucket_size=w,
                n_buckets=n_buckets,
                is_causal=is_causal,
                count_duplicates=count_duplicates,
                scale=scale,
                dropout_p=dropout_p,
            )
    return out.view(b, h, length, d)[:, :, :n].to(out_dtype)


@register_attention("reformer")
class ReformerAttention(SeedStepMixin, AttentionBase):
    """Reformer LSH attention with timm's projections; shared QK (the k rows of `qkv` and `k_norm` are unused).

    Options: `n_hashes` hash rounds (4: reformer-pytorch's default and the paper's main LSH setting),
    `bucket_size` (64, the paper's), `count_duplicates` (True: the paper's eq. 6 duplicate correction; False:
    reformer-pytorch's default, where a key seen in several rounds counts several times), `reference` (False: the
    blocked fast path; True: the O(n^2) dense reference, for tests).

    Rotations are drawn in every forward on the module's device as a pure function of (`seed`, `step`),
    `SeedStepMixin`'s persistent buffers (`seeded_normal`: no host sync, the same values on every device): `seed`
    is drawn once from torch's global RNG at construction, `step` counts optimizer steps
    (`zoo.attention.on_optimizer_step(model)`, which the training engine calls). So every training step hashes with
    fresh rotations (training never depends on one fixed hash), and all forwards within a step (gradient
    accumulation, activation recomputation, data-parallel replicas, evaluation) use the same ones. Rotations are
    per head and shared by the samples of a batch; each sample is hashed and attended on its own.
    """

    supports_causal = True
    has_attention_weights = True
    test_options: ClassVar[dict] = {"bucket_size": 8}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        n_hashes: int = 4,
        bucket_size: int = 64,
        count_duplicates: bool = True,
        reference: bool = False,
        **timm_args: Any,
    ) -> None:
        check_int("n_hashes", n_hashes, 1)
        check_int("bucket_size", bucket_size, 1)
        check_bool("count_duplicates", count_duplicates)
        check_bool("reference", reference)
        super().__init__(dim, num_heads, **timm_args)
        self.n_hashes, self.bucket_size = n_hashes, bucket_size
        self.count_duplicates, self.reference = count_duplicates, reference
        self.register_seed_and_step(self.factory_kwargs["device"])

    def rotations(self, length: int) -> Tensor:
        """Random rotations `[h, r, d, n_buckets / 2]` (float32) for `length` positions at the current step, drawn
        on the buffers' device from (`seed`, `step`) with no host sync: the same values on every device."""
        half = lsh_bucket_count(length + (-length % self.bucket_size), self.bucket_size) // 2
        return self.seeded_normal(self.step, (self.num_heads, self.n_hashes, self.head_dim, half), torch.float32)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`x: [b, n, c]` -> (qk, qk, v), each `[b, h, n, d]`: only the q and v rows of `qkv` are computed."""
        weight = self.qkv.weight.unflatten(0, (3, -1))[0::2].flatten(0, 1)
        bias = None if self.qkv.bias is None else self.qkv.bias.unflatten(0, (3, -1))[0::2].flatten()
        qk, v = F.linear(x, weight, bias).unflatten(-1, (2, self.num_heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)
        qk = self.q_norm(qk)
        return qk, qk, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """Shared QK: `k` is ignored, the keys are the normalised `q`."""
        options = {
            "bucket_size": self.bucket_size,
            "count_duplicates": self.count_duplicates,
            "reference": self.reference,
        }
        dropout_p = self.attn_drop.p if self.training else 0.0
        return lsh_attention(
            q, v, self.rotations(q.shape[-2]), mask, is_causal, scale=self.scale, dropout_p=dropout_p, **options
        )

    def extra_repr(self) -> str:
        options = (
            f"bucket_size={self.bucket_size}, count_duplicates={self.count_duplicates}, reference={self.reference}"
        )
        return f"{super().extra_repr()}, n_hashes={self.n_hashes}, {options}"
