"""1-D sequence models: shapes per task and input, ViT weights, padding and causality, RevIN, PatchTST patching,
gradient checkpointing, recurrent generation."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F

from zoo.attention import get_attention, list_attentions
from zoo.attention.softmax import SoftmaxAttention, softmax_attention
from zoo.data.dna import packaged as dna
from zoo.kinds import get_model_kind
from zoo.models.embeddings import (
    DNA_CLS,
    DNA_MASK,
    DNA_PAD,
    DNA_TOKENS,
    KMER_SPECIALS,
    KmerEmbedding,
    PatchEmbedding,
    RevIN,
    num_patches,
)
from zoo.models.generation import generate, has_step, recurrent_logits, sample_next, supports_recurrent
from zoo.models.sequence import SequenceTransformer, create_sequence_model, load_vit_weights, with_rotary
from zoo.tasks import IGNORE_INDEX, get_task
from zoo.train._objective import TaskObjective

TINY = {"depth": 2, "dim": 32, "num_heads": 2}
B, N = 2, 37
SERIES = {"seq_len": N, "horizon": 11, "patch_len": 8, "patch_stride": 4}


def _tokens(seed: int = 0, length: int = N) -> torch.Tensor:
    return torch.randint(3, 8, (B, length), generator=torch.Generator().manual_seed(seed))


def _padding(length: int = N, kept: int = 29) -> torch.Tensor:
    mask = torch.ones(B, length, dtype=torch.bool)
    mask[1, kept:] = False
    return mask


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize(
    "task, input, options, shape",
    [
        ("classification", "dna", {"num_classes": 3}, (B, 3)),
        ("classification", "kmer", {"num_classes": 3, "kmer": 3, "kmer_stride": 1, "pool": "attention"}, (B, 3)),
        ("classification", "series", {"num_classes": 3, "num_channels": 4, "pool": "mean"}, (B, 3)),
        ("classification", "series", {"num_classes": 3, "num_channels": 4, "channel_independent": False}, (B, 3)),
        ("token_classification", "dna", {"num_classes": 5}, (B, N, 5)),
        ("token_classification", "kmer", {"num_classes": 5, "kmer": 4}, (B, N, 5)),
        ("forecast", "series", {**SERIES, "num_channels": 4}, (B, 11, 4)),
        (
            "forecast",
            "series",
            {**SERIES, "num_channels": 4, "channel_independent": False, "forecast_loss": "mae"},
            (B, 11, 4),
        ),
        ("forecast", "series", {**SERIES, "num_channels": 4, "target_channels": [2]}, (B, 11, 1)),
        ("causal_lm", "dna", {}, (B, N, 8)),
    ],
)
def test_every_task_and_input_gives_its_shape_and_a_finite_loss_with_gradients(task, input, options, shape):
    model = create_sequence_model(task, input=input, attention="performer", **TINY, **options)
    inputs = torch.randn(B, N, options.get("num_channels", 1)) if input == "series" else _tokens()
    mask = _padding()
    out = model(inputs, mask)
    assert out.shape == shape
    targets = {
        "classification": torch.tensor([0, 2]),
        "forecast": torch.randn(shape),
        "token_classification": torch.randint(0, 5, (B, N)),
        "causal_lm": inputs,
    }[task]
    loss = model.loss(out, targets, None if task == "forecast" else mask)
    assert torch.isfinite(loss)
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name


def test_unsupported_combinations_and_names_are_errors_naming_the_value():
    with pytest.raises(ValueError, match="did you mean 'forecast'"):
        create_sequence_model("forcast", **TINY)
    with pytest.raises(ValueError, match="'forecast' does not take input 'dna'"):
        create_sequence_model("forecast", input="dna", seq_len=64, horizon=8, **TINY)
    with pytest.raises(ValueError, match="num_classes"):
        create_sequence_model("classification", **TINY)
    with pytest.raises(ValueError, match="no causal mode"):
        create_sequence_model("causal_lm", attention="nystrom", **TINY)
    with pytest.raises(ValueError, match="did you mean 'mean'"):
        create_sequence_model("classification", num_classes=2, pool="maen", **TINY)
    with pytest.raises(ValueError, match="score='labelled' is for per-position classification; task 'classification'"):
        create_sequence_model("classification", num_classes=2, score="labelled", **TINY)
    classifier = create_sequence_model("classification", num_classes=2, **TINY)
    with pytest.raises(ValueError, match="positions are for per-position tasks, not task 'classification'"):
        classifier(_tokens(), positions=_padding())


def test_vit_block_weights_load_and_compute_the_same_function():
    vit = timm.create_model("vit_tiny_patch16_224", embed_dim=32, depth=2, num_heads=2, num_classes=0).eval()
    backbone = SequenceTransformer(**TINY, attention="softmax", positions="none", pool="cls").eval()
    assert load_vit_weights(backbone, vit.state_dict()) == []
    for key, value in vit.state_dict().items():
        if key.startswith(("blocks.", "norm.")) or key == "cls_token":
            assert torch.equal(backbone.state_dict()[key], value), key
    x = torch.randn(B, N, 32)
    expected = vit.norm(vit.blocks(torch.cat([vit.cls_token.expand(B, -1, -1), x], 1)))
    torch.testing.assert_close(backbone.forward_features(x), expected)


def test_vit_weights_load_into_a_variant_with_its_own_attention_buffers():
    vit = timm.create_model("vit_tiny_patch16_224", embed_dim=32, depth=2, num_heads=2, num_classes=0)
    backbone = SequenceTransformer(**TINY, attention="performer", attention_options={"nb_features": 16})
    extras = load_vit_weights(backbone, vit.state_dict())
    assert extras and all(".attn." in key for key in extras)
    assert torch.equal(backbone.blocks[1].attn.qkv.weight, vit.blocks[1].attn.qkv.weight)
    with pytest.raises(ValueError, match="shape"):
        load_vit_weights(SequenceTransformer(depth=2, dim=64, num_heads=2), vit.state_dict())


@pytest.mark.parametrize("attention", ["softmax", "performer", "local"])
@pytest.mark.parametrize("pool", ["cls", "mean", "attention", None])
def test_padded_embeddings_never_reach_the_backbone_output(attention, pool):
    # At the backbone, not the model: the token embedding already maps padded ids to the pad id, so only
    # changed embeddings show that attention and pooling mask padded keys.
    backbone = SequenceTransformer(**TINY, attention=attention, pool=pool).eval()
    mask = _padding()
    x = torch.randn(B, N, 32)
    changed = x.masked_fill(~mask[..., None], 0.0) + 10 * torch.randn(B, N, 32) * ~mask[..., None]
    keep = slice(None) if pool else mask
    torch.testing.assert_close(backbone(changed, mask)[keep], backbone(x, mask)[keep])


@pytest.mark.parametrize("attention", ["softmax", "performer", "local"])
@pytest.mark.parametrize("pool", ["cls", "mean", "attention"])
def test_padded_tokens_never_change_a_pooled_result(attention, pool):
    model = create_sequence_model("classification", attention=attention, pool=pool, num_classes=3, **TINY).eval()
    mask = _padding()
    tokens = _tokens()
    changed = tokens.clone()
    changed[~mask] = _tokens(seed=1)[~mask]
    assert not torch.equal(tokens, changed)
    torch.testing.assert_close(model(changed, mask), model(tokens, mask))
    # The unpadded sample is itself: padding another sample changes nothing for it.
    torch.testing.assert_close(model(tokens[:1], mask[:1]), model(tokens, mask)[:1])


@pytest.mark.parametrize("input", ["dna", "kmer"])
def test_padded_tokens_never_change_per_token_outputs_at_kept_positions(input):
    model = create_sequence_model(
        "token_classification", input=input, attention="performer", num_classes=4, **TINY
    ).eval()
    mask = _padding(kept=30)
    tokens, changed = _tokens(), _tokens()
    changed[~mask] = _tokens(seed=1)[~mask]
    torch.testing.assert_close(model(changed, mask)[mask], model(tokens, mask)[mask])


def _labels(num_classes: int, seed: int = 0) -> torch.Tensor:
    """`[B, N]`: a class at about one position in four, `IGNORE_INDEX` elsewhere (a recall probe's layout), one
    of them padded (`_padding`) so that it must not count."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (B, N), generator=generator)
    labels = labels.masked_fill(torch.rand(B, N, generator=generator) > 0.25, IGNORE_INDEX)
    labels[1, -1] = 1
    return labels


@pytest.mark.parametrize(
    "task, input, options",
    [
        ("token_classification", "tokens", {"num_classes": 6, "vocab_size": 11}),
        ("token_classification", "dna", {"num_classes": 6}),
        ("token_classification", "kmer", {"num_classes": 6, "kmer": 3}),
        ("causal_lm", "dna", {}),
    ],
)
def test_positions_give_the_rows_of_the_full_outputs_and_one_token_inputs_head_only_those(task, input, options):
    model = create_sequence_model(task, input=input, attention="softmax", **TINY, **options).eval()
    tokens, mask = _tokens(), _padding()
    positions = (_labels(6) != IGNORE_INDEX) & mask
    rows = []
    model.head.register_forward_hook(lambda head, args, out: rows.append(args[0].shape[:-1].numel()))
    full, chosen = model(tokens, mask), model(tokens, mask, positions=positions)
    assert chosen.shape == (int(positions.sum()), full.shape[-1])
    torch.testing.assert_close(chosen, full[positions])
    if input == "kmer":
        # a token stands for 3 positions: every token is headed, then the positions are selected
        assert not model.head_on_positions and rows[1] == rows[0]
        return
    assert model.head_on_positions and rows == [B * N, int(positions.sum())]
    # the reference path: the head on every token, the rows selected after it
    model.head_on_positions = False
    torch.testing.assert_close(model(tokens, mask, positions=positions), chosen)
    assert rows[-1] == B * N


@pytest.mark.parametrize("task", ["token_classification", "causal_token_classification"])
@pytest.mark.parametrize("input, options", [("tokens", {"vocab_size": 11}), ("dna", {}), ("kmer", {"kmer": 3})])
def test_scoring_the_labelled_positions_gives_the_loss_and_gradients_of_all(task, input, options):
    model = create_sequence_model(task, input=input, attention="softmax", num_classes=6, **TINY, **options)
    batch = {"tokens": _tokens(), "mask": _padding(), "labels": _labels(6)}
    kind = get_model_kind("sequence")

    def loss_and_grads(loss_of):
        model.zero_grad()
        loss = loss_of()
        loss.backward()
        return loss.detach(), {name: param.grad.clone() for name, param in model.named_parameters()}

    # by hand: the full logits' rows at the kept, labelled positions
    tokens, mask, labels = batch["tokens"], batch["mask"], batch["labels"]
    keep = mask & (labels != IGNORE_INDEX)
    expected = loss_and_grads(lambda: F.cross_entropy(model(tokens, mask)[keep], labels[keep]))
    for score in ("all", "labelled"):
        objective = TaskObjective(kind, get_task(task).configured(score=score))
        loss, grads = loss_and_grads(lambda objective=objective: objective.loss(model, batch))
        torch.testing.assert_close(loss, expected[0])
        assert grads.keys() == expected[1].keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected[1][name], msg=f"{score}: {name}")


def test_padded_steps_never_change_a_forecast():
    model = create_sequence_model(
        "forecast", input="series", num_channels=3, seq_len=N, horizon=7, patch_len=8, patch_stride=4, **TINY
    ).eval()
    mask = _padding(kept=25)
    series = torch.randn(B, N, 3)
    # Missing steps may hold anything, NaN included.
    changed = series.masked_fill(~mask[..., None], float("nan"))
    torch.testing.assert_close(model(changed, mask), model(series, mask))


@pytest.mark.parametrize("attention", ["softmax", "performer", "local"])
def test_causal_lm_never_sees_the_future(attention):
    model = create_sequence_model("causal_lm", attention=attention, positions="rotary", **TINY).eval()
    tokens = _tokens()
    logits = model(tokens)
    for t in (0, 17, N - 2):
        changed = tokens.clone()
        changed[:, t + 1 :] = _tokens(seed=t + 1)[:, t + 1 :]
        torch.testing.assert_close(model(changed)[:, : t + 1], logits[:, : t + 1])


def test_rotary_scores_depend_only_on_relative_position():
    attn = with_rotary(SoftmaxAttention)(32, num_heads=2).eval()
    x = torch.randn(1, 1, 32).expand(1, 6, 32)
    q, k, _ = attn.project_qkv(x)
    scores = q @ k.transpose(-2, -1)
    torch.testing.assert_close(scores[..., 1:, 1:], scores[..., :-1, :-1])


def test_language_model_ties_output_and_input_embeddings_unless_told_not_to():
    tied = create_sequence_model("causal_lm", **TINY)
    assert tied.head.weight is tied.embed.weight
    untied = create_sequence_model("causal_lm", tie_embeddings=False, **TINY)
    assert untied.head.weight is not untied.embed.weight


def test_lm_loss_ignores_padded_targets():
    model = create_sequence_model("causal_lm", **TINY)
    tokens, mask = _tokens(), _padding()
    logits = model(tokens, mask)
    changed = tokens.clone()
    changed[~mask] = DNA_PAD
    assert torch.equal(model.loss(logits, changed, mask), model.loss(logits, tokens, mask))


def test_revin_round_trip_and_masked_statistics():
    revin = RevIN(3)
    with torch.no_grad():
        revin.weight.uniform_(0.5, 2.0)
        revin.bias.normal_()
    series = torch.randn(B, 3, N) * 5 + 3
    normalised, stats = revin.normalize(series)
    torch.testing.assert_close(revin.denormalize(normalised, stats), series)
    mask = _padding(kept=20)
    _, (mean, std) = revin.normalize(series.masked_fill(~mask[:, None], float("nan")), mask)
    torch.testing.assert_close(mean[1, :, 0], series[1, :, :20].mean(-1))
    torch.testing.assert_close(std[1, :, 0], (series[1, :, :20].var(-1, unbiased=False) + revin.eps).sqrt())


@pytest.mark.parametrize("length, patch_len, stride, expected", [(336, 16, 8, 42), (512, 16, 8, 64), (37, 8, 4, 9)])
def test_patchtst_patch_counts(length, patch_len, stride, expected):
    # PatchTST: N = (L - P) // S + 2 (42 patches for L=336, P=16, S=8 in the paper).
    assert num_patches(length, patch_len, stride) == expected
    independent = PatchEmbedding(16, num_channels=3, patch_len=patch_len, stride=stride)
    mixing = PatchEmbedding(16, num_channels=3, patch_len=patch_len, stride=stride, channel_independent=False)
    series = torch.randn(B, 3, length)
    assert independent(series)[0].shape == (B * 3, expected, 16)
    assert mixing(series)[0].shape == (B, expected, 16)
    patches, _ = independent.patchify(series)
    # The last patch ends on the end padding: the last step repeated `stride` times.
    torch.testing.assert_close(patches[..., -1, -1], series[..., -1])
    torch.testing.assert_close(patches[..., 1, :], series[..., stride : stride + patch_len])


def test_kmer_ids_count_in_base_four_and_mark_unknown_windows():
    embed = KmerEmbedding(8, k=3)
    # A C G | T N A | C G <pad>  (ids: A=3, C=4, G=5, T=6, N=7)
    ids, kept = embed.kmer_ids(torch.tensor([[3, 4, 5, 6, 7, 3, 4, 5]]))
    base = len(KMER_SPECIALS)
    assert ids.tolist() == [[base + 0 * 16 + 1 * 4 + 2, embed.other_id, embed.other_id]]
    assert kept.all()
    assert embed.kmer_ids(torch.zeros(1, 10, dtype=torch.long) + 3, torch.ones(1, 10, dtype=torch.bool))[0].shape == (
        1,
        4,
    )


@pytest.mark.parametrize("k", [1, 3])
def test_vocabularies_agree_with_the_data_tokenizer(k):
    codes = dna.encode_nucleotides("ACGTTGCANNACGGTCA")
    nucleotides = dna.DNATokenizer(k=1)(codes)
    assert (dna.PAD_ID, dna.CLS_ID, dna.MASK_ID) == (DNA_PAD, DNA_CLS, DNA_MASK)
    assert "".join(DNA_TOKENS[i] for i in nucleotides.tolist()) == "ACGTTGCANNACGGTCA"
    tokenizer = dna.DNATokenizer(k=k, overlapping=False)
    embed = KmerEmbedding(8, k=k)
    assert embed.vocab_size == tokenizer.vocab_size
    expected = tokenizer(codes)
    assert torch.equal(embed.kmer_ids(nucleotides[None])[0][0, : len(expected)], expected)


def test_learned_positions_resample_past_their_table():
    model = create_sequence_model("classification", num_classes=2, max_len=16, **TINY)
    assert model(_tokens(length=40)).shape == (B, 2)


def test_gradient_checkpointing_gives_the_same_gradients():
    model = create_sequence_model("classification", attention="performer", num_classes=3, **TINY)
    tokens, mask, labels = _tokens(), _padding(), torch.tensor([1, 2])

    def grads():
        model.zero_grad()
        model.loss(model(tokens, mask), labels).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    reference = grads()
    model.set_grad_checkpointing(True)
    checkpointed = grads()
    for name, grad in reference.items():
        torch.testing.assert_close(checkpointed[name], grad, msg=name)


@pytest.mark.parametrize("attention, causal", [("performer", False), ("performer", True)])
def test_long_sequences_run_forward_with_linear_attention(attention, causal):
    task = "causal_lm" if causal else "classification"
    model = create_sequence_model(
        task,
        attention=attention,
        attention_options={"nb_features": 16},
        num_classes=2,
        depth=1,
        dim=32,
        num_heads=2,
        max_len=512,
    ).eval()
    tokens = torch.randint(3, 8, (1, 8192), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(tokens)
        # 8192 positions summed in fp32 (the feature map's normaliser, the key-value state) against float64
        exact = model.double()(tokens)
    torch.testing.assert_close(out.double(), exact, rtol=1e-3, atol=1e-4)


class _KVCacheSoftmax(SoftmaxAttention):
    """Exact softmax with a key/value cache as its recurrent state: exercises generation on any block stack."""

    def decode_step(self, x, state=None, *, keep=None):
        q, k, v = self.project_qkv(x)
        if state is not None:
            k, v = torch.cat([state[0], k], dim=2), torch.cat([state[1], v], dim=2)
        return self.project_out(softmax_attention(q, k, v, scale=self.scale), x), (k, v)


def _lm_with_cache(positions: str):
    model = create_sequence_model("causal_lm", positions=positions, max_len=64, **TINY).eval()
    cached = with_rotary(_KVCacheSoftmax) if positions == "rotary" else _KVCacheSoftmax
    for block in model.backbone.blocks:
        block.attn.__class__ = cached
    return model


@pytest.mark.parametrize("positions", ["rotary", "learned", "sinusoidal"])
def test_recurrent_logits_equal_the_full_forward(positions):
    model = _lm_with_cache(positions)
    assert supports_recurrent(model)
    tokens = _tokens(length=19)
    torch.testing.assert_close(recurrent_logits(model, tokens), model(tokens), atol=1e-5, rtol=1e-5)


def test_greedy_recurrent_decoding_equals_greedy_full_forward_decoding():
    model = _lm_with_cache("rotary")
    prompt = _tokens(length=7)
    recurrent = generate(model, prompt, 12, temperature=0, recurrent=True)
    full = generate(model, prompt, 12, temperature=0, recurrent=False)
    assert recurrent.shape == (B, 19) and torch.equal(recurrent[:, :7], prompt)
    assert torch.equal(recurrent, full)


def test_sampling_is_reproducible_with_a_generator_and_respects_top_k():
    model = create_sequence_model("causal_lm", **TINY)
    first = generate(model, _tokens(length=4), 6, top_k=3, generator=torch.Generator().manual_seed(3))
    second = generate(model, _tokens(length=4), 6, top_k=3, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, second)
    # another seed draws another continuation (a sampler that ignored its generator, or drew greedily, would not)
    other = generate(model, _tokens(length=4), 6, top_k=3, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(first, other)
    # top 2 of 4: tokens 1 and 2 only, in the softmax's ratio of the two, e^5 : e^4, so token 1 with
    # p = e / (e + 1); 2,000 draws put its share within 4 standard deviations (sqrt(p (1 - p) / 2000) < 0.01)
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]]).expand(2000, 4)
    drawn = sample_next(logits, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {1, 2}
    assert abs(drawn.eq(1).float().mean().item() - math.e / (math.e + 1)) < 0.04
    assert model.training


# every registered attention with a recurrent step, read off the registry: a new one is checked with no test edit
RECURRENT = [name for name in list_attentions() if has_step(get_attention(name))]


def test_the_linear_families_decode_recurrently():
    assert {"linear", "performer"} <= set(RECURRENT)


@pytest.mark.parametrize("attention", RECURRENT)
def test_recurrent_step_matches_the_full_forward(attention):
    model = create_sequence_model("causal_lm", attention=attention, **TINY).eval()
    assert supports_recurrent(model)
    tokens = _tokens(length=19)
    torch.testing.assert_close(recurrent_logits(model, tokens), model(tokens), atol=1e-4, rtol=1e-4)
    prompt = tokens[:, :5]
    assert torch.equal(
        generate(model, prompt, 8, temperature=0), generate(model, prompt, 8, temperature=0, recurrent=False)
    )


def test_recurrent_decoding_without_a_step_is_an_error_naming_the_attention():
    model = create_sequence_model("causal_lm", attention="softmax", **TINY).eval()
    assert not supports_recurrent(model)
    with pytest.raises(ValueError, match="attention 'softmax' has no recurrent decode_step"):
        generate(model, _tokens(length=4), 2, temperature=0, recurrent=True)


def test_revin_stats_let_the_model_tell_series_of_one_shape_but_another_scale_apart():
    def build(**options):
        torch.manual_seed(0)
        return create_sequence_model("classification", input="series", num_classes=3, dim=16, depth=1,
                                     num_heads=2, seq_len=32, num_channels=2, **options).eval()  # fmt: skip

    series = torch.randn(1, 32, 2)
    scaled = torch.cat([series, 100 * series + 5])
    plain, with_stats = build(), build(revin_stats=True)
    # RevIN alone: one output for both; the statistics' embedding starts at zero, so at first it is the same model
    out = plain(scaled)
    torch.testing.assert_close(out[0], out[1], atol=1e-4, rtol=0)
    torch.testing.assert_close(with_stats(scaled), out, atol=1e-5, rtol=0)
    with torch.no_grad():
        with_stats.stats_embed.proj.weight.normal_()
    out = with_stats(scaled)
    assert (out[0] - out[1]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="revin_stats=True needs a series input with revin=True"):
        build(revin_stats=True, revin=False)
