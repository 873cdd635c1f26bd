"""Every registered variant traces into one graph: `torch.compile(fullgraph=True)` on its training forward.

A graph break is where a GPU step would wait for the host (`.item()`, `int(tensor)`, a data-dependent shape) or
fall back to Python between kernels, so a variant that traces whole has neither. Registry-driven like
`test_attention_registry.py`: each variant is built from its class's `test_options` (B=2, N=37, dim 32, 2 heads),
in train mode, and compiled with the `eager` backend: Dynamo's tracing (which also speculates the backward of
every custom autograd Function), none of the code generation, so the file stays fast; the masked and causal call
with `aot_eager`, AOTAutograd's graphs as well (the per-attention compile check of the timm model contract). The
backward then runs on the traced forward's output, and the output and every gradient must equal those of an eager
copy. Once without a mask, once with a key padding mask, causal for the variants with a causal mode: the paths a
GPU runs with `backend="torch"` (the CPU-only flash-parts path steps aside under compile). Tracing with `eager`,
and with `aot_eager` only for the masked and causal calls, keeps the file short enough to cover every variant.

A variant that cannot trace whole is listed in `KNOWN_BREAKS` with the reason; its test is a strict xfail, so it
fails once the break is gone (take it off the list) as well as for any variant off the list that breaks. Last, a
training step of a tiny 1-D sequence model (forward and loss traced, backward and optimizer step run), with and
without padding, against the same step run eagerly.
"""

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

import zoo
from zoo.attention import get_attention, list_attentions
from zoo.models import create_sequence_model

DIM, HEADS, BATCH, LENGTH = 32, 2, 2, 37

# what fullgraph=True raises at a graph break (Unsupported) or a data-dependent guard (UserError)
GRAPH_BREAK = torch._dynamo.exc.TorchDynamoException
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
        marks = [pytest.mark.xfail(reason=reason, strict=True, raises=GRAPH_BREAK)] if reason else []
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


@pytest.fixture(scope="module", autouse=True)
def many_compilations():
    # every variant shares AttentionBase.forward's code object, so each one is a recompilation of it: the limits
    # are raised for this file rather than Dynamo reset per test (a reset costs a third of a variant's tracing)
    config = torch._dynamo.config
    if hasattr(config, "recompile_limit"):
        limits = {"recompile_limit": 1000, "accumulated_recompile_limit": 100_000}
    else:  # the names before torch 2.6
        limits = {"cache_size_limit": 1000, "accumulated_cache_size_limit": 100_000}
    torch._dynamo.reset()
    with config.patch(**limits):
        yield
    torch._dynamo.reset()


def forward_backward(forward, module: nn.Module, masked: bool, is_causal: bool) -> dict[str, torch.Tensor]:
    """The output of `forward` (`module` or its compiled form; its kept rows when `masked`), the input's and every
    parameter's gradient of their sum of squares."""
    x, keep = inputs()
    rows = forward(x, keep, is_causal=is_causal)[keep] if masked else forward(x)
    rows.square().sum().backward()
    grads = {f"grad {k}": p.grad for k, p in module.named_parameters() if p.requires_grad}
    return {"out": rows.detach(), "grad x": x.grad, **grads}


def assert_compiled_equals_eager(name: str, masked: bool) -> None:
    """The variant compiled whole (fullgraph) against a copy of it run eagerly: outputs and every gradient (the
    compiled paths may differ from eager's, e.g. the flash parts step aside, hence a tolerance). The masked and
    causal call goes through AOTAutograd too (`aot_eager`: functionalisation and the joint forward-backward graph
    that inductor would receive, custom ops' backward included)."""
    module = build(name)
    eager = copy.deepcopy(module)
    backend = "aot_eager" if masked else "eager"
    compiled = torch.compile(module, backend=backend, fullgraph=True, dynamic=False)
    is_causal = masked and get_attention(name).supports_causal
    got = forward_backward(compiled, module, masked, is_causal)
    want = forward_backward(eager, eager, masked, is_causal)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] is not None, key
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=1e-4, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize("name", variants())
def test_the_training_forward_traces_into_one_graph(name):
    assert_compiled_equals_eager(name, masked=False)


@pytest.mark.parametrize("name", variants())
def test_the_masked_and_causal_forward_traces_into_one_graph(name):
    assert_compiled_equals_eager(name, masked=True)


PADDED_MODEL_BREAK = (
    "zoo/models/sequence.py drops an all-True mask (so that the fused kernels run) after reading bool(mask.all()) "
    "on the host: a device sync in every padded forward; deciding it in the collate, on the CPU, would remove it"
)


@pytest.mark.parametrize(
    "padded",
    [False, pytest.param(True, marks=pytest.mark.xfail(reason=PADDED_MODEL_BREAK, strict=True, raises=GRAPH_BREAK))],
    ids=["unpadded", "padded"],
)
def test_a_training_step_of_the_1d_model_traces_into_one_graph(padded):
    torch.manual_seed(0)
    model = create_sequence_model(
        "classification",
        input="tokens",
        attention="softmax",
        depth=1,
        dim=DIM,
        num_heads=HEADS,
        num_classes=3,
        vocab_size=11,
        seq_len=LENGTH,
    ).train()
    tokens, targets = torch.randint(0, 11, (BATCH, LENGTH)), torch.tensor([0, 2])
    _, keep = inputs()
    mask = keep if padded else None

    def loss_of(net, tokens, mask, targets):
        return nn.functional.cross_entropy(net(tokens, mask), targets)

    # the same step eagerly on a copy, then traced: the loss and the stepped weights must agree
    steps = []
    for net, step in (
        (copy.deepcopy(model), loss_of),
        (model, torch.compile(loss_of, backend="eager", fullgraph=True, dynamic=False)),
    ):
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        loss = step(net, tokens, mask, targets)
        loss.backward()
        optimizer.step()
        steps.append((loss.detach(), dict(net.named_parameters())))
    (want_loss, want), (got_loss, got) = steps
    torch.testing.assert_close(got_loss, want_loss, atol=1e-6, rtol=1e-5)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-6, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
