"""What the linear family's feature maps share: their names (`Feature`) and the random projections of the
random-feature maps.

Each map phi, with q.k ~ phi(q).phi(k), is defined once, in its variant's file: linear attention's elu + 1
(`linear.elu_feature_map`), FAVOR+'s positive random features and generalized attention's relu features
(`performer.softmax_kernel_features`, `performer.relu_kernel_features`), Hedgehog's learned softmax features
(`hedgehog.hedgehog_features`). `Feature` names them for the fused kernels, which compute them in registers
(`_kernels.fused_linear`); `_kernel.py` turns features into attention outputs.

Random projections (`random_projection`, one of `PROJECTIONS`): block-orthogonal gaussian (FAVOR+ "ORF"), iid
gaussian, and structured orthogonal Hadamard blocks (SORF, Yu et al. 2016, https://arxiv.org/abs/1610.09072).

Letter legend: b - batch, h - heads, n - sequence length, d - head dim, r - features.
"""

from __future__ import annotations

import enum
import math
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

__all__ = [
    "PROJECTIONS",
    "Feature",
    "gaussian_orthogonal_random_matrix",
    "gaussian_random_matrix",
    "hadamard_random_matrix",
    "random_projection",
]


class Feature(enum.IntEnum):
    """The linear family's feature maps, as the fused kernels take them (their `KIND` constexpr)."""

    ELU = 0  # linear attention's elu(x) + 1
    FAVOR = 1  # FAVOR+'s positive random features of the softmax kernel
    RELU = 2  # generalized attention's relu random features
    HEDGEHOG = 3  # Hedgehog's learned [softmax(W x), softmax(-W x)]


PROJECTIONS = ("orthogonal", "gaussian", "hadamard")
SCALINGS = ("chi", "sqrt_d")


def _check_matrix_args(nb_rows: int, nb_cols: int, scaling: str) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"scaling {scaling!r} is not one of {', '.join(map(repr, SCALINGS))}")
    if nb_rows < 1 or nb_cols < 1:
        raise ValueError(f"nb_rows {nb_rows} and nb_cols {nb_cols} must both be positive")


def _row_norms(directions: Tensor, scaling: str, generator: torch.Generator | None) -> Tensor:
    """Unit rows `[r, d]` (float64) -> rows of norm `chi_d` (a fresh gaussian vector's norm) or `sqrt(d)`."""
    nb_rows, nb_cols = directions.shape
    if scaling == "chi":
        norms = torch.randn(nb_rows, nb_cols, generator=generator, dtype=torch.float64).norm(dim=1)
    else:
        norms = torch.full((nb_rows,), math.sqrt(nb_cols), dtype=torch.float64)
    return directions * norms[:, None]


def gaussian_orthogonal_random_matrix(
    nb_rows: int,
    nb_cols: int,
    *,
    scaling: Literal["chi", "sqrt_d"] = "chi",
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Block-orthogonal gaussian projection `[nb_rows, nb_cols]` (FAVOR+ "ORF").

    Rows come in blocks of `nb_cols` exactly orthogonal directions (QR of a gaussian `nb_cols x nb_cols` matrix,
    signs fixed so the directions are Haar-distributed); the last block is truncated. Row norms are redrawn:
    `scaling="chi"` gives each row the norm of a fresh gaussian `nb_cols`-vector (chi distribution, so every
    row is marginally gaussian, the unbiased estimator), `"sqrt_d"` gives every row norm `sqrt(nb_cols)`.

    Everything is drawn on the CPU in float64 from `generator` (a CPU generator; None = torch's global RNG)
    and only then moved to `device` / `dtype`, so one seed gives the same matrix on every device.
    """
    _check_matrix_args(nb_rows, nb_cols, scaling)
    nb_blocks = -(-nb_rows // nb_cols)
    gaussian = torch.randn(nb_blocks, nb_cols, nb_cols, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    # QR's sign convention biases the directions; multiplying by sign(diag(r)) makes q Haar-distributed.
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    matrix = q.transpose(-2, -1).reshape(nb_blocks * nb_cols, nb_cols)[:nb_rows]
    return _row_norms(matrix, scaling, generator).to(device=device, dtype=dtype or torch.get_default_dtype())


def gaussian_random_matrix(
    nb_rows: int,
    nb_cols: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """iid N(0, 1) projection `[nb_rows, nb_cols]` (the plain random features), drawn like the orthogonal one."""
    _check_matrix_args(nb_rows, nb_cols, "chi")
    matrix = torch.randn(nb_rows, nb_cols, generator=generator, dtype=torch.float64)
    return matrix.to(device=device, dtype=dtype or torch.get_default_dtype())


def fast_walsh_hadamard(x: Tensor) -> Tensor:
    """Unnormalised Walsh-Hadamard transform `H x` of the last dim (a power of 2, p): log2(p) butterflies.

    `x: [..., p]` -> `[..., p]`; H has entries +-1, so `H H = p I`.
    """
    p = x.shape[-1]
    if p & (p - 1):
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-2 length, got {p}")
    half = 1
    while half < p:
        pairs = rearrange(x, "... (k two w) -> ... k two w", two=2, w=half)
        a, b = pairs.unbind(-2)
        x = rearrange(torch.stack((a + b, a - b), dim=-2), "... k two w -> ... (k two w)")
        half *= 2
    return x


def hadamard_random_matrix(
    nb_rows: int,
    nb_cols: int,
    *,
    scaling: Literal["chi", "sqrt_d"] = "sqrt_d",
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Structured orthogonal random features (SORF) `[nb_rows, nb_cols]`, https://arxiv.org/abs/1610.09072.

    Each block is `sqrt(p) H D1 H D2 H D3` with H the normalised `p x p` Hadamard matrix (p = nb_cols rounded
    up to a power of 2) and D_i random +-1 diagonals: p orthogonal rows of norm sqrt(p), the cheap stand-in for
    a Haar rotation. Blocks are stacked to reach nb_rows; the columns are truncated to nb_cols (the same as
    zero-padding the head dim to p), which leaves every entry with variance 1. The block is materialised by
    pushing the identity through the fast transform, O(p^2 log p) per block instead of a QR's O(p^3).

    `scaling="sqrt_d"` (default, the paper's SORF) keeps those rows as they are: exactly orthogonal with norm
    sqrt(nb_cols) when nb_cols is a power of 2, mean squared norm nb_cols otherwise. `"chi"` keeps the
    directions and gives each row a fresh chi-distributed norm, a gaussian vector's norm law (FAVOR+'s choice).
    Fixed norms estimate the softmax kernel with less variance for a small bias.
    Drawn on the CPU in float64 from `generator`, then moved, like `gaussian_orthogonal_random_matrix`.
    """
    _check_matrix_args(nb_rows, nb_cols, scaling)
    p = 1 << (nb_cols - 1).bit_length()
    nb_blocks = -(-nb_rows // p)
    signs = torch.randint(0, 2, (3, nb_blocks, 1, p), generator=generator, dtype=torch.float64) * 2 - 1
    # Row j of `rows` is (H D1 H D2 H D3 e_j)^T, i.e. column j of the block: transposed below.
    rows = torch.eye(p, dtype=torch.float64).expand(nb_blocks, p, p)
    for sign in signs.flip(0):
        rows = fast_walsh_hadamard(rows * sign)
    # Three unnormalised transforms carry p^(3/2); sqrt(p) H D1 H D2 H D3 needs p^(1/2): divide by p.
    blocks = rows.transpose(-2, -1) / p
    matrix = rearrange(blocks, "k r d -> (k r) d")[:nb_rows, :nb_cols]
    if scaling == "chi":
        matrix = _row_norms(F.normalize(matrix, dim=1), scaling, generator)
    return matrix.to(device=device, dtype=dtype or torch.get_default_dtype())


def random_projection(
    kind: Literal["orthogonal", "gaussian", "hadamard"],
    nb_rows: int,
    nb_cols: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """A `[nb_rows, nb_cols]` random-feature projection of `kind`, one of `PROJECTIONS`.

    orthogonal: block-orthogonal gaussian rows with chi norms; gaussian: iid N(0, 1); hadamard: SORF blocks
    (rows of norm ~sqrt(nb_cols)). A pure function of the generator's state, drawn on the CPU.
    """
    if kind not in PROJECTIONS:
        raise ValueError(f"projection {kind!r} is not one of {', '.join(map(repr, PROJECTIONS))}")
    if kind == "gaussian":
        return gaussian_random_matrix(nb_rows, nb_cols, generator=generator, device=device, dtype=dtype)
    draw = gaussian_orthogonal_random_matrix if kind == "orthogonal" else hadamard_random_matrix
    return draw(nb_rows, nb_cols, generator=generator, device=device, dtype=dtype)
