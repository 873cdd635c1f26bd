"""Recall2D (`recall2d`), the images' MQAR: each canvas re-read cell by cell from its stored layout and the source
digits (not from the code that draws it), its label re-derived by finding the key in the query's colour, its digits
drawn from the split's own pool, and settings that cannot be drawn refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from zoo.data import DataContext, build_dataset
from zoo.data.images.megamnist import _split_pools, load_mnist_digits
from zoo.data.images.recall2d import PALETTE, Recall2D

OPTIONS = {"grid": 8, "cell_size": 12, "digit_size": 9, "num_keys": 3, "min_distance": 3}


def read_cells(dataset: Recall2D, index: int) -> tuple[tuple[int, int], int, dict[tuple[int, int], tuple[int, int]]]:
    """(query cell, query colour, key cell -> (source, colour)), each cell checked against the canvas: the query a
    solid square of its colour, a key its digit resized alone and scaled by its colour, everything else black."""
    layout = dataset.layout(index)
    canvas = dataset[index][0].numpy() * 255  # [3, S, S]
    images, _ = load_mnist_digits()
    size, side = dataset.cell_size, dataset.digit_size
    keys = dict(zip(layout.key_cells, zip(layout.key_sources, layout.key_colours, strict=True), strict=True))
    offsets = dict(zip([layout.query_cell, *layout.key_cells], layout.offsets, strict=True))
    assert len(offsets) == 1 + dataset.num_keys  # no two items share a cell
    for row in range(dataset.grid):
        for col in range(dataset.grid):
            cell = canvas[:, row * size : (row + 1) * size, col * size : (col + 1) * size]
            expected = np.zeros((3, size, size))
            if (row, col) in offsets:
                top, left = offsets[(row, col)]
                if (row, col) == layout.query_cell:
                    ink, colour = np.full((side, side), 255.0), layout.query_colour
                else:
                    source, colour = keys[(row, col)]
                    ink = np.asarray(Image.fromarray(images[source]).resize((side, side), Image.Resampling.BILINEAR))
                rgb = np.asarray(PALETTE[colour], dtype=float)[:, None, None]
                expected[:, top : top + side, left : left + side] = np.rint(ink / 255.0 * rgb)
            np.testing.assert_allclose(cell, expected, atol=1e-3, err_msg=f"cell {(row, col)} of canvas {index}")
    return layout.query_cell, layout.query_colour, keys


def recalled_label(dataset: Recall2D, index: int) -> int:
    """The class of the one key drawn in the query's colour, from the cells alone."""
    _, labels = load_mnist_digits()
    _, colour, keys = read_cells(dataset, index)
    matches = [source for source, key_colour in keys.values() if key_colour == colour]
    assert len(matches) == 1
    return int(labels[matches[0]])


def test_labels_are_the_digit_in_the_querys_colour():
    dataset = Recall2D("train", num_samples=12, seed=5, **OPTIONS)
    _, labels = load_mnist_digits()
    for index in range(len(dataset)):
        assert dataset[index][1] == recalled_label(dataset, index)
        (query_row, query_col), _, keys = read_cells(dataset, index)
        assert len({labels[source] for source, _ in keys.values()}) == 3  # digits of distinct classes
        assert len({colour for _, colour in keys.values()}) == 3  # in distinct colours
        assert all(max(abs(row - query_row), abs(col - query_col)) >= 3 for row, col in keys)
    assert len({dataset[i][1] for i in range(12)}) > 3


def test_a_fixed_query_cell_holds_the_query_on_every_canvas():
    dataset = Recall2D("val", num_samples=6, query_cell=(0, 0), **OPTIONS)
    for index in range(6):
        assert read_cells(dataset, index)[0] == (0, 0)
        assert dataset[index][1] == recalled_label(dataset, index)


def test_canvases_are_reproducible_and_split_pools_are_megamnists():
    a, b = Recall2D("test", num_samples=20, seed=1, **OPTIONS), Recall2D("test", num_samples=20, seed=1, **OPTIONS)
    assert all(a.layout(i) == b.layout(i) for i in range(20))
    assert Recall2D("test", num_samples=20, seed=2, **OPTIONS).layout(0) != a.layout(0)
    train = Recall2D("train", num_samples=20, seed=1, **OPTIONS)

    def sources(dataset):
        return {source for i in range(20) for source, _ in read_cells(dataset, i)[2].values()}

    # each split draws on its own MegaMNIST pool: no test canvas shows a digit a training canvas shows
    _, labels = load_mnist_digits()
    pools = _split_pools(labels, (0.7, 0.15, 0.15))
    assert sources(a) <= set(pools["test"].tolist()) and sources(train) <= set(pools["train"].tolist())
    assert sources(a) & sources(train) == set()


def test_baselines_are_counted_from_the_labels():
    train = Recall2D("train", num_samples=60, seed=0, **OPTIONS)
    val = Recall2D("val", num_samples=30, seed=0, **OPTIONS)
    train_labels = [recalled_label(train, i) for i in range(60)]
    val_labels = [recalled_label(val, i) for i in range(30)]
    majority = max(range(10), key=lambda c: (train_labels.count(c), -c))
    rules = val.baselines(train)
    assert rules["majority"]["top1"] == pytest.approx(val_labels.count(majority) / 30)
    assert rules["digit_on_canvas"]["top1"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"grid": 6, "min_distance": 4, "num_keys": 3}, "num_keys=3 do not fit"),
        ({"cell_size": 12, "digit_size": 13}, "digit_size"),
        ({"num_keys": 9}, "num_keys"),
        ({"query_cell": (0, 8)}, "query_cell"),
        ({"query_cell": (3, 3), "min_distance": 5, "num_keys": 3}, r"query at cell \(3, 3\) leaves 0 cells"),
    ],
)
def test_impossible_settings_name_the_option(options, named):
    with pytest.raises(ValueError, match=named):
        Recall2D("train", num_samples=2, **{**OPTIONS, **options})


def test_recipe_options_are_checked_against_the_model_size():
    context = DataContext("train", is_training=True, num_samples=2, img_size=128)
    with pytest.raises(ValueError, match=r"grid \* cell_size \(8 \* 12 = 96\)"):
        build_dataset("recall2d", context, **OPTIONS)
    dataset = build_dataset("recall2d", DataContext("val", is_training=False, num_samples=3, img_size=96), **OPTIONS)
    assert dataset[2][1] == recalled_label(dataset, 2)
