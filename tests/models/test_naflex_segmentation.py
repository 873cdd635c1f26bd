"""Segmentation at native size (`zoo.models.naflex.NaFlexSegmentation`, `native_megamnist_seg`): an image's logits in
a packed batch are the logits it gets alone, whatever the padding holds; masks come at each canvas's own size; the
loss and the metrics count each image's own pixels only; predictions come back at the file's size."""

import pytest
import torch
import torch.nn.functional as F
from timm.data.naflex_transforms import patchify_image

from zoo.data._interface import IGNORE_INDEX
from zoo.data.images.megamnist import MegaMNISTSegmentation
from zoo.data.images.native import (
    PATCH_KEYS,
    NativeMegaMNISTSegmentation,
    collate_patches,
    image_of,
    native_logits,
)
from zoo.models.naflex import create_naflex_model
from zoo.tasks import get_task

PATCH = 8
# (height, width) in px: a wide one, a tall one, one not a whole number of patches
SIZES = ((24, 40), (48, 16), (20, 28))


def samples(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for height, width in SIZES:
        patches, coord, valid = patchify_image(torch.randn(1, height, width, generator=generator), (PATCH, PATCH))
        label = torch.randint(0, 4, (height, width), generator=generator)
        label = F.pad(label, (0, -width % PATCH, 0, -height % PATCH), value=IGNORE_INDEX)
        out.append({"patches": patches, "patch_coord": coord, "patch_valid": valid, "label": label})
    return out


def segmenter(attention: str, decoder: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_naflex_model(
        "naflexvit_tiny_patch16_gap", attention=attention, attention_options={"window": 2} if attention == "window2d"
        else None, patch_size=PATCH, embed_dim=32, depth=2, num_heads=2, in_chans=1, num_classes=4, decoder=decoder,
        decoder_options={} if decoder == "linear" else {"channels": 8},
    ).eval()  # fmt: skip


@pytest.mark.parametrize(
    ("attention", "decoder"), [("softmax", "pyramid"), ("window2d", "progressive"), ("linear", "linear")]
)
def test_padding_never_changes_an_images_logits(attention: str, decoder: str) -> None:
    """Each image's logits in a packed batch (its padding filled with garbage) equal its logits alone; the pixels
    outside its corner are 0. The decoders' 3x3 convolutions, LayerNorms and BatchNorms would read padding if it
    reached them."""
    net, items = segmenter(attention, decoder), samples()
    batch = collate_patches(items)
    poisoned = batch["patches"].masked_fill(~batch["patch_valid"][..., None], 1e3)
    with torch.no_grad():
        packed = net({**{k: batch[k] for k in PATCH_KEYS}, "patches": poisoned})
        for i, item in enumerate(items):
            alone = net({k: item[k][None] for k in PATCH_KEYS})[0]
            height, width = item["label"].shape
            assert alone.shape[-2:] == (height, width)
            torch.testing.assert_close(packed[i, :, :height, :width], alone, atol=1e-5, rtol=1e-5)
            outside = packed[i].clone()
            outside[:, :height, :width] = 0
            assert not outside.any()


@pytest.mark.parametrize("decoder", ["linear", "pyramid"])
def test_every_parameter_gets_a_gradient(decoder: str) -> None:
    """A parameter the segmentation forward never reaches (the pooled classifier's norm, say) leaves DDP's reducer
    waiting on its bucket, and the processes' replicas diverge after the first step: every parameter must get a
    non-zero gradient from one packed batch."""
    net = segmenter("softmax", decoder).train()
    batch = collate_patches(samples())
    net({k: batch[k] for k in PATCH_KEYS}).square().mean().backward()
    missing = [name for name, p in net.named_parameters() if p.grad is None or not p.grad.any()]
    assert missing == []


def test_loss_and_metrics_count_each_images_own_pixels() -> None:
    """The packed batch's loss is the pixel-weighted mean of the images' losses alone; its pixel accuracy counts
    the labelled pixels of the images only (padding is IGNORE_INDEX)."""
    net, items, task = segmenter("softmax", "linear"), samples(1), get_task("segmentation")
    batch = collate_patches(items)
    assert batch["label"].shape == (3, 48, 40)
    with torch.no_grad():
        packed = net({k: batch[k] for k in PATCH_KEYS})
        alone = [net({k: item[k][None] for k in PATCH_KEYS}) for item in items]
    pixels = [int((item["label"] != IGNORE_INDEX).sum()) for item in items]
    assert pixels == [h * w for h, w in SIZES]
    per_image = [task.loss(out, item["label"][None]) for out, item in zip(alone, items, strict=True)]
    expected = sum(loss * n for loss, n in zip(per_image, pixels, strict=True)) / sum(pixels)
    torch.testing.assert_close(task.loss(packed, batch["label"]), expected, atol=1e-5, rtol=1e-5)
    hits = sum(int((out[0].argmax(0) == item["label"]).sum()) for out, item in zip(alone, items, strict=True))
    metric = task.build_metrics(["pixel_accuracy"], 4)
    metric.update(*task.metric_inputs(packed, batch["label"]))
    assert metric.compute()["pixel_accuracy"].item() == pytest.approx(hits / sum(pixels), abs=1e-6)


def test_native_megamnist_masks_at_each_canvas_size() -> None:
    """A canvas's mask is its square's MegaMNIST mask at the canvas's offset, background elsewhere, IGNORE_INDEX on
    the pixels padded to whole patches; the image read back from the patches is the canvas."""
    options = {"sides": [24, 32], "max_stretch": 2.0, "digit_size": 8, "num_other": 1, "num_clutter": 1}
    data = NativeMegaMNISTSegmentation(
        "val", num_samples=4, seed=3, patch_size=PATCH, max_tokens=64, resize="native", min_side=4, max_aspect=16.0,
        generator_options={"mask": "ink"}, **options,
    )  # fmt: skip
    sizes = set()
    for index in range(len(data)):
        side, height, width, top, left = data.layouts[index]
        square_image, square_mask = MegaMNISTSegmentation(
            "val", canvas_size=side, num_samples=4, seed=3, digit_size=8, num_other=1, num_clutter=1, mask="ink"
        )[index]
        sample = data[index]
        label = sample["label"]
        assert label.shape == (-(-height // PATCH) * PATCH, -(-width // PATCH) * PATCH)
        assert (label[height:] == IGNORE_INDEX).all() and (label[:, width:] == IGNORE_INDEX).all()
        expected = torch.zeros(height, width, dtype=torch.int64)
        expected[top : top + side, left : left + side] = square_mask
        assert torch.equal(label[:height, :width], expected)
        image = image_of(sample, 1)[0, :height, :width] * 0.3 + 0.1  # the set's normalisation undone
        assert torch.allclose(image[top : top + side, left : left + side], square_image[0], atol=1e-6)
        sizes.add((height, width))
    assert len(sizes) > 1


def test_native_logits_crop_and_resize_to_the_files_size() -> None:
    """Predictions: each image's corner of the batch's logits, resized to its file's size where the budget had
    scaled it down."""
    logits = torch.arange(2 * 3 * 16 * 24, dtype=torch.float32).reshape(2, 3, 16, 24)
    batch = {"input_size": torch.tensor([[16, 8], [10, 24]]), "image_size": torch.tensor([[16, 8], [20, 48]])}
    first, second = native_logits(logits, batch)
    assert torch.equal(first, logits[0, :, :16, :8])
    assert second.shape == (3, 20, 48)
    torch.testing.assert_close(second, F.interpolate(logits[1:, :, :10], size=(20, 48), mode="bilinear")[0])


def mask_folder(root, sizes=((30, 50), (64, 24), (20, 20))) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`root/images/i.png` (grey) and `root/masks/i.png` (values 0-2, 255 unlabelled) of `sizes` (height, width)."""
    from PIL import Image

    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    generator, pairs = torch.Generator().manual_seed(0), []
    for i, (height, width) in enumerate(sizes):
        image = torch.randint(0, 256, (height, width), generator=generator, dtype=torch.uint8)
        mask = torch.randint(0, 3, (height, width), generator=generator, dtype=torch.uint8)
        mask[0, :] = 255
        Image.fromarray(image.numpy()).save(root / "images" / f"{i}.png")
        Image.fromarray(mask.numpy()).save(root / "masks" / f"{i}.png")
        pairs.append((image, mask))
    return pairs


def test_native_mask_folder_reads_each_pair_at_its_own_size(tmp_path) -> None:
    """native_mask_folder: each image patchified at its own size, its mask the file's (255 -> IGNORE_INDEX, the
    pixels padded to whole patches unlabelled); an image beyond the budget is scaled down with its mask."""
    from zoo.data.images.native import NativeMaskFolder

    pairs = mask_folder(tmp_path)
    data = NativeMaskFolder(
        str(tmp_path), "train", pairs={"classes": ["a", "b", "c"], "val_fraction": 0.0, "test_fraction": 0.0},
        in_chans=1, mean=[0.0], std=[1.0], patch_size=PATCH, max_tokens=24, resize="native", min_side=4,
        max_aspect=16.0,
    )  # fmt: skip
    assert len(data) == 3 and data.num_classes == 3
    for index in range(3):
        image, mask = pairs[int(data.pairs.samples[index][0].split("/")[-1][0])]
        height, width = image.shape
        sample = data[index]
        label = sample["label"]
        if -(-height // PATCH) * -(-width // PATCH) <= 24:
            expected = mask.long().masked_fill(mask == 255, IGNORE_INDEX)
            assert torch.equal(label[:height, :width], expected)
            assert (label[height:] == IGNORE_INDEX).all() and (label[:, width:] == IGNORE_INDEX).all()
            torch.testing.assert_close(image_of(sample, 1)[0, :height, :width], image.float() / 255)
        else:  # 30 x 50 px: 4 x 7 = 28 patches, over the budget of 24, scaled down keeping its aspect ratio
            rows, cols = (sample["patch_coord"].amax(0) + 1).tolist()
            assert rows * cols <= 24 and label.shape == (rows * PATCH, cols * PATCH)
            assert abs(cols / rows - width / height) < 1.0


def test_timm_naflex_weights_load_into_the_backbone(tmp_path) -> None:
    """A timm NaFlexVit checkpoint fills the segmentation model's backbone (its classifier left out, the decoder at
    its initialisation): the last-block tokens are timm's."""
    from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg

    from zoo.models.naflex import load_naflex_weights

    cfg = NaFlexVitCfg(patch_size=PATCH, embed_dim=32, depth=2, num_heads=2, reg_tokens=4, global_pool="avg",
                       fc_norm=True, init_values=1e-5)  # fmt: skip
    torch.manual_seed(1)
    stock = NaFlexVit(cfg, num_classes=7, in_chans=1).eval()
    torch.save(stock.state_dict(), tmp_path / "naflex.pth")
    net = segmenter("softmax", "pyramid")
    decoder = {k: v.clone() for k, v in net.decoder.state_dict().items()}
    load_naflex_weights(net, tmp_path / "naflex.pth")
    batch = collate_patches(samples(2))
    inputs = [batch[k] for k in PATCH_KEYS]
    with torch.no_grad():
        torch.testing.assert_close(net.forward_features(*inputs)["patches"], stock.forward_features(*inputs)["patches"])
    assert all(torch.equal(v, net.decoder.state_dict()[k]) for k, v in decoder.items())


def test_the_all_background_rule_counts_each_canvas_own_pixels() -> None:
    """native_megamnist_seg's trivial rule: background's share of the labelled pixels, counted from the masks."""
    data = NativeMegaMNISTSegmentation(
        "test", num_samples=3, seed=0, sides=[24, 32], max_stretch=2.0, digit_size=8, num_other=1, num_clutter=1,
        patch_size=PATCH, max_tokens=64, resize="native", min_side=4, max_aspect=16.0,
    )  # fmt: skip
    labels = torch.cat([data[i]["label"].flatten() for i in range(3)])
    labelled = labels[labels != IGNORE_INDEX]
    share = float((labelled == 0).float().mean())
    rule = data.baselines()["all_background"]
    assert rule["pixel_accuracy"] == pytest.approx(share)
    assert rule["miou"] == pytest.approx(share / len(labelled.unique()))
