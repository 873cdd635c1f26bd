"""Native-resolution image sets (`zoo.data.images.native`): each image at its own size within the token budget,
batches padded to their longest sample and kept within the batch budget, odd images counted."""

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from zoo.config import load_recipe
from zoo.data.images.native import NativeFolder, NativeMegaMNIST, TokenBatches, collate_patches, native_size


def test_native_size_keeps_small_images_and_scales_large_ones_keeping_the_aspect_ratio():
    assert native_size(40, 100, 8, 256) == (40, 100)  # 5 x 13 = 65 patches: its own size
    height, width = native_size(400, 1000, 8, 64)
    assert math.ceil(height / 8) * math.ceil(width / 8) <= 64
    assert abs(width / height - 2.5) < 0.5  # 3000 x 1000-like scans keep their shape
    assert native_size(400, 1000, 8, 64, "square") == (64, 64)


def test_batches_pad_to_their_longest_and_stay_within_the_token_budget():
    samples = [
        {"patches": torch.ones(n, 12), "patch_coord": torch.zeros(n, 2, dtype=torch.long),
         "patch_valid": torch.ones(n, dtype=torch.bool), "label": n}
        for n in (3, 7, 5)
    ]  # fmt: skip
    batch = collate_patches(samples)
    assert batch["patches"].shape == (3, 7, 12)
    assert batch["patch_valid"].sum(1).tolist() == [3, 7, 5]
    lengths = [5, 60, 12, 33, 64, 7, 18, 40] * 4
    sampler = TokenBatches(lengths, batch_tokens=128, max_batch=8, shuffle=True, seed=0)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 128 for b in batches)
    for epoch in range(1, 6):  # the Trainer counts on a fixed epoch length
        sampler.set_epoch(epoch)
        later = list(sampler)
        assert len(later) == len(sampler) == len(batches) and later != batches
        assert all(len(b) * max(lengths[i] for i in b) <= 128 for b in later)
    with pytest.raises(ValueError, match="batch_tokens=32 is smaller than the longest sample"):
        TokenBatches(lengths, batch_tokens=32, max_batch=8, shuffle=False)


def test_mixed_megamnist_canvases_have_their_own_shapes():
    data = NativeMegaMNIST(
        "train", num_samples=8, seed=0, sides=[32, 48], max_stretch=2.0, digit_size=12, num_other=1, num_clutter=1,
        patch_size=8, max_tokens=1000, resize="native", min_side=4, max_aspect=16,
    )  # fmt: skip
    shapes = {tuple(size) for size in data.sizes}
    assert len(shapes) > 2 and any(h != w for h, w in shapes)
    sample = data[0]
    rows, cols = (sample["patch_coord"].amax(0) + 1).tolist()
    assert (rows * 8, cols * 8) == tuple(-(-s // 8) * 8 for s in data.sizes[0])
    assert len(sample["patches"]) == data.lengths[0] == rows * cols


def test_odd_images_in_a_mixed_folder(tmp_path, caplog):
    """Grey and 16-bit images are read like the others; a 1-pixel-wide image and a 40:1 strip are left out and
    counted in one warning."""
    folder = tmp_path / "train" / "a"
    folder.mkdir(parents=True)
    Image.new("RGB", (50, 30), "orange").save(folder / "colour.png")
    Image.new("L", (20, 70), 128).save(folder / "grey.png")
    Image.fromarray(np.full((24, 24), 40000, dtype=np.uint16)).save(folder / "deep.png")
    Image.new("RGB", (1, 60)).save(folder / "thin.png")
    Image.new("RGB", (400, 10)).save(folder / "strip.png")
    with caplog.at_level(logging.WARNING):
        data = NativeFolder(
            str(tmp_path), "train", in_chans=3, on_bad_image="error", mean=[0.0], std=[1.0], patch_size=8,
            max_tokens=64, resize="native", min_side=4, max_aspect=16,
        )  # fmt: skip
    assert (
        "left out 2 of 5 images (1 with a side under min_side=4 px, 1 with an aspect ratio over max_aspect=16)"
        in caplog.text
    )
    assert len(data) == 3
    kept = [data.samples[i][0] for i in data.indices]
    deep = data[[i for i, path in enumerate(kept) if path.endswith("deep.png")][0]]
    assert deep["patches"].shape == (9, 8 * 8 * 3)
    assert torch.allclose(deep["patches"], torch.full_like(deep["patches"], round(40000 / 257) / 255), atol=2 / 255)


def test_predict_reads_each_image_at_its_own_size(tmp_path):
    """zoo.predict on a NaFlex run's model: each file read at its own size within the run's budget, batched with
    padding, gives the logits of that image alone."""
    import timm

    from zoo.data.images.native import read_image, to_patches
    from zoo.predict import predict

    torch.manual_seed(0)
    model = timm.create_model(
        "zoo_naflexvit_tiny_patch16_gap", attention="linear", patch_size=8, embed_dim=32, depth=1, num_heads=2,
        num_classes=3, in_chans=1,
    ).eval()  # fmt: skip
    naflex = {"patch_size": 8, "max_tokens": 20, "resize": "native", "mean": [0.5], "std": [0.25]}
    model.zoo_run = {"task": "classification", "input": "image", "label_names": ["a", "b", "c"], "naflex": naflex,
                     "sizes": {"in_chans": 1, "num_classes": 3}}  # fmt: skip
    generator = np.random.default_rng(0)
    for name, size in (("wide.png", (80, 24)), ("tall.png", (16, 40)), ("big.png", (300, 200))):
        Image.fromarray(generator.integers(0, 255, size[::-1], dtype=np.uint8)).save(tmp_path / name)
    rows = {Path(row["input"]).name: row for row in predict(model, [tmp_path], top_k=3).rows}
    for name in ("wide.png", "tall.png", "big.png"):
        sample = to_patches(
            read_image(str(tmp_path / name), 1), 8, 20, "native", torch.tensor([[[0.5]]]), torch.tensor([[[0.25]]])
        )
        assert len(sample["patches"]) <= 20
        with torch.no_grad():
            alone = model({k: v[None] for k, v in sample.items()}).softmax(-1)[0]
        best = int(alone.argmax())
        assert rows[name]["classes"][0] == "abc"[best]
        assert abs(rows[name]["probabilities"][0] - float(alone[best])) < 1e-4


def test_recipe_checks_the_patch_size_and_the_data():
    with pytest.raises(Exception, match=r"model.naflex.patch_size: must equal data.options.patch_size 8, got 16"):
        load_recipe("recipes/naflex_quick.yaml", ["model.naflex.patch_size=16"])
    with pytest.raises(Exception, match=r"data.name: model.kind 'naflex' reads native_folder or native_megamnist"):
        load_recipe("recipes/naflex_quick.yaml", ["data.name=megamnist", "data.options={}"])
