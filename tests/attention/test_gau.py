"""GAU / FLASH: mixed chunk attention against a dense reference, the slot form's weight mapping, the GAU layer."""

import builders
import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import zoo
from zoo.attention._kernels import gau as gau_kernel
from zoo.attention.gau import (
    GatedAttentionUnit,
    mixed_chunk_attention,
    mixed_chunk_attention_reference,
    scale_offset,
)
from zoo.models import GAUBlock, block_class

B, H, N, S, E = 2, 2, 37, 6, 5


def qkv_inputs(n: int = N, dtype=torch.float64, seed: int = 0) -> list[torch.Tensor]:
    """quad_q, quad_k, lin_q, lin_k of width S, then v of width E."""
    return builders.qkv(B, H, n, (S, S, S, S, E), dtype=dtype, seed=seed, requires_grad=True)


def padding(n: int = N) -> torch.Tensor:
    return builders.padded_tails(n, (n, n - 9))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("n", "group_size"), [(37, 8), (32, 8), (37, 64), (37, 1)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("one_chunk_per_pass", [False, True])
def test_mixed_chunk_equals_dense_reference(monkeypatch, is_causal, n, group_size, masked, one_chunk_per_pass):
    if one_chunk_per_pass:
        monkeypatch.setattr(gau_kernel, "_PASS_BYTES", 1)
    inputs = qkv_inputs(n)
    options = {"mask": padding(n) if masked else None, "is_causal": is_causal, "group_size": group_size}
    fast = mixed_chunk_attention(*inputs, **options)
    reference = mixed_chunk_attention_reference(*inputs, **options)
    torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(fast)
    grads_fast = torch.autograd.grad(fast, inputs, grad)
    grads_reference = torch.autograd.grad(reference, inputs, grad)
    for got, want in zip(grads_fast, grads_reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_reference_spells_out_the_paper_formula():
    quad_q, quad_k, lin_q, lin_k, v = (t.detach() for t in qkv_inputs(12))
    out = mixed_chunk_attention_reference(quad_q, quad_k, lin_q, lin_k, v, is_causal=True, group_size=4)
    b, h, i = 1, 0, 9  # chunk 2 holds positions 8..11
    expected = torch.zeros(E, dtype=torch.float64)
    for j in range(12):
        if j // 4 == i // 4 and j <= i:
            expected += F.relu(quad_q[b, h, i] @ quad_k[b, h, j] / 4).square() * v[b, h, j]
        if j // 4 < i // 4:
            expected += (lin_q[b, h, i] @ lin_k[b, h, j] / 12) * v[b, h, j]
    torch.testing.assert_close(out[b, h, i], expected)


@pytest.mark.parametrize("is_causal", [False, True])
def test_padding_equals_truncation(is_causal):
    # The paper's n counts the real keys of each sample, so padding a sequence changes nothing.
    inputs = [t.detach() for t in qkv_inputs()]
    keep = padding()
    out = mixed_chunk_attention(*inputs, mask=keep, is_causal=is_causal, group_size=8)
    short = mixed_chunk_attention(*(t[1:, :, :28] for t in inputs), is_causal=is_causal, group_size=8)
    torch.testing.assert_close(out[1:, :, :28], short)


def test_causal_prefix_never_sees_the_future():
    inputs = [t.detach() for t in qkv_inputs()]
    changed = [t.clone() for t in inputs]
    for t in changed:
        t[:, :, 20:] = torch.randn_like(t[:, :, 20:]) * 40
    out = mixed_chunk_attention(*inputs, is_causal=True, group_size=8)
    out_changed = mixed_chunk_attention(*changed, is_causal=True, group_size=8)
    torch.testing.assert_close(out[:, :, :20], out_changed[:, :, :20])


def test_slot_form_maps_qkv_rows_to_z_gate_and_values():
    torch.manual_seed(0)
    attention = zoo.create_attention("gau", 32, 2, group_size=8, qkv_bias=True).double()
    with torch.no_grad():
        attention.gamma.normal_()
        attention.beta.normal_()
    x = torch.randn(B, N, 32, dtype=torch.float64)
    keep = padding()
    z, u, v = rearrange(F.silu(attention.qkv(x)), "b n (t h d) -> t b h n d", t=3, h=2)
    quad_q, quad_k, lin_q, lin_k = scale_offset(z, attention.gamma, attention.beta)
    out = mixed_chunk_attention_reference(quad_q, quad_k, lin_q, lin_k, v, mask=keep, group_size=8)
    expected = attention.proj(rearrange(out * u, "b h n d -> b n (h d)"))
    torch.testing.assert_close(attention(x, attn_mask=keep), expected)


def test_slot_form_options_are_checked():
    with pytest.raises(ValueError, match="group_size=0"):
        zoo.create_attention("gau", 32, 2, group_size=0)
    with pytest.raises(ValueError, match="attn_drop"):
        zoo.create_attention("gau", 32, 2, attn_drop=0.1)
    # qk_norm normalises the shared Z on the query and the key side
    attention = zoo.create_attention("gau", 32, 2, qk_norm=True, norm_layer=torch.nn.LayerNorm)
    attention(torch.randn(1, 5, 32)).sum().backward()
    assert attention.q_norm.weight.grad is not None and attention.k_norm.weight.grad is not None


def test_gau_layer_is_single_head_mixed_chunk_attention():
    torch.manual_seed(0)
    layer = GatedAttentionUnit(16, z_dim=8, expansion=2, group_size=8).double()
    with torch.no_grad():
        layer.gamma.normal_()
    x = torch.randn(B, N, 16, dtype=torch.float64)
    u, v, z = F.silu(layer.uv(layer.norm(x))).split([32, 32, 8], dim=-1)
    quad_q, quad_k, lin_q, lin_k = scale_offset(z[:, None], layer.gamma, layer.beta)
    out = mixed_chunk_attention_reference(quad_q, quad_k, lin_q, lin_k, v[:, None], is_causal=True, group_size=8)
    torch.testing.assert_close(layer(x, is_causal=True), layer.proj(u * out[:, 0]))


def test_gau_block_causal_and_padding():
    torch.manual_seed(0)
    block = GAUBlock(16, z_dim=8, group_size=8).eval()
    x = torch.randn(B, N, 16)
    changed = x.clone()
    changed[:, 20:] = torch.randn_like(changed[:, 20:]) * 40
    torch.testing.assert_close(block(x, is_causal=True)[:, :20], block(changed, is_causal=True)[:, :20])
    keep = padding()
    padded = x.clone()
    padded[~keep] = torch.randn_like(padded[~keep]) * 40
    torch.testing.assert_close(block(x, attn_mask=keep)[keep], block(padded, attn_mask=keep)[keep])


def test_two_gau_layers_have_about_the_parameters_of_attention_plus_mlp():
    from timm.models.vision_transformer import Block

    gau = sum(p.numel() for p in GAUBlock(384).parameters())
    transformer = sum(p.numel() for p in Block(384, 6).parameters())
    assert 0.9 < gau / transformer < 1.2


def test_gau_block_refuses_what_it_cannot_apply():
    with pytest.raises(ValueError, match="qk_norm"):
        GAUBlock(16, qk_norm=True)
    with pytest.raises(ValueError, match="attn_drop"):
        GAUBlock(16, attn_drop=0.1)
    with pytest.raises(ValueError, match="attention must be 'gau', got 'performer'"):
        block_class("gau", attention="performer")
    with pytest.raises(ValueError, match="no option 'zdim'.*did you mean 'z_dim'"):
        block_class("gau", attention="gau", block_options={"zdim": 4})
    with pytest.raises(ValueError, match="ff_chunks=4"):
        block_class("gau", attention="gau", ff_chunks=4)
    bound = block_class("gau", attention="gau", attention_options={"group_size": 16}, block_options={"z_dim": 4})
    assert bound.bound_options == {"group_size": 16, "z_dim": 4}
