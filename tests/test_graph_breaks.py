"""Every registered variant traces into one graph: `torch.compile(fullgraph=True)` on its training forward.

A graph break is where a GPU step would wait for the host (`.item()`, `int(tensor)`, a data-dependent shape) or
fall back to Python between kernels, so a variant that traces whole has neither. Registry-driven like
`test_attention_registry.py`: each variant is built from its class's `test_options` (B=2, N=37, dim 32, 2 heads),
in train mode, and compiled with the `eager` backend: Dynamo's tracing (which also speculates the backward of
every custom autograd Function), none of the code generation, so the file stays fast. The backward then runs on
the traced forward's output. Once without a mask, once with a key padding mask, causal for the variants with a
causal mode: the paths a GPU runs with `backend="torch"` (the CPU-only flash-parts path steps aside under compile).
About 1 s of tracing per variant and call.

A variant that cannot trace whole is listed in `KNOWN_BREAKS` with the reason; its test is a strict xfail, so it
fails once the break is gone (take it off the list) as well as for any variant off the list that breaks.
"""

import pytest
import torch
import torch._dynamo
from torch import nn

import zoo
from zoo.attention import get_attention, list_attentions

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37

KNOWN_BREAKS = {
    "vq": (
        "its forward leaves the commitment loss and the code statistics as side effects, once per training forward; "
        "telling a checkpoint's recomputation (run inside backward) from a forward reads autograd's graph-task id "
        "(vq._in_backward), which Dynamo cannot trace. The break costs a second graph, not a host sync"
    ),
}


def variants() -> list:
    params = []
    for name in list_attentions():
        reason = KNOWN_BREAKS.get(name)
        marks = [pytest.mark.xfail(reason=reason, strict=True, raises=torch._dynamo.exc.Unsupported)] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def build(name: str) -> nn.Module:
    """Variant `name` with its class's test options, train mode, seed 0."""
    torch.manual_seed(0)
    return zoo.create_attention(name, DIM, HEADS, **get_attention(name).test_options).train()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """x `[b, n, c]` (needs grad) and a right-padded key padding mask `[b, n]` (True = keep)."""
    generator = torch.Generator().manual_seed(1)
    x = nn.functional.layer_norm(torch.randn(BATCH, LENGTH, DIM, generator=generator), (DIM,))
    keep = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keep[1, 25:] = False
    return x.requires_grad_(), keep


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    # every variant shares AttentionBase.forward's code object: without a reset, variants would count as
    # recompilations of one function and hit Dynamo's recompile limit
    torch._dynamo.reset()


@pytest.mark.parametrize("name", variants())
def test_the_training_forward_traces_into_one_graph(name):
    module = build(name)
    x, _ = inputs()
    out = torch.compile(module, backend="eager", fullgraph=True)(x)
    out.square().sum().backward()
    assert torch.isfinite(out).all()
    assert all(p.grad is not None for p in module.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", variants())
def test_the_masked_and_causal_forward_traces_into_one_graph(name):
    module = build(name)
    x, keep = inputs()
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    out = compiled(x, keep, is_causal=get_attention(name).supports_causal)
    out[keep].square().sum().backward()
    assert torch.isfinite(out[keep]).all()
