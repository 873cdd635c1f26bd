"""Recomputation repeats no side effect: for every registered attention, gradient checkpointing and reversible
couplings give the outputs, gradients, buffers and auxiliary losses of the forward they recompute."""

import copy

import pytest
import torch
import torch.nn.functional as F
from timm.layers import set_reentrant_ckpt

import zoo
from zoo.attention import auxiliary_loss, get_attention, list_attentions, on_optimizer_step

# 24 px in 4 px patches: a 6 x 6 grid plus the class token, the suite's 37 tokens.
TINY = {"img_size": 24, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 5, "in_chans": 1}


def build(name: str, **options) -> torch.nn.Module:
    """A two-block zoo ViT with the variant's small test options, dropout and drop path on, in training mode."""
    attention_options = dict(get_attention(name).test_options)
    # The model sets the grid of 2-D variants from its patch embedding.
    for key in ("grid_size", "num_prefix_tokens"):
        attention_options.pop(key, None)
    torch.manual_seed(0)
    model = zoo.create_model(
        "vit_tiny_patch16_224", attention=name, attention_options=attention_options, proj_drop_rate=0.1,
        drop_path_rate=0.2, **TINY, **options,
    )  # fmt: skip
    return model.train()


def batch(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, 1, 24, 24, generator=generator, dtype=dtype), torch.tensor([1, 3])


def training_step(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> dict:
    """Forward, task + auxiliary loss, backward, optimizer-step hooks; what a recomputation must leave alone."""
    torch.manual_seed(3)
    logits = model(images)
    aux = auxiliary_loss(model)
    if isinstance(aux, torch.Tensor):
        # The loss must carry its graph, or its gradient is silently lost.
        assert aux.requires_grad
    (F.cross_entropy(logits, labels) + aux).backward()
    grads = {name: param.grad for name, param in model.named_parameters()}
    # Folds the statistics recorded in forward into buffers (VQ's EMA codebook): a repeated count shows here.
    on_optimizer_step(model)
    return {
        "logits": logits.detach(),
        "aux": torch.as_tensor(aux).detach(),
        "grads": grads,
        "buffers": {name: buffer.clone() for name, buffer in model.named_buffers()},
    }


def assert_same(got: dict, want: dict, **tolerance) -> None:
    torch.testing.assert_close(got["logits"], want["logits"], **tolerance)
    torch.testing.assert_close(got["aux"], want["aux"], **tolerance)
    assert got["grads"].keys() == want["grads"].keys() and got["buffers"].keys() == want["buffers"].keys()
    for name, grad in want["grads"].items():
        assert (got["grads"][name] is None) == (grad is None), name
        if grad is not None:
            torch.testing.assert_close(got["grads"][name], grad, msg=lambda m, n=name: f"{n}: {m}", **tolerance)
    for name, buffer in want["buffers"].items():
        torch.testing.assert_close(got["buffers"][name], buffer, msg=lambda m, n=name: f"{n}: {m}", **tolerance)


@pytest.mark.parametrize("name", list_attentions())
def test_gradient_checkpointing_changes_nothing(name):
    plain = build(name)
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    images, labels = batch()
    assert_same(training_step(checkpointed, images, labels), training_step(plain, images, labels))


@pytest.mark.parametrize("name", list_attentions())
def test_reversible_recompute_matches_its_reference(name):
    # float64: rebuilding each block's inputs from its outputs then costs nothing measurable.
    fast = build(name, reversible=True).double()
    reference = copy.deepcopy(fast)
    reference.blocks.recompute = False
    images, labels = batch(torch.float64)
    assert_same(training_step(fast, images, labels), training_step(reference, images, labels), rtol=1e-9, atol=1e-9)


def test_vq_statistics_count_once_and_its_loss_keeps_its_gradient():
    # What the registry-wide tests above rely on, spelled out on the variant with side effects.
    for model in (build("vq"), build("vq", reversible=True)):
        model.set_grad_checkpointing(True)
        images, labels = batch()
        torch.manual_seed(3)
        loss = F.cross_entropy(model(images), labels)
        aux = auxiliary_loss(model)
        pending = [block.attn.pending.clone() for block in model.blocks]
        qkv = model.blocks[0].attn.qkv.weight
        task_only = torch.autograd.grad(loss, qkv, retain_graph=True)[0]
        (loss + aux).backward()
        # Two backward passes, each recomputing the forward: the keys of the batch are still counted once.
        for block, before in zip(model.blocks, pending, strict=True):
            assert torch.equal(block.attn.pending, before)
        assert pending[0][..., -1].sum() == TINY["num_heads"] * 2 * 37
        assert not torch.allclose(qkv.grad, task_only)


def test_reentrant_checkpointing_is_refused_where_it_would_drop_a_loss():
    set_reentrant_ckpt(True)
    try:
        with pytest.raises(ValueError, match="reentrant gradient checkpointing .* VQAttention"):
            build("vq").set_grad_checkpointing(True)
        build("softmax").set_grad_checkpointing(True)
    finally:
        set_reentrant_ckpt(False)
