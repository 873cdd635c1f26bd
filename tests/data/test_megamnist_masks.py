"""MegaMNIST's segmentation masks (`megamnist_seg`), boxes and ink: re-derived from the canvas's placements and the
source digits, not from the code that draws them; the canvases are megamnist's own; the all-background baseline
counted by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from zoo.data import DataContext, build_dataset
from zoo.data.images.megamnist import MegaMNIST, MegaMNISTSegmentation, load_mnist_digits
from zoo.tasks import IGNORE_INDEX

OPTIONS = {"canvas_size": 64, "digit_size": 20, "num_target": 3, "num_other": 2, "num_clutter": 6}


def item_layers(dataset: MegaMNIST, index: int) -> tuple[np.ndarray, list]:
    """Each item of canvas `index` drawn alone on its own canvas: `[items, S, S]`, and the items."""
    images, labels = load_mnist_digits()
    _, items = dataset._layout(index)
    size = dataset.canvas_size
    layers = np.zeros((len(items), size, size), dtype=np.int64)
    for k, item in enumerate(items):
        top, left, side = item.crop
        digit = Image.fromarray(images[item.source, top : top + side, left : left + side])
        if side != item.size:
            digit = digit.resize((item.size, item.size), Image.Resampling.BILINEAR)
        layers[k, item.top : item.top + item.size, item.left : item.left + item.size] = np.asarray(digit)
        assert labels[item.source] == item.label
    return layers, items


def expected_mask(dataset: MegaMNIST, index: int) -> np.ndarray:
    """A pixel's label is that of the brightest item there (the last one on a tie), 1 + its digit for a digit,
    ignored for a fragment, background below half intensity."""
    layers, items = item_layers(dataset, index)
    # the last maximum: argmax over the items in reverse order
    last = len(items) - 1 - layers[::-1].argmax(axis=0)
    codes = np.array([1 + item.label if item.kind == "digit" else IGNORE_INDEX for item in items])
    mask = codes[last]
    mask[layers.max(axis=0) < 128] = 0
    return mask


def expected_boxes(dataset: MegaMNIST, index: int) -> np.ndarray:
    """Each item's box: the rows and columns where its own layer has ink of half intensity or more; a pixel in the
    boxes of one label only gets it (1 + the digit, or ignored for a fragment), in boxes of several is ignored."""
    layers, items = item_layers(dataset, index)
    codes = [1 + item.label if item.kind == "digit" else IGNORE_INDEX for item in items]
    inside = np.zeros(layers.shape, dtype=bool)
    for k, layer in enumerate(layers >= 128):
        rows, cols = np.nonzero(layer.any(axis=1))[0], np.nonzero(layer.any(axis=0))[0]
        if len(rows):
            inside[k, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1] = True
    mask = np.zeros(layers.shape[1:], dtype=np.int64)
    for y, x in zip(*np.nonzero(inside.any(axis=0)), strict=True):
        found = {codes[k] for k in np.nonzero(inside[:, y, x])[0]}
        mask[y, x] = found.pop() if len(found) == 1 else IGNORE_INDEX
    return mask


@pytest.mark.parametrize("canvas_size", [64, 34])
def test_box_masks_are_each_digits_ink_box_and_ambiguous_overlaps_are_ignored(canvas_size):
    # 34 px forces overlapping boxes
    small = {"digit_size": 16, "num_target": 2, "num_other": 1}
    options = {**OPTIONS, "canvas_size": canvas_size, **(small if canvas_size == 34 else {})}
    seg = MegaMNISTSegmentation("train", num_samples=6, seed=1, **options)
    plain = MegaMNIST("train", num_samples=6, seed=1, **options)
    digits = 0
    for index in range(6):
        image, mask = seg[index]
        np.testing.assert_array_equal(mask.numpy(), expected_boxes(seg, index))
        assert torch.equal(image, plain[index][0])
        digits += len(set(mask.unique().tolist()) - {0, IGNORE_INDEX})
    assert digits >= 6


def test_an_unknown_mask_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown mask 'outline'; allowed: box, ink"):
        MegaMNISTSegmentation("train", mask="outline", num_samples=1, **OPTIONS)


@pytest.mark.parametrize("split", ["train", "test"])
def test_masks_are_the_labels_of_the_ink_each_pixel_shows(split):
    seg = MegaMNISTSegmentation(split, num_samples=6, seed=3, mask="ink", **OPTIONS)
    plain = MegaMNIST(split, num_samples=6, seed=3, **OPTIONS)
    kinds = set()
    for index in range(6):
        image, mask = seg[index]
        assert mask.dtype == torch.int64 and mask.shape == (64, 64)
        np.testing.assert_array_equal(mask.numpy(), expected_mask(seg, index))
        # the same canvas as megamnist's, whose label is the majority digit
        assert torch.equal(image, plain[index][0])
        label = plain[index][1]
        digits = [item.label for item in seg._layout(index)[1] if item.kind == "digit"]
        assert digits.count(label) == 3
        kinds.update(np.unique(mask.numpy()).tolist())
    # background, ignored clutter and digit classes all occur
    assert {0, IGNORE_INDEX} <= kinds and len(kinds - {0, IGNORE_INDEX}) >= 3


def test_overlapping_items_go_to_the_brightest_ink():
    # a canvas barely large enough forces overlaps: the rule still holds where items cross
    seg = MegaMNISTSegmentation("train", canvas_size=34, digit_size=16, num_target=2, num_other=1, num_clutter=6,
                                num_samples=4, mask="ink")  # fmt: skip
    crossed = 0
    for index in range(4):
        np.testing.assert_array_equal(seg[index][1].numpy(), expected_mask(seg, index))
        cover = np.zeros((34, 34), dtype=np.int64)
        for item in seg._layout(index)[1]:
            cover[item.top : item.top + item.size, item.left : item.left + item.size] += 1
        crossed += int((cover > 1).sum())
    assert crossed > 0


def test_the_registered_set_names_its_classes_and_scores_the_all_background_rule():
    context = DataContext(split="val", is_training=False, num_samples=5, seed=0, img_size=64)
    dataset = build_dataset("megamnist_seg", context, **OPTIONS)
    assert dataset.num_classes == 11 and dataset.classes == ("background", *map(str, range(10)))
    masks = torch.stack([dataset[i][1] for i in range(5)])
    labelled = masks[masks != IGNORE_INDEX]
    share = (labelled == 0).sum().item() / labelled.numel()
    present = len(set(labelled.tolist()))
    rule = dataset.baselines(None)["all_background"]
    assert rule == pytest.approx({"miou": share / present, "pixel_accuracy": share})
