"""The blocked local / sparse families: local, dilated, sparse, longformer, bigbird.

Each blocked function is checked against a naive reference (a dense [n, n] allowed mask built from the paper's
definition, fed to exact softmax) on outputs and every gradient, at odd lengths that do not divide the blocks, with
several blocks in play; then the exact limits, padding, causality and the approximation error on realistic inputs.
"""

import builders
import pytest
import torch
from torch import nn

import zoo
from zoo.attention._blocks import _GatherBlocks, _LookAround, allowed_attention
from zoo.attention._kernels import flash_parts as _flash_parts
from zoo.attention._kernels.flash_parts import Part, parts_attention
from zoo.attention.bigbird import bigbird_attention, bigbird_layout, draw_random_blocks, global_blocks
from zoo.attention.dilated import dilated_attention
from zoo.attention.local import local_attention
from zoo.attention.longformer import longformer_attention
from zoo.attention.sparse import sparse_attention

DIM, HEADS, BATCH = 32, 2, 2
FAMILY = ["local", "dilated", "sparse", "longformer", "bigbird"]
CAUSAL = ["local", "dilated", "sparse", "longformer"]
# Options that put several blocks into a 131-long sequence.
SMALL = {
    "local": {"window": 8},
    "dilated": {"window": 12, "dilation": 3},
    "sparse": {"block": 8},
    "longformer": {"window": 8, "global_indices": (0, 50)},
    "bigbird": {"block_size": 8, "num_random_blocks": 2},
}


def qkv(n: int, seed: int = 0, heads: int = HEADS, dtype=torch.float32):
    return builders.qkv(BATCH, heads, n, 8, dtype=dtype, seed=seed, requires_grad=True)


def padding(n: int) -> torch.Tensor:
    keep = torch.ones(BATCH, n, dtype=torch.bool)
    keep[1, n // 2 :] = False
    # The first query has no key at all in causal mode.
    keep[0, [0, 3]] = False
    return keep


def inputs(n: int, seed: int = 1) -> torch.Tensor:
    return builders.tokens(BATCH, n, DIM, seed)


# Naive references: which keys j query i may see, straight from each paper's definition.
def offsets(n: int) -> torch.Tensor:
    i = torch.arange(n)
    return i[:, None] - i


def band(n: int, window: int, causal: bool) -> torch.Tensor:
    off = offsets(n)
    return (off >= 0) & (off <= window) if causal else off.abs() <= window


def causal_only(allowed: torch.Tensor, causal: bool) -> torch.Tensor:
    return allowed & (offsets(allowed.shape[-1]) >= 0) if causal else allowed


def allowed_sparse(n: int, pattern: str, block: int, num_summary: int, causal: bool) -> torch.Tensor:
    i = torch.arange(n)
    if pattern == "strided":
        allowed = (offsets(n).abs() <= block) | (offsets(n) % block == 0)
    else:
        allowed = (i[:, None] // block == i // block) | (i % block >= block - num_summary)[None]
    return causal_only(allowed, causal)


def allowed_longformer(n: int, window: int, global_indices, causal: bool) -> torch.Tensor:
    is_global = torch.zeros(n, dtype=torch.bool)
    is_global[list(global_indices)] = True
    return causal_only(band(n, window, causal) | is_global[None] | is_global[:, None], causal)


def allowed_bigbird(n: int, block_size: int, random_blocks: torch.Tensor) -> torch.Tensor:
    """`[h, n, n]`: window of 3 blocks, first/last blocks global both ways, the drawn random blocks."""
    block_of = torch.arange(n) // bigbird_layout(n, block_size).block
    is_global = torch.isin(block_of, torch.tensor(global_blocks(int(block_of.max()) + 1)))
    base = ((block_of[:, None] - block_of).abs() <= 1) | is_global[None] | is_global[:, None]
    picked = torch.zeros(random_blocks.shape[0], n, n, dtype=torch.bool)
    heads, num_blocks, _ = random_blocks.shape
    for head, query_block in torch.cartesian_prod(torch.arange(heads), torch.arange(num_blocks)).tolist():
        for key_block in random_blocks[head, query_block].tolist():
            if key_block >= 0:
                picked[head] |= (block_of == query_block)[:, None] & (block_of == key_block)
    return base | picked


def reference(q, k, v, allowed):
    """Dense softmax over the allowed keys (the one dense reference, `allowed_attention`); a query with none gets
    zeros (what the blocked code returns)."""
    return allowed_attention(q, k, v, allowed, None, None, 0.0)


def test_the_dense_reference_is_exact_softmax_over_the_allowed_keys():
    q, k, v = qkv(37, dtype=torch.float64)
    allowed = band(37, 5, False)
    allowed[3] = False  # a query with no key at all
    scores = (q @ k.transpose(-1, -2)) * 8**-0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    torch.testing.assert_close(reference(q, k, v, allowed), weights @ v)
    everything = torch.ones(37, 37, dtype=torch.bool)
    torch.testing.assert_close(reference(q, k, v, everything), nn.functional.scaled_dot_product_attention(q, k, v))


def assert_matches_reference(fast, q, k, v, allowed, keep):
    """Outputs and all gradients agree with the dense reference."""
    out = fast(q, k, v)
    expected = reference(q, k, v, allowed & keep[:, None, None, :])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    for name, got, want in zip("qkv", grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"gradient of {name}")


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 8, 20])
def test_local_matches_naive_reference(n, causal, window):
    q, k, v = qkv(n)
    keep = padding(n)

    def fast(q, k, v):
        return local_attention(q, k, v, keep, causal, window=window)

    assert_matches_reference(fast, q, k, v, band(n, window, causal), keep)


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,dilation", [(12, 3), (9, 2), (70, 4)])
def test_dilated_matches_naive_reference(n, causal, window, dilation):
    q, k, v = qkv(n)
    keep = padding(n)
    allowed = band(n, window, causal) & (offsets(n) % dilation == 0)

    def fast(q, k, v):
        return dilated_attention(q, k, v, keep, causal, window=window, dilation=dilation)

    assert_matches_reference(fast, q, k, v, allowed, keep)


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "pattern,block,num_summary", [("strided", 8, 1), ("strided", 5, 1), ("fixed", 8, 2), ("fixed", 16, 5)]
)
def test_sparse_matches_naive_reference(n, causal, pattern, block, num_summary):
    q, k, v = qkv(n)
    keep = padding(n)
    allowed = allowed_sparse(n, pattern, block, num_summary, causal)

    def fast(q, k, v):
        return sparse_attention(q, k, v, keep, causal, pattern=pattern, block=block, num_summary=num_summary)

    assert_matches_reference(fast, q, k, v, allowed, keep)


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("global_indices", [(), (0,), (0, 20, 36)])
def test_longformer_matches_naive_reference(n, causal, global_indices):
    q, k, v = qkv(n)
    keep = padding(n)
    allowed = allowed_longformer(n, 6, global_indices, causal)

    def fast(q, k, v):
        return longformer_attention(q, k, v, keep, causal, window=6, global_indices=global_indices)

    assert_matches_reference(fast, q, k, v, allowed, keep)


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("block_size,num_random", [(8, 3), (5, 1), (16, 0)])
def test_bigbird_matches_naive_reference(n, block_size, num_random):
    q, k, v = qkv(n)
    keep = padding(n)
    num_blocks = bigbird_layout(n, block_size).num_blocks
    random_blocks = draw_random_blocks(num_blocks, HEADS, num_random, 0)
    allowed = allowed_bigbird(n, block_size, random_blocks)

    def fast(q, k, v):
        return bigbird_attention(q, k, v, random_blocks, keep, block_size=block_size)

    assert_matches_reference(fast, q, k, v, allowed, keep)


def test_block_gathers_gradients():
    blocks = torch.randn(2, 2, 3, 4, 2, dtype=torch.float64, requires_grad=True)
    extra = torch.randn(2, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    for before, after in [(1, 1), (1, 0), (2, 1), (0, 0), (4, 3)]:
        assert torch.autograd.gradcheck(_LookAround.apply, (blocks, before, after, None))
        assert torch.autograd.gradcheck(_LookAround.apply, (blocks, before, after, extra))
    index = torch.tensor([[[0, 2], [1, 1]], [[2, 0], [0, 0]], [[1, 2], [2, 1]]])  # [k, h, s], repeats included
    assert torch.autograd.gradcheck(_GatherBlocks.apply, (blocks, index))


# The CPU flash-parts path (no padding mask, no dropout): by default it takes blocks of 64 or more; the fixture
# lets it take the small blocks above, so that the naive references cover every part it cuts.
# The second parametrisation cuts every previous-block part as a flipped causal part (the default: a masked one)
# and every kernel call down to one group.
@pytest.fixture(params=[False, True], ids=["default", "flipped-pieces"])
def flash_everywhere(monkeypatch, request):
    monkeypatch.setattr(_flash_parts, "FLASH_MIN_BLOCK", 1)
    if request.param:
        monkeypatch.setattr(_flash_parts, "FLASH_KEY_TILE", 1)
        monkeypatch.setattr(_flash_parts, "PIECE_BYTES", 1)


def assert_flash_matches_reference(fast, n, allowed):
    q, k, v = qkv(n)
    calls = []
    original = _flash_parts._FlashParts.apply
    _flash_parts._FlashParts.apply = lambda *args: calls.append(1) or original(*args)
    try:
        assert_matches_reference(fast, q, k, v, allowed, torch.ones(BATCH, n, dtype=torch.bool))
    finally:
        _flash_parts._FlashParts.apply = original
    assert calls, "the flash-parts path was not taken"


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 8, 20, 36, 130, 500])
def test_local_flash_parts_match_naive_reference(flash_everywhere, n, causal, window):
    def fast(q, k, v):
        return local_attention(q, k, v, None, causal, window=window)

    assert_flash_matches_reference(fast, n, band(n, window, causal))


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,dilation", [(12, 3), (9, 2), (70, 4), (20, 5)])
def test_dilated_flash_parts_match_naive_reference(flash_everywhere, n, causal, window, dilation):
    allowed = band(n, window, causal) & (offsets(n) % dilation == 0)

    def fast(q, k, v):
        return dilated_attention(q, k, v, None, causal, window=window, dilation=dilation)

    assert_flash_matches_reference(fast, n, allowed)


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,global_indices", [(6, ()), (6, (0,)), (6, (0, 20, 36)), (20, (5, 36))])
def test_longformer_flash_parts_match_naive_reference(flash_everywhere, n, causal, window, global_indices):
    allowed = allowed_longformer(n, window, global_indices, causal)

    def fast(q, k, v):
        return longformer_attention(q, k, v, None, causal, window=window, global_indices=global_indices)

    assert_flash_matches_reference(fast, n, allowed)


def _right_padded(n: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """q, k, v of three samples kept to lengths n, 0 and n // 3 (right padding, as PadCollate pads)."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, HEADS, n, 8, generator=generator, requires_grad=True) for _ in range(3))
    keep = torch.arange(n) < torch.tensor([n, 0, n // 3])[:, None]
    return [q, k, v], keep


PREFIX_CASES = {
    "local": lambda n, causal: (
        lambda q, k, v, keep: local_attention(q, k, v, keep, causal, window=8),
        band(n, 8, causal),
    ),
    "dilated": lambda n, causal: (
        lambda q, k, v, keep: dilated_attention(q, k, v, keep, causal, window=12, dilation=3),
        band(n, 12, causal) & (offsets(n) % 3 == 0),
    ),
    "longformer": lambda n, causal: (
        lambda q, k, v, keep: longformer_attention(q, k, v, keep, causal, window=6, global_indices=(0, 5)),
        allowed_longformer(n, 6, (0, 5), causal),
    ),
}


@pytest.mark.parametrize("n", [37, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(PREFIX_CASES))
def test_right_padded_batches_run_each_kept_prefix_on_the_flash_path(flash_everywhere, name, n, causal):
    # a key padding mask that keeps a prefix of every sample leaves the flash kernel no more: each sample's prefix
    # runs unmasked (samples of one length together), the rows of padded queries are zero
    fast, allowed = PREFIX_CASES[name](n, causal)
    (q, k, v), keep = _right_padded(n)
    calls = []
    original = _flash_parts._FlashParts.apply
    _flash_parts._FlashParts.apply = lambda *args: calls.append(args[0].shape[0]) or original(*args)
    try:
        out = fast(q, k, v, keep)
    finally:
        _flash_parts._FlashParts.apply = original
    assert calls and max(calls) == 1, "each length runs as its own unmasked flash call"
    expected = reference(q, k, v, allowed & keep[:, None, None, :])
    torch.testing.assert_close(
        out[keep[:, None, :, None].expand_as(out)],
        expected[keep[:, None, :, None].expand_as(out)],
        rtol=1e-5,
        atol=1e-5,
    )
    assert not out[~keep[:, None, :, None].expand_as(out)].any()
    grad_out = torch.randn_like(out) * keep[:, None, :, None]
    for name_, got, want in zip(
        "qkv",
        torch.autograd.grad(out, (q, k, v), grad_out),
        torch.autograd.grad(expected, (q, k, v), grad_out),
        strict=True,
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"gradient of {name_}")


def test_a_mask_that_keeps_everything_gives_the_unmasked_output(flash_everywhere):
    (q, k, v), keep = _right_padded(37)
    everything = torch.ones_like(keep)
    for name, case in PREFIX_CASES.items():
        fast, _ = case(37, False)
        assert torch.equal(fast(q, k, v, everything), fast(q, k, v, None)), name


def test_a_global_position_past_a_samples_length_takes_the_masked_path():
    n = 37
    (q, k, v), keep = _right_padded(n)
    out = longformer_attention(q, k, v, keep, window=6, global_indices=(0, 20))
    expected = reference(q, k, v, allowed_longformer(n, 6, (0, 20), False) & keep[:, None, None, :])
    rows = keep[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[rows], expected[rows], rtol=1e-5, atol=1e-5)


# (length, block size, random blocks) where the flash parts run: 3 blocks or more, and every middle block finds its
# random blocks outside its window and the two global blocks (r of them need 5 + r blocks at least: (32, 1) at 192
# and a ragged 200, never at 128 or 131); the cases that miss a pick or have under 3 blocks take the masked path
# (test_bigbird_without_flash_parts_matches_naive_reference).
FLASH_BIGBIRD = [
    (n, block_size, num_random)
    for block_size, num_random, lengths in [
        (8, 3, (128, 131)),
        (5, 1, (37, 128, 131)),
        (16, 0, (37, 128, 131)),
        (40, 0, (128, 131)),
        (32, 1, (192, 200)),
    ]
    for n in lengths
]


@pytest.mark.parametrize("n,block_size,num_random", FLASH_BIGBIRD)
def test_bigbird_flash_parts_match_naive_reference(flash_everywhere, n, block_size, num_random):
    num_blocks = bigbird_layout(n, block_size).num_blocks
    random_blocks = draw_random_blocks(num_blocks, HEADS, num_random, 0)
    # the case reaches the flash parts: no missing random pick, 3 blocks or more
    assert (random_blocks[:, 1:-1] >= 0).all() and num_blocks >= 3, (n, block_size, num_random)
    allowed = allowed_bigbird(n, block_size, random_blocks)

    def fast(q, k, v):
        return bigbird_attention(q, k, v, random_blocks, None, block_size=block_size)

    assert_flash_matches_reference(fast, n, allowed)


@pytest.mark.parametrize("n,block_size,num_random", [(37, 8, 3), (37, 40, 0), (37, 32, 1), (128, 32, 1), (131, 32, 1)])
def test_bigbird_without_flash_parts_matches_naive_reference(flash_everywhere, n, block_size, num_random):
    """Unmasked calls the flash parts cannot take (a middle block short of random picks, or under 3 blocks) run on
    the masked path, and still equal the reference."""
    num_blocks = bigbird_layout(n, block_size).num_blocks
    random_blocks = draw_random_blocks(num_blocks, HEADS, num_random, 0)
    assert num_blocks < 3 or (random_blocks[:, 1:-1] < 0).any(), (n, block_size, num_random)
    q, k, v = qkv(n)
    calls = []
    original = _flash_parts._FlashParts.apply
    _flash_parts._FlashParts.apply = lambda *args: calls.append(1) or original(*args)
    try:
        assert_matches_reference(
            lambda q, k, v: bigbird_attention(q, k, v, random_blocks, None, block_size=block_size),
            q,
            k,
            v,
            allowed_bigbird(n, block_size, random_blocks),
            torch.ones(BATCH, n, dtype=torch.bool),
        )
    finally:
        _flash_parts._FlashParts.apply = original
    assert not calls


@pytest.mark.parametrize("piece_bytes", [_flash_parts.PIECE_BYTES, 1])
def test_flash_parts_gradients(monkeypatch, piece_bytes):
    """Every kind of part, in float64: overlapping and flipped causal groups, a mask per group, shared extra keys,
    gathered blocks, dense logits, and a batch of two leading dims; whole, and cut into one-group kernel calls."""
    monkeypatch.setattr(_flash_parts, "PIECE_BYTES", piece_bytes)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 1, 2, 24, 4, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(3)
    )
    k_extra, v_extra = (
        torch.randn(2, 1, 2, 3, 4, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    dense = torch.randn(2, 1, 2, 24, 2, generator=generator, dtype=torch.float64, requires_grad=True)
    mask = _flash_parts.additive(torch.rand(2, 1, 4, 4, generator=generator) > 0.3, torch.float64)
    parts = [
        Part(0, 6, 4, 0, 4, 4, 4, causal=True),
        Part(4, 4, 4, 0, 8, 4, 4),  # overlapping key groups
        Part(4, 5, 4, 0, 4, 4, 4, causal=True, flip=True),
        Part(0, 2, 4, 16, 4, 4, 4, mask=mask),
        Part(0, 3, 8, 0, 3, 8, 0, source="extra"),
        Part(8, 2, 4, 0, 8, 4, source="gather", index=torch.tensor([[[0, 5], [3, 1]], [[5, 5], [0, 2]]]), block=4),
    ]

    def fn(q, k, v, ke, ve, dense):
        return parts_attention(q, k, v, parts, 0.7, ke, ve, dense, offsets=(-3, 30))

    # gradcheck's fast mode: a random projection of the Jacobian by finite differences checks the same backward as
    # the whole Jacobian, which takes two forwards per input element (2,880 here)
    assert torch.autograd.gradcheck(fn, (q, k, v, k_extra, v_extra, dense), fast_mode=True)


def test_flash_parts_path_is_the_default_on_cpu():
    """Module defaults (blocks of 64 and more): the fast path runs, and agrees with the masked path."""
    x = inputs(600)
    for name, options in [
        ("local", {"window": 64}),
        ("dilated", {"window": 128, "dilation": 2}),
        ("longformer", {"window": 64, "global_indices": (0, 150)}),
        ("bigbird", {"block_size": 64, "num_random_blocks": 1}),
    ]:
        attention = zoo.create_attention(name, DIM, HEADS, **options).eval()
        calls = []
        original = _flash_parts._FlashParts.apply
        _flash_parts._FlashParts.apply = lambda *args, calls=calls, original=original: (
            calls.append(1) or original(*args)
        )
        try:
            fast = attention(x)
        finally:
            _flash_parts._FlashParts.apply = original
        assert calls, name
        masked = attention(x, torch.ones(BATCH, 600, dtype=torch.bool))  # a padding mask takes the masked path
        torch.testing.assert_close(fast, masked, rtol=1e-5, atol=1e-5, msg=name)


# Exact limits: against the full softmax module with the same weights.
def exact_pair(name: str, **options):
    torch.manual_seed(0)
    exact = zoo.create_attention("softmax", DIM, HEADS, qkv_bias=True).eval()
    variant = zoo.create_attention(name, DIM, HEADS, qkv_bias=True, **options).eval()
    variant.load_state_dict(exact.state_dict(), strict=False)
    return exact, variant


COVERING = [
    ("local", {"window": 131}),
    ("local", {"window": 500}),
    ("dilated", {"window": 131, "dilation": 1}),
    ("sparse", {"block": 131}),
    ("sparse", {"block": 256, "pattern": "fixed"}),
    ("longformer", {"window": 131, "global_indices": (0, 7)}),
    ("bigbird", {"block_size": 44}),  # 3 blocks: every block is a neighbour or global
]


# causal where the family has a causal mode (bigbird has none, and refuses it: test_attention_registry.py)
@pytest.mark.parametrize(
    "name,options,causal",
    [
        (name, options, causal)
        for causal in (False, True)
        for name, options in COVERING
        if not causal or zoo.attention.get_attention(name).supports_causal
    ],
)
def test_covering_the_sequence_is_exact_attention(name, options, causal):
    exact, variant = exact_pair(name, **options)
    x, keep = inputs(131), padding(131)
    torch.testing.assert_close(variant(x, keep, causal), exact(x, keep, causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FAMILY)
def test_padded_keys_never_leak_across_blocks(name):
    """Padded keys, anywhere in the sequence and inside random / global / summary blocks, get no weight."""
    attention = zoo.create_attention(name, DIM, HEADS, **SMALL[name]).eval()
    x = inputs(131)
    keep = torch.rand(BATCH, 131, generator=torch.Generator().manual_seed(0)) > 0.3
    changed = x.clone()
    changed[~keep] = torch.randn_like(changed[~keep]) * 40
    out, out_changed = attention(x, keep), attention(changed, keep)
    torch.testing.assert_close(out[keep], out_changed[keep], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_prefix_is_independent_of_the_future(name):
    attention = zoo.create_attention(name, DIM, HEADS, **SMALL[name]).eval()
    x = inputs(131)
    for cut in (1, 40, 97):
        changed = x.clone()
        changed[:, cut:] = torch.randn_like(changed[:, cut:]) * 40
        torch.testing.assert_close(
            attention(x, is_causal=True)[:, :cut], attention(changed, is_causal=True)[:, :cut], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("name", FAMILY)
def test_samples_stay_independent_across_blocks(name):
    attention = zoo.create_attention(name, DIM, HEADS, **SMALL[name]).eval()
    x = inputs(131)
    changed = x.clone()
    changed[1] = changed[1] * 50 + 3
    torch.testing.assert_close(attention(x)[0], attention(changed)[0], rtol=1e-5, atol=1e-5)


def relative_error(name: str, **options) -> float:
    exact, variant = exact_pair(name, **options)
    x = inputs(131)
    with torch.no_grad():
        expected = exact(x)
        return ((variant(x) - expected).norm() / expected.norm()).item()


def test_approximation_error_on_layer_normed_inputs():
    """Randomly initialised weights give nearly uniform attention, the hardest case for local patterns: the error
    is the missing attention mass, which shrinks as a window of w each side covers more of the 131 keys (2w + 1 of
    them) and vanishes once it covers them all. Weights and tokens are seeded, so the errors are the same on every
    machine up to float32 rounding; the bounds leave about a fifth of margin above them."""
    local = [relative_error("local", window=window) for window in (8, 32, 64, 130)]
    assert local[0] < 0.9 and local[1] < 0.43 and local[2] < 0.24 and local[3] < 1e-6
    assert local == sorted(local, reverse=True)
    assert relative_error("dilated", window=64, dilation=2) < 0.47
    # Global tokens and random blocks only add keys: never worse than the window alone.
    assert relative_error("longformer", window=32, global_indices=(0, 65, 130)) < relative_error("local", window=32)
    assert (
        relative_error("bigbird", block_size=8, num_random_blocks=3)
        < relative_error("bigbird", block_size=8, num_random_blocks=0)
        < 0.52
    )
    assert relative_error("sparse", block=16) < 0.55
    assert relative_error("sparse", block=16, pattern="fixed", num_summary=4) < 0.55


def test_bigbird_random_blocks_are_deterministic_and_valid():
    attention = zoo.create_attention("bigbird", DIM, 4, block_size=8)
    first = attention.random_blocks(131)
    torch.testing.assert_close(first, attention.random_blocks(131))
    copy = zoo.create_attention("bigbird", DIM, 4, block_size=8)
    copy.load_state_dict(attention.state_dict())
    torch.testing.assert_close(copy.random_blocks(131), first)
    num_blocks = bigbird_layout(131, 8).num_blocks
    assert first.shape == (4, num_blocks, 3)
    assert not torch.equal(first[0], first[1])  # drawn per head
    for head, query_block in torch.cartesian_prod(torch.arange(4), torch.arange(num_blocks)).tolist():
        picks = first[head, query_block]
        assert len(set(picks.tolist())) == 3
        for key_block in picks.tolist():
            assert abs(key_block - query_block) > 1 and key_block not in (0, num_blocks - 1)
    # Too few blocks to draw from: the missing picks are -1, never a block of the window or a global one.
    few = draw_random_blocks(5, 2, 3, 0)
    assert (few[:, 2] == -1).all() and (few[:, 0, 2] == -1).all()
    assert set(few[:, 0, :2].flatten().tolist()) <= {2, 3}
    # the path a GPU takes (no cache keyed by the seed's value), traced whole: the same blocks
    traced = torch.compile(attention.random_blocks, backend="eager", fullgraph=True)(131)
    torch.testing.assert_close(traced, first, rtol=0, atol=0)
    # drawn where the seed buffer lives, reading no value on the host: the draw runs on the meta device, where
    # reading one raises
    assert attention.to("meta").random_blocks(131).device.type == "meta"


def test_bigbird_output_is_the_same_every_call():
    attention = zoo.create_attention("bigbird", DIM, HEADS, block_size=8).train()
    x = inputs(131)
    torch.testing.assert_close(attention(x), attention(x))


def test_bf16_matches_float32():
    x = inputs(131)
    for name in FAMILY:
        attention = zoo.create_attention(name, DIM, HEADS, **SMALL[name]).eval()
        expected = attention(x)
        out = attention.to(torch.bfloat16)(x.to(torch.bfloat16))
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


def test_attention_dropout_reaches_the_weights():
    for name in FAMILY:
        attention = zoo.create_attention(name, DIM, HEADS, attn_drop=0.5, **SMALL[name])
        x = inputs(131)
        assert not torch.allclose(attention.train()(x), attention.eval()(x))


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("local", {"window": 0}, "window=0"),
        ("local", {"window": 2.5}, "window=2.5"),
        ("dilated", {"window": 2, "dilation": 3}, "window=2 is shorter than dilation=3"),
        ("dilated", {"dilation": 0}, "dilation=0"),
        ("sparse", {"pattern": "axial"}, "pattern='axial'.*strided"),
        ("sparse", {"pattern": "fixed", "block": 8, "num_summary": 9}, "num_summary=9.*1..8"),
        ("longformer", {"global_indices": (0, 0)}, "repeats"),
        ("longformer", {"global_indices": (-1,)}, "-1"),
        ("bigbird", {"block_size": 0}, "block_size=0"),
        ("bigbird", {"num_random_blocks": -1}, "num_random_blocks=-1"),
    ],
)
def test_options_are_validated_at_construction(name, options, match):
    with pytest.raises(ValueError, match=match):
        zoo.create_attention(name, DIM, HEADS, **options)


def test_longformer_global_index_past_the_sequence_is_an_error():
    attention = zoo.create_attention("longformer", DIM, HEADS, global_indices=(0, 200))
    with pytest.raises(ValueError, match="200"):
        attention(inputs(37))
