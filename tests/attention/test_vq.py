"""Transformer-VQ: the linear-time path against the quadratic reference, the exact limit, the commitment loss,
the EMA codebook (padding, gradient accumulation, data-parallel replicas) and the loss reaching training."""

import builders
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from builders import grads

import zoo
from zoo.attention import on_optimizer_step
from zoo.attention import vq as vq_module
from zoo.attention._registry import auxiliary_loss
from zoo.attention.vq import code_sums, codewords, quantize, vq_attention, vq_attention_reference

DIM, HEADS, BATCH, LENGTH, CODES = 32, 2, 2, 37, 16


def make(**options) -> torch.nn.Module:
    return builders.make("vq", DIM, HEADS, **{"codebook_size": CODES, "block_len": 8, **options})


def inputs(batch: int = BATCH, length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    return builders.tokens(batch, length, DIM, seed)


def gaussians(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_()


def padding(batch: int = BATCH) -> torch.Tensor:
    """`[batch, LENGTH]` keep mask: a padded tail; the second sample also padded at the start and in the middle."""
    keep = torch.ones(batch, LENGTH, dtype=torch.bool)
    keep[0, 30:] = False
    if batch > 1:
        keep[1, :3] = False
        keep[1, 12:15] = False
        keep[1, 33:] = False
    return keep


def keys_of(attention, x):
    return attention.project_qkv(x)[1].detach()


@pytest.mark.parametrize("block_len", [8, 64])
@pytest.mark.parametrize("is_causal", [False, True])
def test_linear_path_equals_quadratic_softmax_over_quantised_keys(is_causal, block_len):
    q, k, v = (gaussians(BATCH, HEADS, LENGTH, 8, seed=seed) for seed in (1, 2, 3))
    codebook = gaussians(HEADS, CODES, 8, seed=4).detach()
    codes, keep = quantize(k, codebook), padding()
    # Keys share codes, so the per-code aggregation is really exercised.
    assert all(len(row.unique()) < LENGTH for row in codes.flatten(0, 1))
    options = {"scale": 0.3, "block_len": block_len}
    out = vq_attention(q, k, v, codebook, codes, keep, is_causal, **options)
    expected = vq_attention_reference(q, k, v, codebook, codes, keep, is_causal, **options)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    (dq, dk, dv), (eq, ek, ev) = grads(out, (q, k, v)), grads(expected, (q, k, v))
    torch.testing.assert_close(dq, eq, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dv, ev, rtol=1e-10, atol=1e-10)
    if is_causal:
        torch.testing.assert_close(dk, ek, rtol=1e-10, atol=1e-10)
    else:
        # Straight-through per code: each code's keys share the sum of their per-key gradients.
        torch.testing.assert_close(code_sums(dk, codes, CODES), code_sums(ek, codes, CODES), rtol=1e-10, atol=1e-10)
    assert dk[~keep[:, None, :, None].expand_as(dk)].abs().max() == 0
    if is_causal:
        # The first queries of the second sample see only padded keys: zero, not an average of the future.
        assert out[1, :, :3].abs().max() == 0


def test_module_reference_path_agrees():
    fast, reference = make(), make(reference=True)
    x, keep = inputs(), padding()
    for is_causal in (False, True):
        torch.testing.assert_close(fast(x, keep, is_causal)[keep], reference(x, keep, is_causal)[keep])


@pytest.mark.parametrize("is_causal", [False, True])
def test_keys_equal_to_codewords_give_exact_softmax(is_causal):
    attention = make(codebook_size=64)
    x, keep = inputs(batch=1), padding(batch=1)
    with torch.no_grad():
        attention.codebook[:, :LENGTH] = keys_of(attention, x)[0]
    assert torch.equal(quantize(keys_of(attention, x), attention.codebook)[0], torch.arange(LENGTH).expand(HEADS, -1))
    softmax = zoo.create_attention("softmax", DIM, HEADS).eval()
    softmax.load_state_dict(attention.state_dict(), strict=False)
    torch.testing.assert_close(attention(x, keep, is_causal), softmax(x, keep, is_causal), rtol=1e-5, atol=1e-5)


def test_commitment_loss_in_training_reaches_only_the_keys():
    attention = make(beta=0.5).train()
    x, keep = inputs(), padding()
    attention(x, keep)
    loss = attention.aux_loss
    assert loss.ndim == 0 and torch.isfinite(loss) and loss > 0
    k = keys_of(attention, x)
    error = (k - codewords(attention.codebook, quantize(k, attention.codebook))).square().sum((1, 3))
    torch.testing.assert_close(loss, 0.5 * error[keep].mean())
    torch.testing.assert_close(auxiliary_loss(attention), loss)
    loss.backward()
    q_rows, k_rows, v_rows = attention.qkv.weight.grad.chunk(3)
    assert k_rows.abs().sum() > 0 and q_rows.abs().sum() == 0 and v_rows.abs().sum() == 0
    attention.eval()
    attention(x, keep)
    assert attention.aux_loss is None and auxiliary_loss(attention) == 0.0


def test_ema_moves_codewords_toward_their_keys():
    attention = make(decay=0.5).train()
    x = inputs()
    before, k = attention.codebook.clone(), keys_of(attention, x)
    sums = code_sums(torch.cat([k, torch.ones_like(k[..., :1])], -1), quantize(k, before), CODES).sum(0)
    key_sum, count = sums[..., :-1], sums[..., -1]
    attention(x)
    on_optimizer_step(attention)
    used = count > 0
    mean = key_sum / count.clamp_min(1)[..., None]
    distance_before, distance_after = (before - mean).norm(dim=-1), (attention.codebook - mean).norm(dim=-1)
    assert used.sum() > CODES and (distance_after[used] < distance_before[used]).all()
    ema_count, ema_sum = 0.5 + 0.5 * count, 0.5 * before + 0.5 * key_sum
    total = ema_count.sum(-1, keepdim=True)
    smoothed = (ema_count + attention.eps) / (total + CODES * attention.eps) * total
    torch.testing.assert_close(attention.codebook, ema_sum / smoothed[..., None])
    torch.testing.assert_close(attention.ema_count, ema_count)
    torch.testing.assert_close(attention.ema_sum, ema_sum)
    # Without a training forward since the last step, a step changes nothing.
    after = attention.codebook.clone()
    on_optimizer_step(attention)
    attention.eval()
    attention(x)
    on_optimizer_step(attention)
    assert torch.equal(attention.codebook, after)


def test_codewords_stay_near_their_keys_over_many_steps():
    # Regression: ema_sum shared the codebook's storage, so each update replaced the EMA sums by codewords and a
    # codeword no key chose grew by about 1 / its decayed count per step (inf after 134 steps on ListOps).
    attention = make(codebook_size=256).train()  # more codes than the 148 keys: some never chosen
    assert attention.ema_sum.data_ptr() != attention.codebook.data_ptr()
    x = inputs(batch=4)
    scale = keys_of(attention, x).abs().max()
    for _ in range(200):
        attention(x)
        on_optimizer_step(attention)
    unused = attention.ema_count < 0.99**200 * 1.01
    assert unused.any() and (~unused).any()
    assert attention.codebook.isfinite().all() and attention.codebook.abs().max() < 2 * scale


def test_micro_batches_make_one_update_like_the_whole_batch():
    whole, split = make().train(), make().train()
    x = inputs(batch=4)
    whole(x)
    split(x[:1])
    split(x[1:])
    on_optimizer_step(whole)
    on_optimizer_step(split)
    torch.testing.assert_close(split.codebook, whole.codebook)
    torch.testing.assert_close(split.ema_count, whole.ema_count)


def test_padded_keys_change_no_count_codeword_or_loss():
    x, keep = inputs(), padding()
    changed = x.clone()
    changed[~keep] = torch.randn_like(changed[~keep]) * 40
    results = []
    for data in (x, changed):
        attention = make().train()
        attention(data, keep)
        loss, counts = attention.aux_loss.detach(), attention.pending[..., -1].clone()
        on_optimizer_step(attention)
        results.append((loss, counts, attention.codebook.clone(), attention.ema_sum.clone()))
    assert results[0][1].sum() == HEADS * keep.sum()
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


def test_data_parallel_replicas_make_the_update_of_the_whole_batch(monkeypatch):
    x = inputs(batch=4)
    whole = make().train()
    whole(x)
    on_optimizer_step(whole)
    replicas = [make().train(), make().train()]
    replicas[0](x[:2])
    replicas[1](x[2:])
    pending = [replica.pending.clone() for replica in replicas]
    calls = []

    def all_reduce(tensor):
        # Two replicas summing: each one's statistics plus the other's.
        tensor += pending[1 - len(calls)]
        calls.append(tensor)

    monkeypatch.setattr(vq_module, "_distributed", lambda: True)
    monkeypatch.setattr(vq_module.dist, "all_reduce", all_reduce)
    for replica in replicas:
        on_optimizer_step(replica)
    assert len(calls) == 2
    for replica in replicas:
        torch.testing.assert_close(replica.codebook, whole.codebook)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_all_reduce_under_an_initialised_process_group(tmp_path):
    expected = make().train()
    expected(inputs())
    on_optimizer_step(expected)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        attention = make().train()
        attention(inputs())
        on_optimizer_step(attention)
        # A replica with no training forward still joins the collective, and changes nothing.
        on_optimizer_step(attention)
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(attention.codebook, expected.codebook)


def test_training_step_adds_the_commitment_loss():
    torch.manual_seed(0)
    model = zoo.create_model(
        "vit_tiny_patch16_224",
        attention="vq",
        attention_options={"codebook_size": 8, "beta": 1.0},
        img_size=32,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=10,
        in_chans=1,
    ).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    images, labels = torch.randn(2, 1, 32, 32), torch.tensor([1, 3])
    task = F.cross_entropy(model(images), labels)
    aux = auxiliary_loss(model)
    torch.testing.assert_close(aux, sum(block.attn.aux_loss for block in model.blocks))
    assert aux > 0 and aux.requires_grad
    # What the engine does: the auxiliary loss joins the task loss; it changes the keys' gradient.
    # The last block: earlier blocks also feed the later blocks' keys, so their queries see the loss too.
    qkv = model.blocks[-1].attn.qkv.weight
    task_only = torch.autograd.grad(task, qkv, retain_graph=True)[0]
    (task + aux).backward()
    assert not torch.allclose(qkv.grad.chunk(3)[1], task_only.chunk(3)[1])
    torch.testing.assert_close(qkv.grad.chunk(3)[0], task_only.chunk(3)[0])
    codebooks = [block.attn.codebook.clone() for block in model.blocks]
    optimizer.step()
    on_optimizer_step(model)
    assert all(not torch.equal(block.attn.codebook, old) for block, old in zip(model.blocks, codebooks, strict=True))
    assert all(block.attn.pending is None for block in model.blocks)
    model.eval()
    model(images)
    assert auxiliary_loss(model) == 0.0


@pytest.mark.parametrize(
    "options, message",
    [
        ({"codebook_size": 0}, "codebook_size=0"),
        ({"block_len": 2.5}, "block_len=2.5"),
        ({"decay": 1.0}, r"decay=1.0 .*\[0.0, 1.0\)"),
        ({"beta": -1}, "beta=-1"),
        ({"eps": 0}, "eps=0"),
    ],
)
def test_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        zoo.create_attention("vq", DIM, HEADS, **options)
