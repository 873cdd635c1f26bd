"""The `backend` option of the 1-D windowed families (`local`, `dilated`, `sparse`, `longformer`, `bigbird`):
checked at construction, dispatched in `attend` (flex only when asked, or on CUDA under `auto`), and the compiled
FlexAttention forward on CPU equal to the torch path under key padding."""

import importlib

import pytest
import torch

import zoo

DIM, HEADS, BATCH, N = 32, 2, 2, 45  # head dim 16; N not a multiple of any window or block below

# One configuration per family (a window, block or stride shorter than N, so the pattern is sparse), and whether
# the compiled comparison runs it causal.
FAMILIES = [
    ("local", {"window": 5}, True),
    ("dilated", {"window": 9, "dilation": 2}, True),
    ("sparse", {"pattern": "strided", "block": 5}, False),
    ("sparse", {"pattern": "fixed", "block": 8, "num_summary": 2}, True),
    ("longformer", {"window": 3, "global_indices": (0, 20)}, False),
    ("bigbird", {"block_size": 8, "num_random_blocks": 2}, False),
]
NAMES = sorted({name for name, _, _ in FAMILIES})


def options_of(name: str) -> dict:
    return next(options for family, options, _ in FAMILIES if family == name)


def pair(name: str, backend: str, **options):
    """The torch-path module and one with `backend`, with the same weights (and BigBird's random blocks)."""
    torch.manual_seed(0)
    torch_path = zoo.create_attention(name, DIM, HEADS, qkv_bias=True, backend="torch", **options).eval()
    other = zoo.create_attention(name, DIM, HEADS, qkv_bias=True, backend=backend, **options).eval()
    other.load_state_dict(torch_path.state_dict())
    return torch_path, other


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, N, DIM, generator=generator)
    keep = torch.rand(BATCH, N, generator=generator) > 0.25
    keep[:, 0] = True
    return x, keep


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "options,match",
    [
        ({"backend": "flexx"}, "backend='flexx'.*did you mean 'flex'"),
        ({"backend": "Torch"}, "backend='Torch'.*expected one of"),
        ({"backend": "flex", "attn_drop": 0.1}, "attn_drop=0.1"),
        ({"backend": "flex", "reference": True}, "pick one"),
    ],
)
def test_backend_is_checked_at_construction(name, options, match):
    with pytest.raises(ValueError, match=match):
        zoo.create_attention(name, DIM, HEADS, **options_of(name), **options)


@pytest.mark.parametrize("name", NAMES)
def test_auto_on_cpu_keeps_the_torch_path_and_flex_dispatches(name, monkeypatch):
    """`auto` on CPU never calls `flex_attend` and gives the torch path's output; `flex` calls it with the family's
    pattern and the `[b, n]` key padding mask."""
    calls = []

    def recording_flex_attend(q, k, v, pattern, key_padding=None, *, scale=None):
        calls.append((pattern, key_padding, scale))
        return torch.zeros_like(q)

    monkeypatch.setattr(importlib.import_module(f"zoo.attention.{name}"), "flex_attend", recording_flex_attend)
    x, keep = inputs()
    torch_path, auto = pair(name, "auto", **options_of(name))
    with torch.no_grad():
        torch.testing.assert_close(auto(x, keep), torch_path(x, keep))
        assert not calls
        _, flex = pair(name, "flex", **options_of(name))
        flex(x, keep)
    (pattern, key_padding, scale), *rest = calls
    assert not rest and scale == flex.scale
    torch.testing.assert_close(key_padding, keep)
    assert pattern.length in (None, N)


@pytest.mark.parametrize("name", NAMES)
def test_reference_wins_over_auto(name, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("reference=True must not run FlexAttention")

    # what the reference must compute: the torch path's function, before FlexAttention is forced on
    torch_path = zoo.create_attention(name, DIM, HEADS, backend="torch", **options_of(name)).eval()
    x = inputs()[0]
    with torch.no_grad():
        expected = torch_path(x)
    monkeypatch.setattr(importlib.import_module(f"zoo.attention.{name}"), "flex_attend", refuse)
    attention = zoo.create_attention(name, DIM, HEADS, reference=True, **options_of(name)).eval()
    # the same weights and random buffers
    attention.load_state_dict(torch_path.state_dict())
    # FlexAttention forced on past the constructor's check: `choose_path` would take it but for the reference
    attention.backend = "flex"
    with torch.no_grad():
        torch.testing.assert_close(attention(x), expected, rtol=1e-4, atol=1e-5)


def test_flex_backend_refuses_a_cpu_backward():
    attention = zoo.create_attention("local", DIM, HEADS, window=5, backend="flex")
    with pytest.raises(ValueError, match="no CPU backward"):
        attention(inputs()[0])


def test_longformer_flex_checks_the_global_indices():
    attention = zoo.create_attention("longformer", DIM, HEADS, window=3, global_indices=(0, 50), backend="flex")
    with torch.no_grad(), pytest.raises(ValueError, match="reach past the sequence length 45"):
        attention(inputs()[0])


# The compiled forward on CPU, each pattern at the same shapes (`compiled_flex`: aot_eager, or inductor under
# ZOO_TEST_INDUCTOR=1); the 2-D families' in test_flex.py.


@pytest.mark.usefixtures("compiled_flex")
@pytest.mark.parametrize("name,options,is_causal", FAMILIES, ids=lambda x: str(x))
def test_flex_forward_equals_the_torch_path(name, options, is_causal):
    torch_path, flex = pair(name, "flex", **options)
    x, keep = inputs()
    keep[1] = False  # a sample with every key padded: zeros, not NaN
    with torch.no_grad():
        out = flex(x, keep, is_causal)
        torch.testing.assert_close(out, torch_path(x, keep, is_causal), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reference", [False, True])
def test_one_forward_is_one_choose_path_decision(name, reference, monkeypatch):
    """The module decides its path once per call, through `choose_path` (here: N too short for the flash parts)."""
    module = importlib.import_module(f"zoo.attention.{name}")
    choose_path, decisions = module.choose_path, []

    def recording(q, **options):
        decisions.append(choose_path(q, **options))
        return decisions[-1]

    monkeypatch.setattr(module, "choose_path", recording)
    attention = zoo.create_attention(name, DIM, HEADS, reference=reference, **options_of(name)).eval()
    with torch.no_grad():
        attention(inputs()[0])
    assert [path.value for path in decisions] == ["reference" if reference else "torch"]
