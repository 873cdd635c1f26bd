"""Linformer, Nystromformer, Synthesizer and softmax-one: exact limits, naive references, padding, sharing, errors."""

import copy
from functools import partial

import builders
import pytest
import torch
from torch import nn

import zoo
from zoo.attention._kernels import blocked_softmax as blocked_kernel
from zoo.attention.linformer import blocked_attention, linformer_attention, masked_softmax
from zoo.attention.nystrom import iterative_pinv, nystrom_attention, sequence_conv
from zoo.attention.softmax import softmax_attention
from zoo.attention.softmax1 import softmax1_attention

DIM, HEADS, BATCH = 32, 2, 2
HEAD_DIM = DIM // HEADS


def tokens(length: int, batch: int = BATCH, seed: int = 1) -> torch.Tensor:
    return builders.tokens(batch, length, DIM, seed)


def heads(length: int, seed: int = 0, dtype=torch.float64) -> tuple[torch.Tensor, ...]:
    """q, k, v `[b, h, n, d]` from post-LayerNorm tokens through a softmax module's projections."""
    torch.manual_seed(seed)
    q, k, v = zoo.create_attention("softmax", DIM, HEADS).project_qkv(tokens(length, seed=seed + 1))
    return tuple(t.detach().to(dtype).requires_grad_() for t in (q, k, v))


def padding(length: int, kept=(30, 20)) -> torch.Tensor:
    return builders.padded_tails(length, kept)


build = partial(builders.make, dim=DIM, heads=HEADS)


def with_softmax_weights(module: nn.Module) -> nn.Module:
    """An exact softmax module holding `module`'s qkv / proj weights."""
    softmax = build("softmax")
    softmax.load_state_dict(module.state_dict(), strict=False)
    return softmax


def grads(output: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(output.square().sum(), inputs, allow_unused=True)


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return ((approx - exact).norm() / exact.norm()).item()


# softmax1


def naive_softmax1(q, k, v, keep=None, causal=False):
    """`exp(s_j) / (1 + sum_j exp(s_j))` written out, dropped keys set to weight 0."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    allowed = torch.ones_like(scores, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if keep is not None:
        allowed = allowed & keep[:, None, None, :]
    numerator = scores.exp() * allowed
    return numerator / (1 + numerator.sum(-1, keepdim=True)) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reference", [False, True])
def test_softmax1_matches_the_naive_formula_with_gradients(reference, causal):
    q, k, v = heads(37)
    keep = padding(37)
    expected = naive_softmax1(q, k, v, keep, causal)
    out = softmax1_attention(q, k, v, keep, causal, reference=reference)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads(out, q, k, v), grads(expected, q, k, v), strict=True):
        torch.testing.assert_close(got, want)


def test_softmax1_module_fast_path_equals_reference_and_gives_little_weight_when_logits_are_low():
    fast, reference = build("softmax1"), build("softmax1", reference=True)
    keep = padding(37)
    for causal in (False, True):
        torch.testing.assert_close(fast(tokens(37), keep, causal), reference(tokens(37), keep, causal))
    # Every key of sample 1 padded: no weight anywhere, so the attention output is exactly zero (not NaN).
    q, k, v = heads(37)
    keep[1] = False
    for reference_path in (False, True):
        out = softmax1_attention(q, k, v, keep, reference=reference_path)
        assert torch.isfinite(out).all() and out[1].abs().max() == 0


# linformer


@pytest.mark.parametrize("share", ["none", "kv"])
def test_linformer_with_identity_or_permutation_projections_is_exact_attention(share):
    linformer = build("linformer", k=37, max_seq_len=37, share=share)
    softmax = with_softmax_weights(linformer)
    generator = torch.Generator().manual_seed(3)
    for projection in (torch.eye(37), torch.eye(37)[torch.randperm(37, generator=generator)]):
        with torch.no_grad():
            for param in (p for n, p in linformer.named_parameters() if n.startswith("compress")):
                param.copy_(projection)
        torch.testing.assert_close(linformer(tokens(37)), softmax(tokens(37)))


def test_linformer_uses_leading_columns_and_zeroes_padded_keys_before_projecting():
    linformer = build("linformer", k=16, max_seq_len=64)
    q, k, v = heads(37)
    keep = padding(37)
    e, f = (p.detach().double()[:, :37] for p in (linformer.compress_k, linformer.compress_v))
    # Naive: padded keys and values replaced by zero, then the projections and exact attention.
    k0, v0 = k * keep[:, None, :, None], v * keep[:, None, :, None]
    expected = softmax_attention(q, e @ k0, f @ v0, reference=True)
    out = linformer_attention(q, k, v, e, f, keep)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads(out, q, k, v), grads(expected, q, k, v), strict=True):
        torch.testing.assert_close(got, want)
    # The module at 37 of 64 positions: the pure function with the leading 37 columns.
    x = tokens(37)
    q, k, v = linformer.project_qkv(x)
    e, f = linformer.compress_k[:, :37], linformer.compress_v[:, :37]
    expected = linformer.project_out(linformer_attention(q, k, v, e, f, keep, scale=linformer.scale), x)
    torch.testing.assert_close(linformer(x, keep), expected)


def test_linformer_options_and_lengths_are_checked():
    with pytest.raises(ValueError, match="max_seq_len=64 but got a sequence of 65"):
        build("linformer", k=8, max_seq_len=64)(tokens(65))
    with pytest.raises(ValueError, match="share='heads'.*'none', 'kv', 'layerwise'"):
        build("linformer", share="heads")
    with pytest.raises(ValueError, match="k=300 must be <= max_seq_len=256"):
        build("linformer", k=300, max_seq_len=256)
    with pytest.raises(ValueError, match="no causal mode"):
        build("linformer", k=8, max_seq_len=64)(tokens(37), is_causal=True)
    assert {n for n, _ in build("linformer", share="kv").named_parameters() if n.startswith("compress")} == {"compress"}


def test_linformer_layerwise_shares_one_projection_per_model():
    tiny = {"embed_dim": DIM, "depth": 3, "num_heads": HEADS, "num_classes": 10, "in_chans": 1, "img_size": 32}
    options = {"share": "layerwise", "k": 4, "max_seq_len": 8}
    model, other = (
        zoo.create_model("vit_tiny_patch16_224", attention="linformer", attention_options=options, **tiny)
        for _ in range(2)
    )
    shared = model.blocks[0].attn.compress
    assert all(block.attn.compress is shared for block in model.blocks)
    assert other.blocks[0].attn.compress is not shared
    assert sum(p is shared for p in model.parameters()) == 1
    copied = copy.deepcopy(model)
    assert all(block.attn.compress is copied.blocks[0].attn.compress for block in copied.blocks)
    assert copied.blocks[0].attn.compress is not shared
    # A state dict repeats the shared tensor per layer and loads back into the one parameter.
    other.load_state_dict(model.state_dict())
    torch.testing.assert_close(other.blocks[2].attn.compress, shared)
    model(torch.randn(2, 1, 32, 32)).sum().backward()
    assert shared.grad is not None and shared.grad.abs().sum() > 0


# nystrom


def naive_nystrom(q, k, v, keep, num_landmarks, pinv_iterations):
    """Loops over samples and heads; landmarks are means over each segment's kept tokens, only segments that
    hold one make a landmark, and the softmaxes run over kept keys and existing landmarks only."""
    b, h, n, d = q.shape
    width = -(-n // num_landmarks)
    out = torch.zeros_like(v)
    for i in range(b):
        kept = keep[i].nonzero().flatten()
        segments = [s for s in (kept[kept // width == j] for j in range(num_landmarks)) if len(s)]
        for j in range(h):
            qs, ks, vs = q[i, j] * d**-0.5, k[i, j], v[i, j]
            q_l = torch.stack([qs[s].mean(0) for s in segments])
            k_l = torch.stack([ks[s].mean(0) for s in segments])
            kernel_1 = (qs @ k_l.T).softmax(-1)
            kernel_2 = (q_l @ k_l.T).softmax(-1)
            kernel_3 = (q_l @ ks[kept].T).softmax(-1)
            out[i, j] = kernel_1 @ iterative_pinv(kernel_2, pinv_iterations) @ kernel_3 @ vs[kept]
    return out


@pytest.mark.parametrize("length, landmarks", [(37, 8), (131, 16), (128, 16)])
def test_nystrom_matches_the_naive_per_sample_reference_with_gradients(length, landmarks):
    q, k, v = heads(length)
    # Sample 0 keeps a ragged prefix, so segments are partly and wholly padded; sample 1 keeps everything.
    keep = padding(length, kept=(length - 9, length))
    expected = naive_nystrom(q, k, v, keep, landmarks, 6)
    out = nystrom_attention(q, k, v, keep, num_landmarks=landmarks, pinv_iterations=6)
    rows = keep[:, None].expand(-1, HEADS, -1)
    torch.testing.assert_close(out[rows], expected[rows])
    loss_mask = keep[:, None, :, None]
    got = grads(out * loss_mask, q, k, v)
    want = grads(expected * loss_mask, q, k, v)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    # Without a mask (and `length` not a multiple of the landmarks: padded internally) it matches too.
    torch.testing.assert_close(
        nystrom_attention(q, k, v, num_landmarks=landmarks),
        naive_nystrom(q, k, v, torch.ones(BATCH, length, dtype=torch.bool), landmarks, 6),
    )


def test_iterative_pinv_scales_per_sample_and_converges():
    q, k, _ = heads(37)
    a = (q @ k.transpose(-2, -1) * HEAD_DIM**-0.5).softmax(-1).detach()[:, :, :8, :8].softmax(-1)
    # Sample 1 sharply peaked, sample 0 flat: very different ||A||_1, so a batch-wide initial scale would differ.
    a = torch.stack([a[0], (a[1] * 40).softmax(-1)])
    together = iterative_pinv(a, 6)
    torch.testing.assert_close(together, torch.cat([iterative_pinv(a[:1], 6), iterative_pinv(a[1:], 6)]))
    torch.testing.assert_close(iterative_pinv(a, 60), torch.linalg.pinv(a), rtol=1e-6, atol=1e-6)


def test_nystrom_with_a_landmark_per_token_tends_to_exact_attention():
    q, k, v = heads(37)
    exact = softmax_attention(q, k, v, reference=True)
    errors = [
        relative_error(nystrom_attention(q, k, v, num_landmarks=37, pinv_iterations=i), exact) for i in (2, 6, 10, 30)
    ]
    assert errors == sorted(errors, reverse=True)
    assert errors[1] < 0.08 and errors[-1] < 1e-6
    # The module computes exact attention directly when every token is its own landmark.
    nystrom = build("nystrom", conv_kernel_size=None)
    torch.testing.assert_close(nystrom(tokens(37), padding(37)), with_softmax_weights(nystrom)(tokens(37), padding(37)))


def test_nystrom_approximation_error_on_post_layernorm_inputs():
    # n = 131, d = 16, random qkv weights: attention is broad, so Nystrom's low-rank error falls with the landmarks
    # (the rank of its approximation) and, at every count, stays below plain averaging of the values, the trivial
    # rank-1 answer. Tokens and weights are seeded (the same errors on every machine up to float rounding); the
    # bounds leave a margin that other seeds stay within.
    q, k, v = heads(131)
    exact = softmax_attention(q, k, v, reference=True)
    uniform = relative_error(v.mean(-2, keepdim=True).expand_as(v), exact)
    errors = [relative_error(nystrom_attention(q, k, v, num_landmarks=r), exact) for r in (16, 32, 64)]
    assert errors == sorted(errors, reverse=True)
    assert errors[0] < 0.55 < uniform and errors[1] < 0.45 and errors[2] < 0.3


def test_nystrom_approximation_keeps_samples_and_padding_apart():
    nystrom = build("nystrom", num_landmarks=8, conv_kernel_size=5)
    x, keep = tokens(131), padding(131, kept=(100, 57))
    changed = x.clone()
    changed[1] = changed[1] * 50 + 3
    changed[0, 100:] = torch.randn(31, DIM) * 40
    out, out_changed = nystrom(x, keep), nystrom(changed, keep)
    torch.testing.assert_close(out[0, :100], out_changed[0, :100], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out_changed).all()


def test_nystrom_options_are_checked():
    for options, message in [
        ({"num_landmarks": 0}, "num_landmarks=0"),
        ({"conv_kernel_size": 4}, "must be odd"),
        ({"pinv_iterations": -1}, "pinv_iterations=-1"),
    ]:
        with pytest.raises(ValueError, match=message):
            build("nystrom", **options)
    assert build("nystrom", conv_kernel_size=0).conv is None


# synthesizer

SYNTH_CONFIGS = [
    {"mode": "dense"},
    {"mode": "dense", "factorized": True},
    {"mode": "random"},
    {"mode": "random", "factorized": True},
    {"mode": "dense", "mix": 0.5},
    {"mode": "random", "factorized": True, "mix": 0.3},
]


@pytest.mark.parametrize("options", SYNTH_CONFIGS, ids=lambda o: "-".join(map(str, o.values())))
def test_synthesizer_fast_path_equals_reference_with_gradients(options):
    fast = build("synthesizer", max_seq_len=64, **options)
    reference = build("synthesizer", max_seq_len=64, reference=True, **options)
    reference.load_state_dict(fast.state_dict())
    keep = padding(37)
    for causal in (False, True):
        out, expected = fast(tokens(37), keep, causal), reference(tokens(37), keep, causal)
        torch.testing.assert_close(out, expected)
        names = [name for name, _ in fast.named_parameters()]
        for name, got, want in zip(
            names, grads(out, *fast.parameters()), grads(expected, *reference.parameters()), strict=True
        ):
            torch.testing.assert_close(got, want, msg=name)


def test_synthesizer_logits_follow_the_paper():
    x = tokens(37)
    # Dense: softmax(W2 relu(W1 q_i + b1) + b2) over the first n of max_seq_len outputs.
    dense = build("synthesizer", max_seq_len=64)
    q, _, v = dense.project_qkv(x)
    hidden = torch.relu(q @ dense.synth_w1 + dense.synth_b1[:, None])
    logits = hidden @ dense.synth_w2[..., :37] + dense.synth_b2[:, None, :37]
    torch.testing.assert_close(dense(x), dense.project_out(logits.softmax(-1) @ v, x))
    # Factorized dense: 64 = 8 x 8 logits tiled as A[j mod 8] * B[j div 8].
    factorized = build("synthesizer", max_seq_len=64, factorized=True)
    q, k, _ = factorized.project_qkv(x)
    hidden = torch.relu(q @ factorized.synth_w1 + factorized.synth_b1[:, None])
    a, b = (hidden @ factorized.synth_w2 + factorized.synth_b2[:, None]).split([8, 8], dim=-1)
    tiled = torch.stack([a[..., j % 8] * b[..., j // 8] for j in range(37)], dim=-1)
    torch.testing.assert_close(factorized.logits(q, k), tiled)
    # Random: the leading n x n block of R; factorized: R1 R2^T; fixed: buffers, not parameters.
    random = build("synthesizer", mode="random", max_seq_len=64)
    q, k, v = random.project_qkv(x)
    weights = random.random_logits[:, :37, :37].softmax(-1)
    torch.testing.assert_close(random(x), random.project_out(weights @ v, x))
    fixed = build("synthesizer", mode="random", factorized=True, fixed_random=True, rank=4, max_seq_len=64)
    assert {n for n, _ in fixed.named_buffers()} == {"random_left", "random_right"}
    assert not any(n.startswith("random") for n, _ in fixed.named_parameters())
    torch.testing.assert_close(fixed.logits(q, k)[0], fixed.random_left[:, :37] @ fixed.random_right[:, :37].mT)


@pytest.mark.parametrize("reference", [False, True])
def test_synthesizer_fully_mixed_towards_dot_products_is_exact_attention(reference):
    synthesizer = build("synthesizer", max_seq_len=64, mix=1.0, reference=reference)
    softmax = with_softmax_weights(synthesizer)
    keep = padding(37)
    for causal in (False, True):
        torch.testing.assert_close(synthesizer(tokens(37), keep, causal), softmax(tokens(37), keep, causal))
    torch.testing.assert_close(synthesizer.mix_weight, torch.ones(HEADS))


@pytest.mark.parametrize("options", SYNTH_CONFIGS[1:4], ids=lambda o: "-".join(map(str, o.values())))
def test_synthesizer_masks_padding_and_the_future_in_every_mode(options):
    synthesizer = build("synthesizer", max_seq_len=64, **options)
    x, keep = tokens(37), padding(37)
    changed = x.clone()
    changed[~keep] = torch.randn(int((~keep).sum()), DIM) * 40
    torch.testing.assert_close(synthesizer(x, keep)[keep], synthesizer(changed, keep)[keep])
    changed = x.clone()
    changed[:, 20:] = torch.randn(BATCH, 17, DIM) * 40
    torch.testing.assert_close(synthesizer(x, is_causal=True)[:, :20], synthesizer(changed, is_causal=True)[:, :20])


def test_synthesizer_options_and_lengths_are_checked():
    with pytest.raises(ValueError, match="max_seq_len=64 but got a sequence of 65"):
        build("synthesizer", max_seq_len=64)(tokens(65))
    for options, message in [
        ({"mode": "sparse"}, "mode='sparse'"),
        ({"fixed_random": True}, "fixed_random"),
        ({"mix": 1.5}, "mix=1.5"),
        ({"rank": 0}, "rank=0"),
    ]:
        with pytest.raises(ValueError, match=message):
            build("synthesizer", **options)
    assert not hasattr(build("synthesizer", mix=0), "mix_weight")


@pytest.mark.parametrize("length, landmarks", [(37, 8), (131, 16), (128, 16)])
def test_nystrom_blocked_equals_the_explicit_kernels_with_gradients(length, landmarks, monkeypatch):
    # Small blocks: several query and key blocks, online softmax across key blocks, ragged last blocks.
    monkeypatch.setattr(blocked_kernel, "_BLOCK_BYTES", 8 * HEADS * BATCH * 13 * 8)
    monkeypatch.setattr(blocked_kernel, "_MAX_KEY_BLOCK", 13)
    q, k, v = heads(length)
    for keep in (None, padding(length, kept=(length - 9, length))):
        blocked = nystrom_attention(q, k, v, keep, num_landmarks=landmarks)
        reference = nystrom_attention(q, k, v, keep, num_landmarks=landmarks, reference=True)
        rows = slice(None) if keep is None else keep[:, None].expand(-1, HEADS, -1)
        torch.testing.assert_close(blocked[rows], reference[rows])
        loss_mask = 1.0 if keep is None else keep[:, None, :, None]
        for g, w in zip(grads(blocked * loss_mask, q, k, v), grads(reference * loss_mask, q, k, v), strict=True):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("masked", [False, True])
def test_blocked_attention_equals_masked_softmax_with_gradients(masked, monkeypatch):
    monkeypatch.setattr(blocked_kernel, "_BLOCK_BYTES", 8 * HEADS * BATCH * 7 * 8)
    monkeypatch.setattr(blocked_kernel, "_MAX_KEY_BLOCK", 7)
    for n, m in ((37, 5), (5, 37), (40, 41)):
        q, k, v = (
            torch.randn(BATCH, HEADS, length, 6, dtype=torch.float64, requires_grad=True) for length in (n, m, m)
        )
        keep = None
        if masked:  # sample 0 keeps half its keys, sample 1 none (its output is zero, not NaN)
            keep = torch.ones(BATCH, m, dtype=torch.bool)
            keep[0, m // 2 :], keep[1] = False, False
        out = blocked_attention(q, k, v, keep)
        expected = masked_softmax(q @ k.transpose(-2, -1), None if keep is None else keep[:, None, None, :]) @ v
        torch.testing.assert_close(out, expected)
        for g, w in zip(grads(out, q, k, v), grads(expected, q, k, v), strict=True):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("n,taps", [(1, 3), (37, 5), (64, 33), (200, 33), (130, 1)])
def test_sequence_conv_equals_the_depthwise_conv2d(n, taps):
    """The Toeplitz-block convolution is nn.Conv2d(h, h, (t, 1), groups=h) with zero padding: values and the
    gradients of the input and the taps, for lengths shorter than, equal to and not a multiple of a block."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 3, (taps, 1), padding=(taps // 2, 0), groups=3, bias=False).double()
    x = torch.randn(2, 3, n, 4, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 3, n, 4, dtype=torch.float64)
    want = conv(x)
    got = sequence_conv(x, conv.weight[:, 0, :, 0])
    torch.testing.assert_close(got, want)
    grads_want = torch.autograd.grad(want, (x, conv.weight), grad)
    grads_got = torch.autograd.grad(got, (x, conv.weight), grad)
    for a, b in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(a, b)
