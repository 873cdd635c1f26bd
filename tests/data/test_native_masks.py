"""Odd image-mask pairs at native size (`native_mask_folder`), one test a row of docs/odd_inputs.md's "Native-size
masks" table: each spoils one pair of a valid folder (four 12 x 10 RGB images, grey masks of 3 classes, written in
tmp_path) and checks what the table promises, against labels written out here."""

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from zoo.data import DataContext, build_dataset
from zoo.data._interface import IGNORE_INDEX

PATCH = 4
pytestmark = pytest.mark.usefixtures("no_network")


def pairs(root: Path, count: int = 4) -> Path:
    """`root/images/<k>.png` (RGB, 12 x 10 px) and `root/masks/<k>.png` (grey, classes 0 to 2)."""
    rng = np.random.default_rng(0)
    for folder in ("images", "masks"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for k in range(count):
        Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(root / "images" / f"{k}.png")
        Image.fromarray(rng.integers(0, 3, (10, 12), dtype=np.uint8), "L").save(root / "masks" / f"{k}.png")
    return root


def build(root: Path, split: str = "train", **options):
    """The split as training builds it: every pair at its own size, all of it in `split`."""
    options = {"num_classes": 3, "patch_size": PATCH, "max_tokens": 64, "val_fraction": 0.0, "test_fraction": 0.0,
               **options}  # fmt: skip
    return build_dataset("native_mask_folder", DataContext(split, split == "train", root=str(root)), **options)


def label_of(data, name: str) -> torch.Tensor:
    """The label of the pair whose image is `name`."""
    index = [Path(image).name for image, _ in data.pairs.samples].index(name)
    return data[data.indices.index(index)]["label"]


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message.strip(), message
    return message


def test_a_mask_of_another_size_is_an_error_when_the_split_is_built(tmp_path):
    root = pairs(tmp_path)
    Image.fromarray(np.zeros((5, 6), np.uint8), "L").save(root / "masks" / "0.png")
    with pytest.raises(ValueError) as error:
        build(root)
    assert re.search(r"mask .*0\.png is 6x5 pixels, its image .*0\.png 12x10; data\.options\.mask_size: resize",
                     one_line(error))  # fmt: skip


def test_a_mask_of_another_size_is_resized_by_nearest_neighbour_on_request(tmp_path):
    """A 6 x 5 mask for its 12 x 10 image: each mask pixel becomes a 2 x 2 square, no value blended; the image's
    12 x 10 px are 3 x 3 patches of 4 px, the two rows padded to whole patches unlabelled."""
    root = pairs(tmp_path)
    small = np.random.default_rng(1).integers(0, 3, (5, 6), dtype=np.uint8)
    Image.fromarray(small, "L").save(root / "masks" / "0.png")
    label = label_of(build(root, mask_size="resize"), "0.png")
    assert label.shape == (12, 12)
    assert torch.equal(label[:10], torch.from_numpy(np.kron(small, np.ones((2, 2), np.uint8))).long())
    assert (label[10:] == IGNORE_INDEX).all()


@pytest.mark.parametrize("on_bad_image", ["error", "skip"])
def test_a_value_beyond_the_classes(tmp_path, caplog, on_bad_image):
    """An error naming the file and the value's place when the mask is read; with on_bad_image: skip every pair is
    read when the split is built and this one is left out, counted."""
    root = pairs(tmp_path)
    mask = np.zeros((10, 12), np.uint8)
    mask[2, 3] = 7
    Image.fromarray(mask, "L").save(root / "masks" / "0.png")
    if on_bad_image == "error":
        data = build(root)
        with pytest.raises(ValueError) as error:
            label_of(data, "0.png")
        assert re.search(r"0\.png holds the value\(s\) 7 \(first at row 2, column 3\); allowed: the classes 0 to 2",
                         one_line(error))  # fmt: skip
        return
    with caplog.at_level(logging.WARNING):
        data = build(root, on_bad_image="skip")
    assert len(data) == 3 and "left out 1 image-mask pair(s) of 4 that do not read or fit" in caplog.text


def test_an_image_without_a_mask_is_counted_and_left_out(tmp_path, caplog):
    root = pairs(tmp_path)
    (root / "masks" / "0.png").unlink()
    with caplog.at_level(logging.WARNING):
        data = build(root)
    assert len(data) == 3 and "left out 1 images without a mask (of 4): images/0.png" in caplog.text


def test_a_split_without_a_pair_names_the_split(tmp_path):
    """No image of the split has a mask, or the split's share gets no pair: the registry's error naming the split,
    not the advice about the size checks (which left nothing out)."""
    root = pairs(tmp_path)
    for mask in (root / "masks").iterdir():
        mask.unlink()
    with pytest.raises(ValueError) as error:
        build(root)
    message = one_line(error)
    assert "has no samples in its 'train' split" in message and "min_side" not in message
    with pytest.raises(ValueError) as error:
        build(pairs(tmp_path / "again"), split="val", val_fraction=0.1)  # 0.4 of a pair rounds to none
    assert "has no samples in its 'val' split" in one_line(error) and "train.validate: false" in str(error.value)


@pytest.mark.parametrize("mode", ["L", "I;16", "1"])
def test_grey_16_bit_and_1_bit_masks_hold_the_classes(tmp_path, mode):
    """The pixel values are the classes as they stand (a 16-bit mask is not scaled, as a 16-bit image is); 255, the
    ignore value, is unlabelled."""
    root = pairs(tmp_path)
    values = np.zeros((10, 12), np.int64)
    values[:, 6:] = 1
    if mode != "1":
        values[:4, :3], values[0, 0] = 2, 255
    written = {"L": values.astype(np.uint8), "I;16": values.astype(np.uint16), "1": values.astype(bool)}[mode]
    Image.fromarray(written).save(root / "masks" / "0.png")
    assert Image.open(root / "masks" / "0.png").mode == mode
    expected = torch.from_numpy(values).masked_fill(torch.from_numpy(values) == 255, IGNORE_INDEX)
    assert torch.equal(label_of(build(root), "0.png")[:10], expected)


def test_a_one_pixel_wide_image_is_counted_and_left_out(tmp_path, caplog):
    root = pairs(tmp_path)
    Image.fromarray(np.zeros((10, 1, 3), np.uint8)).save(root / "images" / "0.png")
    Image.fromarray(np.zeros((10, 1), np.uint8), "L").save(root / "masks" / "0.png")
    with caplog.at_level(logging.WARNING):
        data = build(root)
    assert len(data) == 3 and "left out 1 of 4 images (1 with a side under min_side=4 px)" in caplog.text
