"""timm's NaFlex ViT with any zoo attention: images at their own size and aspect ratio, batches padded by tokens.

NaFlex ViT (`timm.models.naflexvit`, after "Patch n' Pack: NaViT" (Dehghani et al. 2023),
https://arxiv.org/abs/2307.06304, and FlexiViT (Beyer et al. 2023), https://arxiv.org/abs/2212.08013) takes a
batch as a dict `{"patches": [B, N, P*P*C], "patch_coord": [B, N, 2], "patch_valid": [B, N]}`: each image
patchified at its own grid, in raster order, then padding up to the batch's longest sample; position embeddings are
looked up per sample grid. timm runs it with softmax only. `ZooNaFlexVit` is timm's `NaFlexVit` whose blocks
take any zoo attention through timm's `block_fn` / `attn_layer` slots, with these joins:

- the patch-validity mask reaches every attention as its `[B, N]` key padding mask (True = keep; prefix tokens
  kept), never timm's `[B, 1, N, N]` float mask, which a long sequence cannot afford;
- padded tokens are zeroed after the embedding, so whatever the collator left there (or a poisoned input) never
  enters a block;
- the 2-D families (`needs_grid`: window2d, neighborhood) get every sample's own grid from `patch_coord`
  (`GridAttention.set_grids`); their windows never span two samples or padding;
- every variant gives each image of a packed batch what it gives that image alone (tests/models/test_naflex.py),
  none is refused. Those fitted to one sequence keep a stated meaning: `linformer`'s projection column j and
  `synthesizer`'s weight row j belong to token j of each image's own raster order (padded keys are zeroed or
  masked, so they add nothing; an image longer than `max_seq_len` is an error); `nystrom` (landmarks are segment
  means of the sequence) and `reformer` (its bucket count and rotations follow the length) run each length group
  of the batch on its own unpadded tokens (`BY_LENGTH`, `attend_by_length`): no padding enters a segment or bucket.

Per-block layouts (`global_blocks`, `global_attention`), `ff_chunks`, gradient checkpointing, `forward_intermediates`
and `features_only` are timm's and the ViT kind's. Registered as `zoo_naflexvit_<timm name>`; timm's NaFlex (and
classic ViT) checkpoints load where the shapes match (`checkpoint_filter_fn`, `pretrained_file=`), and a zoo NaFlex
model saved by `zoo.save_pretrained` loads back, decoder included (`zoo.load_model`, or timm's
`pretrained_cfg_overlay=dict(file=...)`).

Letter legend: b - batch, n - tokens, p - prefix tokens, c - channels.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from einops import rearrange
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled
from timm.data import IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, load_pretrained, register_model
from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg
from timm.models.naflexvit import checkpoint_filter_fn as naflex_checkpoint_filter_fn
from torch import Tensor, nn

from .._validate import unknown_name
from .._weights import WeightsError, read_weights
from .blocks import block_class
from .vit import _attention_layer, _check_global_blocks, _hub_failure, _is_attention_extra

__all__ = [
    "NAFLEX_ARCHITECTURES",
    "BY_LENGTH",
    "NaFlexSegmentation",
    "ZooNaFlexVit",
    "attend_by_length",
    "checkpoint_filter_fn",
    "create_naflex_model",
    "load_naflex_weights",
    "native_budget",
    "ragged_grids",
]

_logger = logging.getLogger(__name__)


# Variants whose result depends on the sequence length itself (reformer: the bucket count and rotations; nystrom:
# the landmark segments): each length group of a batch runs on its own unpadded tokens (`attend_by_length`).
BY_LENGTH = ("reformer", "nystrom")

# timm NaFlexVitCfg keys that swap timm's own block or attention in, which would bypass the zoo attention.
_EVA_KEYS = ("attn_type", "rope_type", "swiglu_mlp", "attn_gated", "attn_only_layer_scale", "num_kv_heads")


def ragged_grids(patch_coord: Tensor, patch_valid: Tensor) -> list[tuple[int, int]]:
    """Every sample's patch grid `(rows, cols)` from NaFlex's `patch_coord: [b, n, 2]` (y, x) and `patch_valid:
    [b, n]`, checked to be the raster order the 2-D families read: sample i's first rows * cols tokens valid and at
    (k // cols, k % cols), the rest padding. A one-line ValueError names a sample that is not."""
    valid = patch_valid.bool()
    coord = patch_coord.masked_fill(~valid[..., None], 0)
    shape = coord.amax(1) + 1  # [b, 2]
    count = valid.sum(1)
    cols = shape[:, 1:2]
    position = torch.arange(valid.shape[1], device=valid.device)
    raster = torch.stack([position // cols, position % cols], dim=-1)  # [b, n, 2]
    leading = position < count[:, None]
    in_order = (valid == leading).all(1) & ((coord == raster).all(-1) | ~leading).all(1)
    full = count == shape[:, 0] * shape[:, 1]
    bad = (~(in_order & full)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"samples {bad[:8]} of the batch are not whole patch grids in raster order (valid patches first, at "
            "(k // cols, k % cols)): the 2-D attentions need each image's full grid; patch dropout "
            "(patch_drop_rate) and shuffled patches are not allowed with them"
        )
    return [tuple(row) for row in shape.tolist()]


def attend_by_length(attend, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    """`attend(q, k, v, mask, is_causal)` run on each group of samples of one length, on their leading tokens
    only: what each sample gets alone. q, k, v: `[b, h, n, d]`; mask: `[b, n]` bool, True = keep, each row kept
    tokens then padding (a NaFlex batch) -> `[b, h, n, d]`, zeros at padded queries."""
    if mask is None:
        return attend(q, k, v, mask, is_causal)
    b, _, n, _ = q.shape
    lengths = mask.sum(1)
    if not torch.equal(mask, torch.arange(n, device=mask.device) < lengths[:, None]):
        raise ValueError("a per-length attention needs each sample's kept tokens first, then its padding")
    out = q.new_zeros(q.shape)
    for length in lengths.unique().tolist():
        index = (lengths == length).nonzero().flatten()
        if length == n and len(index) == b:
            return attend(q, k, v, None, is_causal)
        part = [x.index_select(0, index)[:, :, :length] for x in (q, k, v)]
        result = attend(*part, None, is_causal)
        out = out.index_copy(0, index, torch.nn.functional.pad(result, (0, 0, 0, n - length)))
    return out


def _by_length(layer: type[nn.Module]) -> type[nn.Module]:
    """`layer` whose `attend` runs each length group of the batch alone (`attend_by_length`)."""

    def attend(self, q, k, v, mask, is_causal):
        return attend_by_length(super(cls, self).attend, q, k, v, mask, is_causal)

    cls = type(layer.__name__, (layer,), {"attend": attend, "__module__": layer.__module__})
    return cls


def _layer(name: str, options: dict[str, Any] | None, prefix: int) -> type[nn.Module]:
    # The grid comes from each batch (set_grids): the 2-D families are built without one.
    layer = _attention_layer(name, options, None, prefix)
    return _by_length(layer) if name in BY_LENGTH else layer


class ZooNaFlexVit(NaFlexVit):
    """timm's `NaFlexVit` whose blocks use zoo attention `attention` (with `attention_options`) and
    `global_attention` in `global_blocks`; `ff_chunks` as in `zoo.models.blocks`; `cfg` and the other keyword
    arguments are timm's (`NaFlexVitCfg` fields, `in_chans`, `num_classes`, `img_size`).

    `forward(x)` takes timm's NaFlex dict (`patches`, `patch_coord`, `patch_valid`) or a `[B, C, H, W]` image
    batch -> logits `[B, classes]`. Parameter names are timm's, so NaFlex checkpoints load. `zoo_args` records
    every construction argument (as `ZooVisionTransformer.zoo_args` does).
    """

    def __init__(
        self,
        cfg: NaFlexVitCfg | None = None,
        *,
        attention: str = "softmax",
        attention_options: dict[str, Any] | None = None,
        global_blocks: Sequence[int] = (),
        global_attention: str = "softmax",
        global_attention_options: dict[str, Any] | None = None,
        ff_chunks: int = 0,
        **kwargs: Any,
    ) -> None:
        for slot in ("attn_layer", "block_fn", "mlp_layer"):
            if slot in kwargs:
                raise ValueError(f"{slot} is set by zoo (attention=, global_attention=); leave it out")
        cfg = cfg or NaFlexVitCfg()
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k in NaFlexVitCfg.__dataclass_fields__}
        cfg = NaFlexVitCfg(**{**cfg.__dict__, **fields})
        bypass = [k for k in _EVA_KEYS if getattr(cfg, k) not in (None, False, "", "none", "standard")]
        if bypass:
            raise ValueError(
                f"NaFlex settings {bypass} build timm's EVA blocks with their own attention, which would bypass "
                f"attention {attention!r}; leave them at their defaults"
            )
        prefix = int(cfg.class_token) + cfg.reg_tokens
        layout = _check_global_blocks(global_blocks, cfg.depth, global_attention, global_attention_options)
        attn_layer = _layer(attention, attention_options, prefix)
        global_layer = _layer(global_attention, global_attention_options, prefix) if layout else None
        block_fn = block_class(
            "timm", attention=attention, attention_options=attention_options, ff_chunks=ff_chunks,
            attn_layers=dict.fromkeys(layout, global_layer),
        )  # fmt: skip
        cfg = NaFlexVitCfg(**{**cfg.__dict__, "attn_layer": attn_layer, "block_fn": block_fn})
        super().__init__(cfg, **kwargs)
        # timm builds a [B, 1, N, N] float mask unless told to build the key-only one, which is replaced below
        self.use_key_only_attn_mask = True
        if self._grid_attentions() and cfg.patch_drop_rate > 0:
            raise ValueError(
                f"patch_drop_rate={cfg.patch_drop_rate} drops patches out of each grid, which the 2-D attention "
                f"{attention!r} cannot read; use 0"
            )
        self.zoo_args = {
            "attention": attention, "attention_options": dict(attention_options or {}), "global_blocks": layout,
            "global_attention": global_attention, "global_attention_options": dict(global_attention_options or {}),
            "ff_chunks": ff_chunks, **fields, **kwargs,
        }  # fmt: skip

    def _grid_attentions(self) -> list[nn.Module]:
        return [module for module in self.blocks.modules() if getattr(module, "needs_grid", False)]

    def _forward_embeds(self, x, patch_coord, patch_valid, attn_mask) -> dict[str, Tensor]:
        """timm's embedding, then the joins: a `[b, p + n]` bool key padding mask, padded tokens zeroed, and the
        grid of every sample set on the 2-D attentions."""
        if attn_mask is not None:
            raise ValueError(
                "attn_mask cannot be passed to a zoo NaFlex ViT: its attentions take the key padding mask built from "
                "patch_valid"
            )
        embeds = super()._forward_embeds(x, patch_coord, patch_valid, None)
        tokens, valid = embeds["patches"], embeds["patch_valid"]
        grids = self._grid_attentions()
        if valid is None:
            embeds["attn_mask"] = None
            if grids:
                grid = self.embeds.dynamic_feat_size(x.shape[-2:])
                for module in grids:
                    module.set_grids(None)
                    module.set_grid(tuple(grid))
            return embeds
        valid = valid.bool()
        keep = torch.cat([valid.new_ones(valid.shape[0], self.num_prefix_tokens), valid], dim=1)  # [b, p + n]
        embeds["patches"] = tokens.masked_fill(~keep[..., None], 0.0)
        embeds["attn_mask"] = keep
        if grids:
            per_sample = ragged_grids(patch_coord, valid)
            for module in grids:
                module.set_grids(per_sample)
        return embeds


# the token budget of a model without a position table to size it by (NativeOptions' default)
DEFAULT_MAX_TOKENS = 256


def native_budget(model: ZooNaFlexVit) -> dict[str, int] | None:
    """How zoo reads an image for `model` where no run says (`zoo.data.images.native.NativeLoader`, `patch_size` and
    `max_tokens`): the model's patch side, and as many patches as its position table holds (rows x cols of
    `pos_embed_grid_size`, the grid it was built for; `DEFAULT_MAX_TOKENS` without a table), fewer where a
    fixed-length attention (linformer, synthesizer: `max_seq_len`, prefix tokens included) takes fewer. None for
    non-square patches, which the native sets do not cut."""
    rows, cols = model.embeds.patch_size
    if rows != cols:
        return None
    grid = model.embeds.pos_embed_grid_size
    budget = grid[0] * grid[1] if grid else DEFAULT_MAX_TOKENS
    for module in model.blocks.modules():
        if isinstance(getattr(module, "max_seq_len", None), int):
            budget = min(budget, module.max_seq_len - model.num_prefix_tokens)
    return {"patch_size": int(rows), "max_tokens": max(int(budget), 1)}


def patch_grids(patch_coord: Tensor, patch_valid: Tensor) -> Tensor:
    """Every sample's patch grid `[b, 2]` (rows, cols): one more than its largest valid (y, x) coordinate."""
    return patch_coord.masked_fill(~patch_valid.bool()[..., None], 0).amax(1) + 1


class NaFlexSegmentation(ZooNaFlexVit):
    """A `ZooNaFlexVit` giving per-pixel logits at each image's own size: a NaFlex batch (dict or keywords, as
    `ZooNaFlexVit.forward` takes it) -> logits `[b, k, H, W]`, H = max rows * patch and W = max cols * patch over the
    batch; image i's logits fill its own `[rows_i * patch, cols_i * patch]` corner, the rest is 0 (its mask there is
    `IGNORE_INDEX`, `zoo.data.images.native.collate_patches`). A `[b, c, H, W]` image batch is patchified first.

    The decoder (`zoo.models.segmentation.DECODERS`, `decoder_options`) reads each image's last-block patch tokens
    (final LayerNorm applied) on its own grid `[d, rows, cols]`, images of one grid decoded together: no
    convolution of a decoder ever sees another image or padding, so a packed batch gives every image the logits it
    gets alone (tests/models/test_naflex_segmentation.py). `progressive` reads the image back from its patches.
    """

    def __init__(
        self,
        cfg: NaFlexVitCfg | None = None,
        *,
        decoder: str = "linear",
        decoder_options: dict[str, Any] | None = None,
        num_classes: int,
        **kwargs: Any,
    ) -> None:
        from .segmentation import build_decoder

        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"a segmentation model needs num_classes >= 1 (pixel classes), got {num_classes!r}")
        super().__init__(cfg, num_classes=num_classes, **kwargs)
        # the pooled classifier (its norm, attention pooling and head) is never run: a parameter without a gradient
        # would leave DDP's reducer waiting on its bucket, and the buckets after it unreduced on every process
        self.head, self.fc_norm, self.attn_pool = nn.Identity(), nn.Identity(), None
        self.patch = self.embeds.patch_size[0]
        self.in_chans = kwargs.get("in_chans", 3)
        self.decoder_name, self.decoder_options = decoder, dict(decoder_options or {})
        self.decoder = build_decoder(
            decoder, self.embed_dim, num_classes, decoder_options, patch_size=self.patch, in_chans=self.in_chans
        )
        self.zoo_args.update(decoder=decoder, decoder_options=dict(self.decoder_options))

    def _patchify(self, images: Tensor) -> dict[str, Tensor]:
        """`[b, c, H, W]` -> a NaFlex batch of one grid (the image padded to whole patches)."""
        p = self.patch
        images = F.pad(images, (0, -images.shape[-1] % p, 0, -images.shape[-2] % p))
        rows, cols = images.shape[-2] // p, images.shape[-1] // p
        patches = rearrange(images, "b c (h ph) (w pw) -> b (h w) (ph pw c)", ph=p, pw=p)
        y, x = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        coord = torch.stack([y.flatten(), x.flatten()], -1).to(images.device).expand(len(images), -1, -1)
        return {"patches": patches, "patch_coord": coord, "patch_valid": patches.new_ones(patches.shape[:2]).bool()}

    def forward(self, x: Tensor | dict[str, Tensor], patch_coord: Tensor | None = None,
                patch_valid: Tensor | None = None) -> Tensor:  # fmt: skip
        if not isinstance(x, dict):
            x = self._patchify(x) if x.dim() == 4 else {"patches": x, "patch_coord": patch_coord,
                                                         "patch_valid": patch_valid}  # fmt: skip
        patches, coord, valid = x["patches"], x["patch_coord"], x["patch_valid"].bool()
        tokens = self.forward_features(patches, coord, valid)["patches"][:, self.num_prefix_tokens :]  # [b, n, d]
        grids = patch_grids(coord, valid)
        p, b = self.patch, len(patches)
        height, width = (grids.amax(0) * p).tolist()
        out = tokens.new_zeros(b, self.num_classes, height, width)
        for rows, cols in grids.unique(dim=0).tolist():
            index = (grids == grids.new_tensor([rows, cols])).all(1).nonzero().flatten()
            n = rows * cols
            features = rearrange(tokens[index, :n], "g (h w) d -> g d h w", h=rows, w=cols)
            if getattr(self.decoder, "reads_image", False):
                image = rearrange(patches[index, :n], "g (h w) (ph pw c) -> g c (h ph) (w pw)", h=rows, ph=p, pw=p)
                logits = self.decoder(features, image)
            else:
                logits = F.interpolate(self.decoder(features), size=(rows * p, cols * p), mode="bilinear",
                                       align_corners=False)  # fmt: skip
            out[index, :, : rows * p, : cols * p] = logits.to(out.dtype)
        return out


def checkpoint_filter_fn(state_dict: dict[str, Tensor], model: ZooNaFlexVit) -> dict[str, Tensor]:
    """timm's NaFlex filter (classic ViT layouts converted), then a variant's own attention parameters, which no
    timm checkpoint holds, kept at the model's initialisation (logged); another classifier size is re-initialised;
    a position table of another grid is resampled. A segmentation model takes the checkpoint's decoder where it has
    one that fits (a zoo save), else keeps its own (logged). Anything else that does not fit is a one-line
    `WeightsError`."""
    state = naflex_checkpoint_filter_fn(dict(state_dict), model)
    target = model.state_dict()
    for key in [k for k in state if k.startswith("head") and k in target and state[k].shape != target[k].shape]:
        _logger.warning("classifier %s has another class count and was re-initialised", key)
        state[key] = target[key]
    if isinstance(model, NaFlexSegmentation):
        # a classifier has no place in a segmentation model
        state = {k: v for k, v in state.items() if not k.startswith(("head.", "fc_norm.", "attn_pool."))}
        decoder = [k for k in target if k.startswith("decoder.")]
        own = [k for k in decoder if k not in state or state[k].shape != target[k].shape]
        if own:
            _logger.warning("%d of the %d decoder parameters keep their initialisation", len(own), len(decoder))
        state.update({k: target[k] for k in own})
    extra = [k for k in target if k not in state and _is_attention_extra(k)]
    if extra:
        _logger.warning(
            "%d attention parameters not in the checkpoint keep their initialisation: %s",
            len(extra), sorted({k.split(".attn.")[1] for k in extra}),
        )  # fmt: skip
    state.update({k: target[k] for k in extra})
    missing = [k for k in target if k not in state]
    unexpected = [k for k in state if k not in target]
    wrong = [k for k in state if k in target and state[k].shape != target[k].shape and k != "embeds.pos_embed"]
    if missing or unexpected or wrong:
        raise WeightsError(
            f"weights do not fit the NaFlex model: missing {missing[:6]}, unexpected {unexpected[:6]}, other shapes "
            f"{wrong[:6]}"
        )
    pos = "embeds.pos_embed"
    if pos in state and state[pos].shape != target[pos].shape:
        from timm.layers import resample_abs_pos_embed_nhwc

        state[pos] = resample_abs_pos_embed_nhwc(state[pos], model.embeds.pos_embed.shape[1:3])
    return state


def load_naflex_weights(model: ZooNaFlexVit, path: str | Path) -> None:
    """Load a timm NaFlex (or classic ViT) weights file, or a zoo NaFlex model's, into the built `model`, adapted by
    `checkpoint_filter_fn`."""
    model.load_state_dict(checkpoint_filter_fn(read_weights(Path(path).expanduser()), model))


def _load_pretrained_weights(model: ZooNaFlexVit) -> None:
    """timm's `load_pretrained` of the weights `model.pretrained_cfg` names (a `file`, read by `read_weights`, else
    the hub), with every adaptation in `checkpoint_filter_fn`: the cfg handed to timm names no classifier and the
    model's own channels, as `zoo.models.vit` does (timm would drop a classifier of a class count other than the
    architecture's, which the filter keeps, and cannot adapt the linear patch embedding to other channels)."""
    cfg = dict(model.pretrained_cfg)
    source = {**cfg, "first_conv": None, "classifier": None, "input_size": (model.in_chans, *cfg["input_size"][1:])}
    if source.get("file") and source.get("state_dict") is None:
        source["state_dict"] = read_weights(Path(source["file"]).expanduser())
    try:
        load_pretrained(
            model, pretrained_cfg=source, num_classes=model.num_classes, in_chans=model.in_chans,
            filter_fn=checkpoint_filter_fn,
        )  # fmt: skip
    except (EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled) as error:
        raise RuntimeError(_hub_failure(cfg["architecture"], error)) from None


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 384, 384), "pool_size": None, "crop_pct": 1.0,
        "interpolation": "bicubic", "mean": IMAGENET_INCEPTION_MEAN, "std": IMAGENET_INCEPTION_STD,
        "first_conv": "embeds.proj", "classifier": "head", "license": "apache-2.0", "fixed_input_size": False,
        **kwargs,
    }  # fmt: skip


default_cfgs = generate_default_cfgs({
    "zoo_naflexvit_tiny_patch16_gap.untrained": _cfg(),
    "zoo_naflexvit_small_patch16_gap.untrained": _cfg(),
    "zoo_naflexvit_base_patch16_gap.e300_s576_in1k": _cfg(hf_hub_id="timm/naflexvit_base_patch16_gap.e300_s576_in1k"),
    "zoo_naflexvit_base_patch16_par_gap.e300_s576_in1k": _cfg(
        hf_hub_id="timm/naflexvit_base_patch16_par_gap.e300_s576_in1k"),
    "zoo_naflexvit_base_patch16_parfac_gap.e300_s576_in1k": _cfg(
        hf_hub_id="timm/naflexvit_base_patch16_parfac_gap.e300_s576_in1k"),
    "zoo_naflexvit_base_patch16_map.untrained": _cfg(),
})  # fmt: skip

_GAP = {"patch_size": 16, "init_values": 1e-5, "global_pool": "avg", "reg_tokens": 4, "fc_norm": True}
_ARCHITECTURES = {
    "naflexvit_tiny_patch16_gap": {**_GAP, "embed_dim": 192, "depth": 12, "num_heads": 3},
    "naflexvit_small_patch16_gap": {**_GAP, "embed_dim": 384, "depth": 12, "num_heads": 6},
    "naflexvit_base_patch16_gap": {**_GAP, "embed_dim": 768, "depth": 12, "num_heads": 12},
    "naflexvit_base_patch16_par_gap": {**_GAP, "embed_dim": 768, "depth": 12, "num_heads": 12,
                                       "pos_embed_ar_preserving": True},
    "naflexvit_base_patch16_parfac_gap": {**_GAP, "embed_dim": 768, "depth": 12, "num_heads": 12,
                                          "pos_embed_ar_preserving": True, "pos_embed": "factorized"},
    "naflexvit_base_patch16_map": {"patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12,
                                   "init_values": 1e-5, "global_pool": "map", "reg_tokens": 1},
}  # fmt: skip

# The NaFlex architectures with a zoo entry point, `zoo_<name>`.
NAFLEX_ARCHITECTURES = tuple(_ARCHITECTURES)


def _create(variant: str, pretrained: bool = False, **kwargs: Any) -> ZooNaFlexVit:
    base = variant.removeprefix("zoo_")
    cfg = NaFlexVitCfg(**_ARCHITECTURES[base])
    out_indices = kwargs.pop("out_indices", 3)
    model_cls = NaFlexSegmentation if "decoder" in kwargs else ZooNaFlexVit
    # A feature extractor is wrapped once its weights are in: timm loads those itself, through the same filter.
    features = bool(kwargs.get("features_only"))
    model = build_model_with_cfg(
        model_cls, variant, pretrained and features, pretrained_filter_fn=checkpoint_filter_fn, cfg=cfg,
        feature_cfg={"out_indices": out_indices, "feature_cls": "getter"}, **kwargs,
    )  # fmt: skip
    if pretrained and not features:
        _load_pretrained_weights(model)
    return model


@register_model
def zoo_naflexvit_tiny_patch16_gap(pretrained: bool = False, **kwargs: Any) -> ZooNaFlexVit:
    """NaFlex ViT-Ti/16, average pooling, 4 registers, with a zoo attention (`attention=`, ...)."""
    return _create("zoo_naflexvit_tiny_patch16_gap", pretrained, **kwargs)


@register_model
def zoo_naflexvit_small_patch16_gap(pretrained: bool = False, **kwargs: Any) -> ZooNaFlexVit:
    """NaFlex ViT-S/16, average pooling, 4 registers, with a zoo attention (`attention=`, ...)."""
    return _create("zoo_naflexvit_small_patch16_gap", pretrained, **kwargs)


@register_model
def zoo_naflexvit_base_patch16_gap(pretrained: bool = False, **kwargs: Any) -> ZooNaFlexVit:
    """timm's `naflexvit_base_patch16_gap` with a zoo attention (`attention=`, ...)."""
    return _create("zoo_naflexvit_base_patch16_gap", pretrained, **kwargs)


@register_model
def zoo_naflexvit_base_patch16_par_gap(pretrained: bool = False, **kwargs: Any) -> ZooNaFlexVit:
    """timm's `naflexvit_base_patch16_par_gap` (aspect-preserving positions) with a zoo attention."""
    return _create("zoo_naflexvit_base_patch16_par_gap", pretrained, **kwargs)


@register_model
def zoo_naflexvit_base_patch16_parfac_gap(pretrained: bool = False, **kwargs: Any) -> ZooNaFlexVit:
    """timm's `naflexvit_base_patch16_parfac_gap` (factorised positions) with a zoo attention."""
    return _create("zoo_naflexvit_base_patch16_parfac_gap", pretrained, **kwargs)


@register_model
def zoo_naflexvit_base_patch16_map(pretrained: bool = False, **kwargs: Any) -> ZooNaFlexVit:
    """timm's `naflexvit_base_patch16_map` (attention pooling) with a zoo attention."""
    return _create("zoo_naflexvit_base_patch16_map", pretrained, **kwargs)


def create_naflex_model(name: str, *, pretrained_file: str | Path | None = None, **kwargs: Any) -> ZooNaFlexVit:
    """NaFlex ViT `name` (`naflexvit_small_patch16_gap` or with the `zoo_` prefix, see `NAFLEX_ARCHITECTURES`)
    with `attention=`, `attention_options=`, `global_blocks=`, ... and timm's NaFlex options; `pretrained_file`: a
    timm NaFlex or classic ViT weights file, loaded where the shapes match."""
    base = name.removeprefix("zoo_")
    if base not in _ARCHITECTURES:
        raise unknown_name("model", name, NAFLEX_ARCHITECTURES)
    model = timm.create_model(f"zoo_{base}", **kwargs)
    if pretrained_file is not None:
        load_naflex_weights(model, pretrained_file)
    return model
