"""The fused Triton kernels of the non-causal linear family (`zoo.attention._kernels.fused_linear`) against the torch
paths.

On a machine without a GPU the kernels run in Triton's interpreter on CPU tensors (`tests/conftest.py` sets
`TRITON_INTERPRET=1`), with the fused path forced (`force_fused`); with a GPU they run compiled on CUDA. Every
case is compared with the same module on its torch path on the CPU in fp32 (`reference=True` where the variant has
one), on outputs, the input's gradient and every parameter's gradient.
"""

import builders
import pytest
import torch
from builders import grads

from zoo.attention._features import Feature
from zoo.attention._kernels.fused_linear import force_fused, launch
from zoo.attention._kernels.fused_linear.plan import Plan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37

# The variants and options whose non-causal mode the fused kernels compute: every feature map they hold.
# `performer` and `hedgehog-wide` hold their features in chunks (`CHUNKED`), as 256 random features are by default;
# the others, and every case of `test_tf32_products_stay_close_to_fp32`, whole.
FUSED = {
    "linear": ("linear", {}),
    "performer": ("performer", {"nb_features": 24}),
    "performer-relu": ("performer", {"nb_features": 24, "kernel": "relu"}),
    "hedgehog": ("hedgehog", {"feature_dim": 8}),
    "hedgehog-wide": ("hedgehog", {"feature_dim": 24}),
}


# Chunks of 16 feature columns: performer's 24 features in a full and a ragged chunk, hedgehog-wide's halves of 24
# (`hedgehog`'s 2 x 8 fit one chunk of 16, and stay whole).
CHUNKED = "favor=64:4::16,hedgehog=64:4::16"


# Half precision: every feature map, chunked performer among them (hedgehog's chunks are not its default)
HALF = ("linear", "performer", "performer-relu", "hedgehog")


@pytest.fixture(autouse=True)
def chunked_features(monkeypatch):
    monkeypatch.setenv("ZOO_FUSED_CONFIG", CHUNKED)


def torch_path(name: str, options: dict) -> dict:
    """The options of the torch path: the reference where the variant has one (hedgehog's torch path is one)."""
    return {**options, "reference": True} if name != "hedgehog" else options


def run(module, x, keep=None, *, device=DEVICE, force=True, dtype=None):
    """Output and gradients (input, then every parameter) of `module` on `device`, kept query rows only."""
    module = module.to(device)
    x = x.to(device).detach().requires_grad_()
    mask = None if keep is None else keep.to(device)
    with force_fused() if force else torch.enable_grad():
        if dtype is None:
            out = module(x, attn_mask=mask)
        else:
            with torch.autocast(device, dtype=dtype):
                out = module(x, attn_mask=mask)
    params = [p for p in module.parameters() if p.requires_grad]
    keep_rows = None if keep is None else keep.to(device)
    gradients = grads(out.float(), [x, *params], keep_rows)
    rows = slice(None) if keep is None else keep.to(device)
    return [t.detach().float().cpu() for t in (out[rows], *gradients)]


def relative(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def counting_forward(monkeypatch) -> list:
    """Replace the op's forward with one that counts its calls."""
    calls = []
    original = launch.forward

    def counted(*args):
        calls.append(args[0].device.type)
        return original(*args)

    monkeypatch.setattr(launch, "forward", counted)
    return calls


@pytest.mark.parametrize("masked", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("case", list(FUSED))
def test_fused_kernels_equal_the_torch_path(case, masked, monkeypatch):
    name, options = FUSED[case]
    calls = counting_forward(monkeypatch)
    module = builders.make(name, DIM, HEADS, **options)
    reference = builders.make(name, DIM, HEADS, **torch_path(name, options))
    reference.load_state_dict(module.state_dict())
    x = builders.tokens(BATCH, LENGTH, DIM)
    keep = builders.padding(BATCH, LENGTH, drop=0.3) if masked else None
    expected = run(reference, x, keep, device="cpu", force=False)
    actual = run(module, x, keep)
    assert calls == [DEVICE]
    for got, want in zip(actual, expected, strict=True):
        assert relative(got, want) < 1e-5


@pytest.mark.parametrize("case", ["linear", "performer", "hedgehog"])
def test_fused_kernels_split_the_sequence_over_programs(case):
    """One sample and head, 300 keys: the state and the gradients' sums are split over several programs and tiles
    (atomic adds), with a ragged last tile."""
    name, options = FUSED[case]
    module = builders.make(name, 16, 1, **options)
    reference = builders.make(name, 16, 1, **torch_path(name, options))
    reference.load_state_dict(module.state_dict())
    x = builders.tokens(1, 300, 16)
    heads = torch.empty(1, 1, 300, 16, device=DEVICE)
    plan = Plan(heads, heads, 16, 0, 0.0)
    assert plan.splits > 1 and plan.tiles > 1
    assert Plan(heads, heads, 24, Feature.FAVOR, 0.0).chunks == 2  # performer's, chunk by chunk
    for got, want in zip(run(module, x), run(reference, x, device="cpu", force=False), strict=True):
        assert relative(got, want) < 1e-5


@pytest.mark.parametrize(
    "case, dtype",
    [*((case, torch.bfloat16) for case in HALF), ("performer", torch.float16), ("linear", torch.float16)],
    ids=[*(f"{case}-bf16" for case in HALF), "performer-fp16", "linear-fp16"],
)
def test_half_precision_is_finite_and_close_to_fp32(case, dtype):
    """Under autocast, with activations 8x larger than LayerNorm's (where exp features overflow a half type), the
    output and every gradient stay finite and within half precision's rounding of the fp32 torch path."""
    name, options = FUSED[case]
    module = builders.make(name, DIM, HEADS, **options)
    reference = builders.make(name, DIM, HEADS, **torch_path(name, options))
    reference.load_state_dict(module.state_dict())
    x = 8 * builders.tokens(BATCH, LENGTH, DIM)
    keep = builders.padding(BATCH, LENGTH, drop=0.3)
    expected = run(reference, x, keep, device="cpu", force=False)
    actual = run(module, x, keep, dtype=dtype)
    for got, want in zip(actual, expected, strict=True):
        assert torch.isfinite(got).all()
        assert relative(got, want) < 5e-2


@pytest.mark.parametrize("case", ["linear", "performer", "hedgehog"])
def test_padded_tokens_change_nothing_and_get_no_gradient(case):
    """Rewriting the padded tokens leaves the kept rows' output unchanged, and the kept rows' output has exactly zero
    gradient with respect to a padded token (its key and value get zero features; its query is not kept)."""
    name, options = FUSED[case]
    module = builders.make(name, DIM, HEADS, **options).to(DEVICE)
    keep = builders.padded_tails(LENGTH, [LENGTH, 20]).to(DEVICE)
    x = builders.tokens(BATCH, LENGTH, DIM).to(DEVICE).requires_grad_()
    rewritten = torch.where(keep[..., None], x.detach(), 100.0 * torch.randn_like(x))
    with force_fused():
        out = module(x, attn_mask=keep)
        out_rewritten = module(rewritten, attn_mask=keep)
    assert torch.allclose(out[keep], out_rewritten[keep], rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(out[keep].square().sum(), x)
    assert grad[~keep].abs().max().item() == 0.0
    assert grad[keep].abs().max().item() > 0.0


def test_cpu_tensors_take_the_torch_path_unless_forced(monkeypatch):
    calls = counting_forward(monkeypatch)
    module = builders.make("linear", DIM, HEADS)
    module(builders.tokens(BATCH, LENGTH, DIM))
    assert calls == []
    # forced (in the interpreter), or on CUDA where no force is needed
    with force_fused():
        module.to(DEVICE)(builders.tokens(BATCH, LENGTH, DIM).to(DEVICE))
    assert calls == [DEVICE]


def test_zoo_fused_0_turns_the_fused_path_off(monkeypatch):
    calls = counting_forward(monkeypatch)
    monkeypatch.setenv("ZOO_FUSED", "0")
    module = builders.make("performer", DIM, HEADS, nb_features=24).to(DEVICE)
    with force_fused():
        module(builders.tokens(BATCH, LENGTH, DIM).to(DEVICE))
    assert calls == []


def test_compiled_module_has_no_graph_break_and_equals_eager():
    """torch.compile(fullgraph=True) sees the fused op as one node (a graph break would raise), and forward and
    backward equal the eager module's. On the CPU through AOTAutograd (`aot_eager`: the op's fake kernel and its
    autograd formula in the joint graph inductor receives, where inductor calls the op as it is) without inductor's
    C++ build, which costs far more than the check; inductor itself on a GPU."""
    torch._dynamo.reset()
    module = builders.make("performer", DIM, HEADS, nb_features=24)
    x = builders.tokens(BATCH, LENGTH, DIM)
    keep = builders.padding(BATCH, LENGTH, drop=0.3)
    eager = run(module, x, keep)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    compiled = run(torch.compile(module, fullgraph=True, backend=backend), x, keep)
    for got, want in zip(compiled, eager, strict=True):
        assert relative(got, want) < 1e-6


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_traces_the_custom_op_not_the_eager_path(strict):
    """Eagerly the op runs its Python bodies without the dispatcher (`_EagerFusedAttention`); `torch.export`, strict
    (Dynamo) or not (the dispatcher's fake tensors, which the kernels could not take), must record the custom op
    instead, and the exported program must compute what eager does."""
    module = builders.make("performer", DIM, HEADS, nb_features=24).eval().to(DEVICE)
    x = builders.tokens(BATCH, LENGTH, DIM).to(DEVICE)
    with force_fused():
        want = module(x)
        program = torch.export.export(module, (x,), strict=strict)
        got = program.module()(x)
    targets = [str(node.target) for node in program.graph.nodes]
    assert any("zoo.fused_kernel_attention" in target for target in targets), targets
    assert relative(got, want) < 1e-6


@pytest.mark.parametrize("case", ["linear", "performer", "hedgehog"])
def test_tf32_products_stay_close_to_fp32(case, monkeypatch):
    """`ZOO_FUSED_CONFIG=rows:warps:tf32`: under bf16 autocast the kernels' products take tf32 operands instead of
    their default bf16 ones; output and gradients within bf16's rounding of the fp32 torch path, all finite."""
    monkeypatch.setenv("ZOO_FUSED_CONFIG", "32:4:tf32")
    name, options = FUSED[case]
    module = builders.make(name, DIM, HEADS, **options)
    reference = builders.make(name, DIM, HEADS, **torch_path(name, options))
    reference.load_state_dict(module.state_dict())
    x = builders.tokens(BATCH, LENGTH, DIM)
    keep = builders.padding(BATCH, LENGTH, drop=0.3)
    expected = run(reference, x, keep, device="cpu", force=False)
    for got, want in zip(run(module, x, keep, dtype=torch.bfloat16), expected, strict=True):
        assert torch.isfinite(got).all()
        assert relative(got, want) < 5e-2


def test_zoo_fused_config_sets_rows_and_warps_per_feature_map(monkeypatch):
    q = torch.empty(1, 1, 100, 16)
    monkeypatch.setenv("ZOO_FUSED_CONFIG", "elu=32:4,favor=16:8")
    assert (Plan(q, q, 16, Feature.ELU, 0.0).block_n, Plan(q, q, 16, 0, 0.0).warps) == (32, 4)
    assert (Plan(q, q, 16, Feature.FAVOR, 0.0).block_n, Plan(q, q, 16, 1, 0.0).warps) == (16, 8)
    default = Plan(q, q, 16, Feature.HEDGEHOG, 0.0)
    monkeypatch.setenv("ZOO_FUSED_CONFIG", "64:8")
    assert (Plan(q, q, 16, Feature.HEDGEHOG, 0.0).block_n, default.block_n) == (64, 64)
    half, fp16 = q.to(torch.bfloat16), q.to(torch.float16)
    # by default bf16 operands for bf16 inputs, tf32 for fp16 ones (bf16 would cut their mantissa), exact for fp32
    monkeypatch.delenv("ZOO_FUSED_CONFIG")
    precisions = [Plan(x, x, 16, Feature.FAVOR, 0.0).prec for x in (half, fp16, q)]
    assert precisions == ["bf16", "tf32", "ieee"]
    monkeypatch.setenv("ZOO_FUSED_CONFIG", "favor=32:8:tf32")
    assert Plan(half, half, 16, Feature.FAVOR, 0.0).prec == "tf32"
    monkeypatch.setenv("ZOO_FUSED_CONFIG", "favor=32:8:bf16")
    assert Plan(fp16, fp16, 16, Feature.FAVOR, 0.0).prec == "bf16"
    assert Plan(q, q, 16, Feature.FAVOR, 0.0).prec == "ieee"  # fp32 inputs keep exact products
    for bad in ("favor=64", "favor=32:8:fp8", "favor=a:b", "favor=64:4::24", "favor=64:4::8", "favor=64:4:::"):
        monkeypatch.setenv("ZOO_FUSED_CONFIG", bad)
        with pytest.raises(ValueError, match=f"'{bad}' is not rows:warps"):
            Plan(q, q, 16, Feature.FAVOR, 0.0)


@pytest.mark.parametrize(
    "feature, features, config, expected",
    [
        # (chunks, columns a chunk holds, first column of chunk 1, real columns a chunk)
        (Feature.FAVOR, 256, "", (4, 64, 64, 64)),
        (Feature.FAVOR, 256, "favor=32:8::0", (1, 256, 256, 256)),
        (Feature.FAVOR, 200, "favor=32:8::128", (2, 128, 128, 128)),
        (Feature.FAVOR, 64, "", (1, 64, 64, 64)),
        (Feature.RELU, 96, "", (2, 64, 64, 64)),
        (Feature.HEDGEHOG, 128, "", (1, 128, 128, 128)),
        (Feature.HEDGEHOG, 128, "hedgehog=64:4::64", (2, 64, 64, 64)),
        (Feature.HEDGEHOG, 96, "hedgehog=64:4::16", (2, 64, 48, 48)),
        (Feature.HEDGEHOG, 64, "", (1, 64, 64, 64)),
        (Feature.ELU, 128, "elu=64:4::16", (1, 128, 128, 128)),
    ],
)
def test_features_past_64_columns_are_held_in_chunks(feature, features, config, expected, monkeypatch):
    """FAVOR and RELU 64 feature columns at a time by default (whole, 256 do not fit sm_90's shared memory),
    hedgehog whole unless asked for its halves (one softmax each), linear's elu + 1 always whole (its features are q's
    and k's own columns); `ZOO_FUSED_CONFIG` sets it."""
    monkeypatch.setenv("ZOO_FUSED_CONFIG", config)
    q = torch.empty(1, 1, 100, 128 if feature == Feature.ELU else 64)
    plan = Plan(q, q[..., :64], features, feature, 0.0)
    assert (plan.chunks, plan.block_c, plan.chunk_stride, plan.chunk_width) == expected


class _Picky:
    """A kernel that, as triton does on a GPU with too little shared memory, refuses launches before running them:
    those without one pipeline stage (or all, with `always`)."""

    def __init__(self, kernel, always=False):
        self.kernel, self.always, self.refused = kernel, always, 0

    def __getitem__(self, grid):
        def launched(*args, **kwargs):
            if self.always or kwargs.get("num_stages") != 1:
                self.refused += 1
                raise launch.OutOfResources(300_000, 232_448, "shared memory")
            return self.kernel[grid](*args, **kwargs)

        return launched


def test_a_kernel_the_gpu_refuses_is_launched_again_smaller(monkeypatch):
    """The key backward refused at the default plan: the backward runs again at the next level (one pipeline stage),
    equal to the torch path, and later calls start at that level."""
    picky = _Picky(launch._key_backward_kernel)
    monkeypatch.setattr(launch, "_key_backward_kernel", picky)
    monkeypatch.setattr(launch, "FITTED", {})
    name, options = FUSED["performer"]
    module = builders.make(name, DIM, HEADS, **options)
    reference = builders.make(name, DIM, HEADS, **torch_path(name, options))
    reference.load_state_dict(module.state_dict())
    x = builders.tokens(BATCH, LENGTH, DIM)
    keep = builders.padding(BATCH, LENGTH, drop=0.3)
    for got, want in zip(run(module, x, keep), run(reference, x, keep, device="cpu", force=False), strict=True):
        assert relative(got, want) < 1e-5
    assert picky.refused == 1 and list(launch.FITTED.values()) == [1]
    run(module, x, keep)
    assert picky.refused == 1


def test_a_gpu_too_small_for_every_level_names_the_torch_path(monkeypatch):
    monkeypatch.setattr(launch, "_output_kernel", _Picky(launch._output_kernel, always=True))
    monkeypatch.setattr(launch, "FITTED", {})
    module = builders.make("linear", DIM, HEADS)
    with pytest.raises(RuntimeError, match="do not fit this GPU's shared memory even at their smallest.*ZOO_FUSED=0"):
        run(module, builders.tokens(BATCH, LENGTH, DIM))


@pytest.mark.parametrize("level, expected", [(0, (32, 1, None)), (1, (32, 1, 1)), (2, (32, 2, 1)), (4, (16, 2, 1))])
def test_shrink_levels_give_up_pipelining_whole_features_then_rows(level, expected, monkeypatch):
    """hedgehog's 2 x 64 features at their defaults: (rows, chunks, stages) at each level; at 2 the features are
    chunked by halves, at 4 a tile has a quarter of its rows, at least 16."""
    monkeypatch.delenv("ZOO_FUSED_CONFIG")
    q = torch.empty(1, 1, 100, 64)
    plan = Plan(q, q, 128, Feature.HEDGEHOG, 0.0, level)
    assert (plan.block_n, plan.chunks, plan.stages) == expected
