"""FlexAttention masks of the windowed families, checked without a GPU: each `mask_mod`, materialised densely with
`create_mask`, against the family's own torch path (masked softmax over the dense mask equals the family's output)
or its dense reference; the cached block masks against `create_block_mask`; and the compiled flex forward on CPU
against the torch path."""

import builders
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

import zoo
from zoo.attention import _flex
from zoo.attention._blocks import allowed_attention
from zoo.attention._flex import block_mask, flex_attend
from zoo.attention._paths import Path, choose_path
from zoo.attention.bigbird import bigbird_mask
from zoo.attention.dilated import dilated_mask
from zoo.attention.local import local_mask
from zoo.attention.longformer import longformer_mask
from zoo.attention.neighborhood import neighborhood_keep, neighborhood_mask
from zoo.attention.sparse import sparse_mask
from zoo.attention.window2d import window2d_keep, window2d_mask

DIM, HEADS, BATCH = 32, 2, 2
CPU = torch.device("cpu")


def dense(pattern, n: int, heads: int = 1) -> torch.Tensor:
    """`[heads, n, n]` bool: the pattern's mask_mod evaluated everywhere, in sequence order."""
    mask = create_mask(pattern.mask_mod, 1, heads, n, n, CPU)[0]
    if pattern.order is not None:
        inverse = torch.argsort(pattern.order)
        mask = mask[:, inverse][:, :, inverse]
    return mask


def qkv(n: int, dtype=torch.float64, seed: int = 0):
    return builders.qkv(BATCH, HEADS, n, DIM // HEADS, dtype=dtype, seed=seed)


def padding(n: int) -> torch.Tensor:
    return builders.padding(BATCH, n, drop=0.25, seed=1)


def family(name: str, **options):
    return builders.make(name, DIM, HEADS, **options).double()


# The 1-D families: the flex pattern under a masked softmax gives the family's torch output, with and without
# key padding (so the dense mask is exactly the family's pattern: a missing or extra key would change outputs).
ONE_D = [
    ("local", {"window": 1}, lambda n, m: local_mask(1)),
    ("local", {"window": 5}, lambda n, m: local_mask(5)),
    ("local", {"window": 40}, lambda n, m: local_mask(40)),
    ("dilated", {"window": 9, "dilation": 2}, lambda n, m: dilated_mask(9, 2)),
    ("dilated", {"window": 12, "dilation": 3}, lambda n, m: dilated_mask(12, 3)),
    ("sparse", {"pattern": "strided", "block": 5}, lambda n, m: sparse_mask(n, "strided", 5, 8)),
    ("sparse", {"pattern": "fixed", "block": 8, "num_summary": 2}, lambda n, m: sparse_mask(n, "fixed", 8, 2)),
    ("sparse", {"pattern": "fixed", "block": 64, "num_summary": 3}, lambda n, m: sparse_mask(n, "fixed", 64, 3)),
    ("longformer", {"window": 4, "global_indices": (0,)}, lambda n, m: longformer_mask(n, 4, (0,), False, CPU)),
    (
        "longformer",
        {"window": 3, "global_indices": (0, 20, 36)},
        lambda n, m: longformer_mask(n, 3, [0, 20, 36], False, CPU),
    ),
    ("bigbird", {"block_size": 8, "num_random_blocks": 2}, lambda n, m: bigbird_mask(n, 8, m.random_blocks(n), CPU)),
    ("bigbird", {"block_size": 5, "num_random_blocks": 1}, lambda n, m: bigbird_mask(n, 5, m.random_blocks(n), CPU)),
]
CAUSAL_BUILDERS = {
    "local": lambda n, o: local_mask(o["window"], True),
    "dilated": lambda n, o: dilated_mask(o["window"], o["dilation"], True),
    "sparse": lambda n, o: sparse_mask(n, o["pattern"], o["block"], o.get("num_summary", 8), True),
    "longformer": lambda n, o: longformer_mask(n, o["window"], o["global_indices"], True, CPU),
}


def assert_pattern_is_the_familys(module, pattern, n: int, is_causal: bool) -> None:
    q, k, v = qkv(n)
    allowed = dense(pattern, n, HEADS if pattern.per_head else 1)
    for mask in (None, padding(n)):
        expected = module.attend(q, k, v, mask, is_causal)
        torch.testing.assert_close(allowed_attention(q, k, v, allowed, mask, module.scale, 0.0), expected)


@pytest.mark.parametrize("name,options,build", ONE_D, ids=lambda x: str(x) if not callable(x) else "")
@pytest.mark.parametrize("n", [37, 70])
def test_one_d_masks_are_the_familys_pattern(name, options, build, n):
    module = family(name, **options)
    assert_pattern_is_the_familys(module, build(n, module), n, False)


@pytest.mark.parametrize(
    "name,options,_", [c for c in ONE_D if c[0] in CAUSAL_BUILDERS], ids=lambda x: str(x) if not callable(x) else ""
)
def test_one_d_causal_masks_are_the_familys_pattern(name, options, _):
    n = 37
    assert_pattern_is_the_familys(family(name, **options), CAUSAL_BUILDERS[name](n, options), n, True)


def test_bigbird_mask_depends_on_the_head():
    module = family("bigbird", block_size=4, num_random_blocks=2)
    allowed = dense(bigbird_mask(64, 4, module.random_blocks(64), CPU), 64, HEADS)
    assert (allowed[0] != allowed[1]).any()


@pytest.mark.parametrize("grid", [(6, 6), (5, 7), (7, 3), (1, 9), (9, 13)])
@pytest.mark.parametrize("window,shift", [(1, 0), (3, 0), (3, 1), (4, 2), (5, 4), (20, 3)])
def test_window2d_mask_is_the_allowed_attention(grid, window, shift, prefix=2):
    pattern = window2d_mask(grid, prefix, window, shift, CPU)
    n = prefix + grid[0] * grid[1]
    torch.testing.assert_close(dense(pattern, n)[0], window2d_keep(grid, prefix, window, shift))


@pytest.mark.parametrize("grid", [(6, 6), (5, 7), (7, 3), (1, 9), (9, 13)])
@pytest.mark.parametrize("kernel,dilation", [(1, 1), (3, 1), (5, 1), (3, 2), (5, 2), (3, 3), (9, 1)])
@pytest.mark.parametrize("tile_rows", [None, "auto", 2, 3])
def test_neighborhood_mask_is_the_allowed_attention(grid, kernel, dilation, tile_rows, prefix=2):
    pattern = neighborhood_mask(grid, prefix, kernel, dilation, CPU, tile_rows)
    n = prefix + grid[0] * grid[1]
    torch.testing.assert_close(dense(pattern, n)[0], neighborhood_keep(grid, prefix, kernel, dilation))


def test_window2d_mask_puts_each_window_in_consecutive_positions():
    pattern = window2d_mask((28, 28), 1, 14, 0, CPU)
    ordered = create_mask(pattern.mask_mod, 1, 1, 785, 785, CPU)[0, 0, :-1, :-1]
    # Window order, the prefix token last: four windows of 196 tokens, each a dense diagonal block.
    expected = torch.block_diag(*[torch.ones(196, 196, dtype=torch.bool)] * 4)
    torch.testing.assert_close(ordered, expected)


@pytest.mark.parametrize("chunk", [_flex.CHUNK_ELEMENTS, 1])
def test_block_masks_match_create_block_mask(monkeypatch, chunk):
    """Built a chunk of query blocks at a time (one block per chunk with chunk=1), the block lists equal
    torch's own; a per-head pattern keeps its heads."""
    monkeypatch.setattr(_flex, "CHUNK_ELEMENTS", chunk)
    _flex._block_structure.cache_clear()
    _flex._cached_block_mask.cache_clear()
    module = family("bigbird", block_size=16, num_random_blocks=2)
    for pattern, n, heads in [
        (local_mask(100), 300, 1),
        (sparse_mask(450, "strided", 64, 8, True), 450, 1),
        (bigbird_mask(400, 16, module.random_blocks(400), CPU), 400, HEADS),
        (neighborhood_mask((17, 19), 1, 7, 1, CPU, None), 324, 1),
        (neighborhood_mask((17, 19), 1, 7, 1, CPU, 4), 324, 1),
    ]:
        ours = block_mask(pattern, n, HEADS, CPU)
        theirs = create_block_mask(pattern.mask_mod, 1, heads, n, n, CPU)
        torch.testing.assert_close(ours.to_dense(), theirs.to_dense())
        torch.testing.assert_close(ours.kv_num_blocks, theirs.kv_num_blocks)
        torch.testing.assert_close(ours.full_kv_num_blocks, theirs.full_kv_num_blocks)
    _flex._block_structure.cache_clear()
    _flex._cached_block_mask.cache_clear()


def test_patterns_and_block_masks_are_cached():
    assert window2d_mask((6, 6), 1, 4, 0, CPU) is window2d_mask((6, 6), 1, 4, 0, CPU)
    assert longformer_mask(37, 4, [0, 5], False, CPU) is longformer_mask(37, 4, (0, 5), False, CPU)
    picks = torch.tensor([[[2], [-1], [0]]])
    assert bigbird_mask(24, 8, picks, CPU) is bigbird_mask(24, 8, picks.clone(), CPU)
    pattern = local_mask(7)
    assert block_mask(pattern, 300, HEADS, CPU) is block_mask(pattern, 300, HEADS, CPU)


def test_flex_attend_checks_the_length_and_the_cpu_backward():
    q, k, v = qkv(40, torch.float32)
    with pytest.raises(ValueError, match="built for 37 tokens, got 40"):
        flex_attend(q, k, v, window2d_mask((6, 6), 1, 4, 0, CPU))
    with pytest.raises(ValueError, match="no CPU backward"):
        flex_attend(q.requires_grad_(), k, v, local_mask(3))


class OnCuda:
    """Queries as `choose_path` sees them on a GPU: it reads `is_cuda` alone, so the decision for a CUDA tensor is
    checked on a machine without one."""

    is_cuda = True


@pytest.mark.parametrize("q", [OnCuda(), torch.zeros(1, 1, 4, 16, device="meta")], ids=["cuda", "meta"])
def test_backend_auto_uses_flex_only_on_cuda(q):
    on_cuda = q.is_cuda
    # auto: flex on CUDA without attention dropout (FlexAttention has none); `flex` forces it, `torch` never takes it
    want = Path.FLEX if on_cuda else Path.TORCH
    assert choose_path(q, backend="auto", flex=True) is want
    assert choose_path(q, backend="auto", flex=True, dropout_p=0.1) is Path.TORCH
    assert choose_path(q, backend="flex", flex=True, dropout_p=0.1) is Path.FLEX
    assert choose_path(q, backend="torch", flex=True) is Path.TORCH
    # a variant without a flex pattern for the call, or built with reference=True, never takes flex
    assert choose_path(q, backend="auto", flex=False) is Path.TORCH
    assert choose_path(q, reference=True, backend="flex", flex=True) is Path.REFERENCE
    # the kernels come after flex: on CUDA auto flex wins over them, elsewhere they run
    kernel = choose_path(q, backend="auto", flex=True, kernel=lambda: True)
    assert kernel is (Path.FLEX if on_cuda else Path.KERNEL)
    # `use_flex` (FlexAttention's own rule, quoted by its docstring) says the same for every backend
    for backend, dropout_p in [("auto", 0.0), ("auto", 0.1), ("flex", 0.1), ("torch", 0.0)]:
        chosen = choose_path(q, backend=backend, dropout_p=dropout_p, flex=True) is Path.FLEX
        assert _flex.use_flex(backend, q, dropout_p) == chosen, (backend, dropout_p)


# variant: the module whose `choose_path` its forward calls
FLEX_FAMILIES = {
    "local": "zoo.attention.local",
    "dilated": "zoo.attention.dilated",
    "longformer": "zoo.attention.longformer",
    "bigbird": "zoo.attention.bigbird",
    "sparse": "zoo.attention.sparse",
    "window2d": "zoo.attention._grid",
    "neighborhood": "zoo.attention._grid",
}


@pytest.mark.parametrize("name", list(FLEX_FAMILIES))
def test_a_windowed_module_on_cuda_decides_for_flex(name, monkeypatch):
    """The module's own call to `choose_path`, its arguments replayed with queries on CUDA: `auto` takes flex
    there, while the CPU call it runs takes another path."""
    decided = []

    def recording(q, **options):
        decided.append((choose_path(q, **options), choose_path(OnCuda(), **options)))
        return decided[-1][0]

    monkeypatch.setattr(f"{FLEX_FAMILIES[name]}.choose_path", recording)
    attention = builders.make(name, DIM, HEADS, with_test_options=True)
    assert attention.backend == "auto"
    # every class's test options fit 37 tokens (a 2-D variant: one prefix token and a 6 x 6 grid)
    attention(builders.tokens(BATCH, 37, DIM))
    assert decided and all(cpu is not Path.FLEX and cuda is Path.FLEX for cpu, cuda in decided), decided


# The compiled flex forward on CPU of the 2-D families (the 1-D ones: test_flex_backends.py), with key padding,
# whose mask wraps the pattern's own (an unpadded call would compile the pattern alone again), on the suite's compile
# backend (`compiled_flex`): neighborhood's tiled pattern, whose token order and block mask are the more involved;
# window2d's pattern is checked against a dense reference through the same token-order path in test_flex_tiles.py,
# and both compile for CUDA in the device check.


def grid_pair(name: str, **options):
    torch.manual_seed(0)
    fast = zoo.create_attention(name, DIM, HEADS, qkv_bias=True, **options).eval()
    flex = zoo.create_attention(name, DIM, HEADS, qkv_bias=True, backend="flex", **options).eval()
    flex.load_state_dict(fast.state_dict())
    return fast, flex


@pytest.mark.usefixtures("compiled_flex")
@pytest.mark.parametrize(
    "name,options",
    [
        # an odd grid in ragged bands of 4 rows (tokens in tiles, the order undone at the output), dilated
        ("neighborhood", {"grid_size": (13, 11), "num_prefix_tokens": 1, "kernel": 5, "dilation": 2, "tile_rows": 4}),
    ],
)
def test_flex_forward_equals_the_torch_path(name, options):
    fast, flex = grid_pair(name, **options)
    n = options["num_prefix_tokens"] + options["grid_size"][0] * options["grid_size"][1]
    x = torch.randn(BATCH, n, DIM, generator=torch.Generator().manual_seed(2))
    keep = padding(n)
    keep[1] = False  # a sample with every key padded: zeros, not NaN
    with torch.no_grad():
        out = flex(x, keep)
        torch.testing.assert_close(out, fast(x, keep), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()
