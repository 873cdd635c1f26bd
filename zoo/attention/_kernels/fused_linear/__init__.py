"""Fused GPU kernels (Triton) for non-causal kernelised attention: `phi(q) (phi(k)^T v) / (phi(q) . sum phi(k))`.

One op for the linear family's non-causal mode (`linear`'s elu + 1, `performer`'s FAVOR+ softmax and relu
kernels, `hedgehog`'s learned softmax features), in the shape of fla-org's flash-bidirectional-linear-attention
(read for the algorithm only): two forward kernels, the state `S = phi(K)^T V` with the key sum `z = phi(K)^T 1`,
then `O = phi(Q) S / (phi(Q) z)`, and two backward kernels, one over the queries (`dQ`, and `dS`, `dz` by
reduction), one over the keys (`dK`, `dV`). The feature map is computed inside every kernel, from q or k as they
come out of the qkv projection (bf16 or fp32, strided views, no copy), in fp32 registers: the `[b, h, n, r]`
features never reach memory, in forward or backward. Saved for backward: q, k, v, the output (written in the
`[b, n, h, d]` layout that `proj` takes as a view, so the two share it), FAVOR's per-head key offset, and the
`[r, e]` state with the key sum where they are no larger than SDPA's log-sum-exp (`op.saves_state`; else the
backward recomputes them from k and v): never more than SDPA keeps.

FAVOR's and RELU's features past 64 are held 64 at a time (HEDGEHOG's, when `ZOO_FUSED_CONFIG` asks, by halves,
one softmax each): the state kernel and the gradient sums take one chunk a program, the query and key kernels loop
over the chunks, and FAVOR's query stabiliser (the max over all features) is carried across chunks as online
softmax carries its max. Whole, in triton's three pipeline stages, 256 random features overflow an H100's or
H200's shared memory in the query backward; in chunks they fit (`benchmarks/cpu/kernel_resources_sm90.md`, from
`tools/dev/kernel_resources.py`, which compiles the kernels for sm_90 without a GPU, as a launch specialises them).

The kernels are plain `@triton.jit` (no autotuning), so they run on CPU tensors under `TRITON_INTERPRET=1`, which
is how the suite tests them against the torch paths. Reductions over the sequence (the state, its gradient,
hedgehog's map gradients) are split over programs and added with fp32 atomics: the summation order, and so the
last bits, vary from run to run on a GPU.

The modules, by role: `kernels` (the Triton kernels), `plan` (block sizes and the `ZOO_FUSED_CONFIG` parser),
`launch` (forward and backward launches, retried smaller where a GPU refuses one), `interpreter` (the patch
Triton's interpreter needs), `op` (the custom op, its autograd, and the entry point). Chosen automatically for
CUDA tensors by the variants (`fused_usable`, through `_paths.choose_path`); `ZOO_FUSED=0` turns it off.

Feature maps (`Feature`), x being a query or key row `[d]`, P the projection `[d, r]` (already scaled):
    ELU       phi = elu(x) + 1                                              (r = d)
    FAVOR     phi = exp(x P - |x|^2 / (2 sqrt(d)) - offset - log(r) / 2) + eps / sqrt(r)
              offset: a query row's max of x P; for keys, the max of k P over the (sample, head)'s kept keys
    RELU      phi = relu(x P) / sqrt(r) + eps
    HEDGEHOG  phi = [softmax(x W), softmax(-x W)], P = [W, -W] per head     (r = 2 f)
Padded keys get phi = 0.

Letter legend: b - batch, h - heads, n - length, d - head dim, e - value dim, r - features, c - features in a chunk,
w - rows in a tile.
"""

from ..._features import Feature
from .op import force_fused, fused_kernel_attention, fused_usable

__all__ = ["Feature", "force_fused", "fused_kernel_attention", "fused_usable"]
