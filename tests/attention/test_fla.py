"""Causal kernel attention through fla-core (`zoo/attention/_fla.py`): when it is taken, and that it equals the torch
path.

fla's kernels need a GPU (its autotuner runs them), so on the CPU the dispatch is checked with the device check
and fla's op replaced: `on_cuda` pretends the tensors are on CUDA and `stand_in` installs `chunk_linear_attn` as
fla's naive reference computes it (its `[B, T, H, K]` layout, its default scale `K^-1/2` and its `normalize=True`
default, so glue that forgot any of them fails). The GPU tests run fla itself against the torch path
(`ZOO_FLA=0`) and a float64 reference, on outputs and every gradient.
"""

import re
import sys
from pathlib import Path

import builders
import pytest
import torch

from zoo.attention import _fla, _kernel
from zoo.attention._kernel import kernel_attention, kernel_attention_reference

CUDA = torch.cuda.is_available()
LENGTHS = (37, 500, 1000)
# variant: (name, options, whether its causal forward in bf16 goes through fla by default, and with ZOO_FLA=1)
VARIANTS = {
    "linear": ("linear", {}, True, True),
    "hedgehog": ("hedgehog", {"feature_dim": 16}, True, True),
    # Performer hands `kernel_attention` float32 values whatever its input's dtype
    "performer-relu": ("performer", {"kernel": "relu", "nb_features": 16}, False, True),
    # the causal softmax kernel passes a per-key log-scale, which fla's op has no input for
    "performer-softmax": ("performer", {"nb_features": 16}, False, False),
    # windowed Hedgehog sums the keys behind its band with `_causal` directly, not `kernel_attention`
    "hedgehog-window": ("hedgehog", {"feature_dim": 16, "window": 4}, False, False),
}


def stand_in_chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True):
    """fla's `chunk_linear_attn` as `fla/ops/linear_attn/naive.py` computes it: q, k `[B, T, H, K]`, v `[B, T, H, V]`
    -> (`o_t = scale sum_{s <= t} (q_t . k_s) v_s`, normalised by `scale q_t . sum_{s <= t} k_s + 1e-10` when
    `normalize`; None)."""
    assert initial_state is None and not output_final_state
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bihr,bjhr->bhij", q * scale, k).tril()
    out = torch.einsum("bhij,bjhd->bihd", scores, v)
    if normalize:
        out = out / ((q * scale * k.cumsum(1)).sum(-1, keepdim=True) + 1e-10)
    return out, None


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    monkeypatch.delenv(_fla.FLA_ENV, raising=False)


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setattr(_fla, "_on_cuda", lambda *tensors: True)


@pytest.fixture
def stand_in(monkeypatch, on_cuda) -> list:
    """Installs the stand-in as fla's op; the list collects the shapes of q it was called with."""
    calls = []

    def op(q, k, v, **options):
        calls.append(tuple(q.shape))
        return stand_in_chunk_linear_attn(q, k, v, **options)

    monkeypatch.setattr(_fla, "_load", lambda: op)
    return calls


@pytest.fixture
def without_fla(monkeypatch):
    """fla not importable: `None` in sys.modules makes its import raise ModuleNotFoundError."""
    _fla._load.cache_clear()
    monkeypatch.setitem(sys.modules, "fla", None)
    monkeypatch.setitem(sys.modules, "fla.ops.linear_attn", None)
    yield
    _fla._load.cache_clear()


def features(b=2, h=3, n=37, r=12, d=5, *, dtype=torch.float32, seed=0, device="cpu"):
    """Positive features `[b, h, n, r]` with the keys of sample 0 left-padded (its first 4 queries see no key) and
    random keys of sample 1 padded, values `[b, h, n, d]` in `dtype`, all requiring gradients; and `seen` `[b, 1,
    n, 1]`, False for the queries that see no key."""
    phi_q, phi_k, v = builders.qkv(b, h, n, (r, r, d), seed=seed)
    keep = builders.padding(b, n, drop=0.3, seed=seed + 1)
    keep[0, :4] = False
    phi_q, phi_k = phi_q.exp(), phi_k.exp() * keep[:, None, :, None]
    tensors = (phi_q, phi_k, v.to(dtype))
    seen = keep.cummax(-1).values[:, None, :, None]
    return [t.to(device).requires_grad_() for t in tensors], seen.to(device)


def probe(out: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """`out` on the CPU in float32, zero on queries with no key: their outputs are zero by the `eps` clamp, whose
    gradient (1 / eps times the upstream one) reaches the padded keys' features alike on every path."""
    return (out * seen).float().cpu()


def reference(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """The quadratic causal reference in float64, zero for the queries that see no key (where it divides 0 by 0)."""
    expected = kernel_attention_reference(phi_q.double(), phi_k.double(), v.double(), is_causal=True)
    return torch.where(seen, expected, 0.0)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.isfinite().all()
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


def test_cpu_tensors_take_the_torch_path_without_importing_fla(monkeypatch):
    def refuse():
        raise AssertionError("fla was looked up for CPU tensors")

    monkeypatch.setattr(_fla, "_load", refuse)
    monkeypatch.setenv(_fla.FLA_ENV, "1")
    for dtype in (torch.float32, torch.bfloat16):
        (phi_q, phi_k, v), seen = features(dtype=dtype)
        assert not _fla.use_fla(phi_q, phi_k, v)
        out = kernel_attention(phi_q, phi_k, v, is_causal=True, chunk_size=8)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out.double(), reference(phi_q, phi_k, v, seen), atol=tol, rtol=tol)


def test_without_fla_the_torch_path_runs(without_fla, on_cuda):
    (phi_q, phi_k, v), seen = features(dtype=torch.bfloat16)
    assert _fla._load() is None
    assert not _fla.use_fla(phi_q, phi_k, v)
    out = kernel_attention(phi_q, phi_k, v, is_causal=True, chunk_size=8)
    torch.testing.assert_close(out.double(), reference(phi_q, phi_k, v, seen), atol=1e-2, rtol=1e-2)


def test_zoo_fla_0_never_dispatches(stand_in, monkeypatch):
    monkeypatch.setenv(_fla.FLA_ENV, "0")
    for dtype in (torch.float32, torch.bfloat16):
        (phi_q, phi_k, v), _ = features(dtype=dtype)
        assert not _fla.use_fla(phi_q, phi_k, v)
        kernel_attention(phi_q, phi_k, v, is_causal=True)
    assert stand_in == []


def test_float32_values_need_zoo_fla_1_and_float64_never_dispatches(stand_in, monkeypatch):
    (phi_q, phi_k, v), _ = features()
    assert not _fla.use_fla(phi_q, phi_k, v)
    for dtype in (torch.bfloat16, torch.float16):
        assert _fla.use_fla(phi_q, phi_k, v.to(dtype))
    assert not _fla.use_fla(phi_q.double(), phi_k.double(), v.to(torch.bfloat16))
    monkeypatch.setenv(_fla.FLA_ENV, "1")
    assert _fla.use_fla(phi_q, phi_k, v)
    assert not _fla.use_fla(phi_q, phi_k, v.double())


def test_more_batch_heads_than_a_grid_axis_or_no_tokens_stay_in_torch(stand_in):
    v = torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16)
    assert _fla.use_fla(v, v, v)
    wide = torch.zeros(256, 256, 1, 1, dtype=torch.bfloat16)
    assert not _fla.use_fla(wide, wide, wide)
    empty = torch.zeros(1, 1, 0, 1, dtype=torch.bfloat16)
    assert not _fla.use_fla(empty, empty, empty)


def test_a_bad_zoo_fla_value_names_itself_and_the_allowed_ones(monkeypatch):
    monkeypatch.setenv(_fla.FLA_ENV, "yes")
    (phi_q, phi_k, v), _ = features()
    with pytest.raises(ValueError, match=r"ZOO_FLA='yes' is not one of: unset .*1 .*0 \(never\)"):
        kernel_attention(phi_q, phi_k, v, is_causal=True)


@pytest.mark.parametrize("value_dtype", [torch.bfloat16, torch.float32])
def test_the_fla_glue_equals_the_torch_path_on_outputs_and_gradients(stand_in, value_dtype, monkeypatch):
    monkeypatch.setenv(_fla.FLA_ENV, "1")
    (phi_q, phi_k, v), seen = features(dtype=value_dtype)
    out = kernel_attention(phi_q, phi_k, v, is_causal=True)
    assert stand_in == [(2, 37, 3, 12)] and out.dtype == value_dtype
    # the queries with no key: zeros, with finite gradients whatever reaches them
    assert out[0, :, :4].eq(0).all()
    assert all(g.isfinite().all() for g in torch.autograd.grad(out.sum(), (phi_q, phi_k, v), retain_graph=True))
    grads = builders.grads(probe(out, seen), (phi_q, phi_k, v))
    monkeypatch.setenv(_fla.FLA_ENV, "0")
    expected = kernel_attention(phi_q, phi_k, v, is_causal=True, chunk_size=8)
    assert len(stand_in) == 1
    # bf16 outputs: the two float32 results may round to neighbouring bf16 values
    tol, grad_tol = (1e-5, 1e-4) if value_dtype == torch.float32 else (1e-2, 2e-2)
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
    for grad, expected_grad in zip(grads, builders.grads(probe(expected, seen), (phi_q, phi_k, v)), strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=grad_tol, rtol=grad_tol)


def test_the_fla_glue_clamps_the_normaliser_at_eps(stand_in):
    # normalisers here run from about 16 to 3000: eps=100 clamps about a fifth of the rows and leaves the rest
    (phi_q, phi_k, v), _ = features(dtype=torch.bfloat16)
    out = kernel_attention(phi_q, phi_k, v, is_causal=True, eps=100.0)
    assert len(stand_in) == 1
    num = kernel_attention_reference(phi_q.double(), phi_k.double(), v.double(), is_causal=True)
    den = torch.einsum("bhnr,bhnr->bhn", phi_q.double(), phi_k.double().cumsum(-2))[..., None]
    expected = torch.where(den > 0, num * den / den.clamp_min(100.0), 0.0)
    assert (den < 100).any() and (den > 100).any()
    torch.testing.assert_close(out.double(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("mode", ["", "1"], ids=["default", "zoo_fla_1"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_which_causal_variants_take_fla(stand_in, variant, mode, monkeypatch):
    name, options, *takes_fla = VARIANTS[variant]
    monkeypatch.setenv(_fla.FLA_ENV, mode)
    attention = builders.make(name, 32, 2, **options).to(torch.bfloat16)
    x = builders.tokens(2, 37, 32).to(torch.bfloat16)
    keep = builders.padding(2, 37, drop=0.3)
    out = attention(x, attn_mask=keep, is_causal=True)
    assert bool(stand_in) == takes_fla[mode == "1"]
    if stand_in:
        monkeypatch.setenv(_fla.FLA_ENV, "0")
        torch.testing.assert_close(out, attention(x, attn_mask=keep, is_causal=True), atol=1e-2, rtol=1e-2)
        monkeypatch.setenv(_fla.FLA_ENV, mode)
    stand_in.clear()
    attention(x, attn_mask=keep)
    assert stand_in == []


@pytest.mark.skipif(not CUDA, reason="fla's kernels need a CUDA GPU")
@pytest.mark.parametrize("length", LENGTHS)
def test_fla_kernel_attention_equals_a_float64_reference_on_cuda(length, monkeypatch):
    """fla itself (TF32 matmuls), feature width 64 against value width 32, left-padded and random padded keys."""
    pytest.importorskip("fla.ops.linear_attn", reason="fla-core (the gpu extra) is not installed")
    monkeypatch.setenv(_fla.FLA_ENV, "1")
    (phi_q, phi_k, v), seen = features(n=length, r=64, d=32, device="cuda")
    assert _fla.use_fla(phi_q, phi_k, v)
    out = kernel_attention(phi_q, phi_k, v, is_causal=True)
    assert out[0, :, :4].eq(0).all()
    assert relative_error(out, reference(phi_q, phi_k, v, seen)) < 5e-3
    assert all(g.isfinite().all() for g in torch.autograd.grad(out.sum(), (phi_q, phi_k, v), retain_graph=True))
    grads = builders.grads(probe(out, seen), (phi_q, phi_k, v))
    monkeypatch.setenv(_fla.FLA_ENV, "0")
    torch_path = kernel_attention(phi_q, phi_k, v, is_causal=True)
    for grad, expected_grad in zip(grads, builders.grads(probe(torch_path, seen), (phi_q, phi_k, v)), strict=True):
        assert relative_error(grad, expected_grad) < 1e-2


@pytest.mark.skipif(not CUDA, reason="fla's kernels need a CUDA GPU")
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", ["linear", "hedgehog"])
def test_fla_modules_equal_the_torch_path_on_cuda(variant, dtype, length, monkeypatch):
    """Causal linear (r = d = 32) and Hedgehog (r = 64, d = 32) modules, dim 64, 2 heads, padded keys: outputs and
    the gradients of the input and every parameter, fla against `ZOO_FLA=0`."""
    pytest.importorskip("fla.ops.linear_attn", reason="fla-core (the gpu extra) is not installed")
    name, options = {"linear": ("linear", {}), "hedgehog": ("hedgehog", {"feature_dim": 32})}[variant]
    attention = builders.make(name, 64, 2, **options).to(device="cuda", dtype=dtype)
    x = builders.tokens(2, length, 64).to(device="cuda", dtype=dtype).requires_grad_()
    keep = builders.padding(2, length, drop=0.25)
    keep[1, length - length // 3 :] = False
    keep = keep.cuda()
    tensors = (x, *attention.parameters())
    calls = []
    monkeypatch.setattr(_kernel, "fla_causal_kernel_attention", _counting(_kernel.fla_causal_kernel_attention, calls))
    monkeypatch.setenv(_fla.FLA_ENV, "1")
    out = attention(x, attn_mask=keep, is_causal=True)
    grads = builders.grads(out.cpu(), tensors, keep.cpu())
    assert len(calls) == 1
    monkeypatch.setenv(_fla.FLA_ENV, "0")
    expected = attention(x, attn_mask=keep, is_causal=True)
    expected_grads = builders.grads(expected.cpu(), tensors, keep.cpu())
    assert len(calls) == 1
    tol = 5e-3 if dtype == torch.float32 else 2e-2
    assert relative_error(out[keep], expected[keep]) < tol
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert relative_error(grad, expected_grad) < 2 * tol


def test_the_gpu_extra_and_the_device_wheels_install_the_fla_these_tests_run():
    """The GPU tests above run where CUDA and fla-core are: `pip install -e ".[gpu]"` (the `gpu` extra) or, on a GPU
    machine without a package index, `make device-wheels` here and `make device-site` there, whose folder the
    device targets put on the path; `make device-test` runs this file. All three name the same fla-core."""
    root = Path(__file__).resolve().parents[2]
    pyproject, makefile = (root / "pyproject.toml").read_text(), (root / "Makefile").read_text()
    (extra,) = re.findall(r'^gpu = \["fla-core>=([0-9.]+)"\]$', pyproject, re.MULTILINE)
    (wheel,) = re.findall(r'pip download .*"fla-core==([0-9.]+)"', makefile)
    assert wheel == extra, f"make device-wheels fetches fla-core {wheel}, the gpu extra asks for >= {extra}"
    (tests,) = re.findall(r"^DEVICE_TESTS \?= (.*)$", makefile, re.MULTILINE)
    assert "tests/attention" in tests.split()
    (env,) = re.findall(r"^DEVICE_ENV = PYTHONPATH=(.*)$", makefile, re.MULTILINE)
    assert "$(DEVICE_SITE)" in env


def _counting(function, calls: list):
    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return function(*args, **kwargs)

    return counted
