"""Recall2D (`recall2d`), the images' MQAR: each canvas re-read cell by cell from its stored layout and the source
digits (not from the code that draws it), every query's label re-derived by finding the framed digit in its colour,
the queries far from every key, the digits drawn from the split's own pool, and settings that cannot be drawn
refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from zoo.data import DataContext, build_dataset
from zoo.data._interface import IGNORE_INDEX
from zoo.data.images.megamnist import _split_pools, load_mnist_digits
from zoo.data.images.recall2d import PALETTE, Recall2D

OPTIONS = {"grid": 8, "cell_size": 12, "frame": 1, "digit_size": 9, "num_keys": 3, "num_queries": 2, "min_distance": 3}


def read_cells(dataset: Recall2D, index: int):
    """(query cell -> colour, key cell -> (source, colour)) of canvas `index`, each cell checked against the canvas:
    a query an empty frame of its colour, a key its frame around its white digit resized alone, every other cell
    black; and the mask checked to label exactly the query cells' insides."""
    layout = dataset.layout(index)
    canvas, mask = (t.numpy() for t in dataset[index])
    canvas = canvas * 255  # [3, S, S]
    images, _ = load_mnist_digits()
    size, side, width = dataset.cell_size, dataset.digit_size, dataset.frame
    keys = dict(zip(layout.key_cells, zip(layout.key_sources, layout.key_colours, strict=True), strict=True))
    offsets = dict(zip(layout.key_cells, layout.offsets, strict=True))
    queries = {cell: layout.key_colours[k] for cell, k in zip(layout.query_cells, layout.query_keys, strict=True)}
    assert len(keys) + len(queries) == dataset.num_keys + dataset.num_queries  # no two items share a cell
    for row in range(dataset.grid):
        for col in range(dataset.grid):
            cell = canvas[:, row * size : (row + 1) * size, col * size : (col + 1) * size]
            expected = np.zeros((3, size, size))
            colour = queries.get((row, col), keys.get((row, col), (None, None))[1])
            if colour is not None:
                border = np.ones((size, size), dtype=bool)
                border[width:-width, width:-width] = False
                expected[:, border] = np.asarray(PALETTE[colour], dtype=float)[:, None]
            if (row, col) in keys:
                top, left = offsets[(row, col)]
                digit = Image.fromarray(images[keys[(row, col)][0]]).resize((side, side), Image.Resampling.BILINEAR)
                expected[:, top : top + side, left : left + side] = np.asarray(digit, dtype=float)
            np.testing.assert_allclose(cell, expected, atol=1e-3, err_msg=f"cell {(row, col)} of canvas {index}")
            labelled = mask[row * size : (row + 1) * size, col * size : (col + 1) * size] != IGNORE_INDEX
            inside = np.zeros((size, size), dtype=bool)
            if (row, col) in queries:
                inside[width:-width, width:-width] = True
            assert (labelled == inside).all(), f"labelled pixels of cell {(row, col)} of canvas {index}"
    return queries, keys


def recalled_labels(dataset: Recall2D, index: int) -> dict[tuple[int, int], int]:
    """Each query cell's label: the class of the one key framed in its colour, from the cells alone."""
    _, labels = load_mnist_digits()
    queries, keys = read_cells(dataset, index)
    recalled = {}
    for cell, colour in queries.items():
        matches = [source for source, key_colour in keys.values() if key_colour == colour]
        assert len(matches) == 1
        recalled[cell] = int(labels[matches[0]])
    return recalled


def test_every_query_is_labelled_with_the_digit_framed_in_its_colour():
    dataset = Recall2D("train", num_samples=12, seed=5, **OPTIONS)
    _, labels = load_mnist_digits()
    size = dataset.cell_size
    seen = set()
    for index in range(len(dataset)):
        mask = dataset[index][1].numpy()
        for (row, col), label in recalled_labels(dataset, index).items():
            assert mask[row * size + size // 2, col * size + size // 2] == label
            seen.add(label)
        queries, keys = read_cells(dataset, index)
        assert len({labels[source] for source, _ in keys.values()}) == 3  # digits of distinct classes
        assert len({colour for _, colour in keys.values()}) == 3  # in distinct colours
        assert all(max(abs(r - qr), abs(c - qc)) >= 3 for r, c in keys for qr, qc in queries)
    assert len(seen) > 3


def test_canvases_are_reproducible_and_split_pools_are_megamnists():
    a, b = Recall2D("test", num_samples=20, seed=1, **OPTIONS), Recall2D("test", num_samples=20, seed=1, **OPTIONS)
    assert all(a.layout(i) == b.layout(i) for i in range(20))
    assert Recall2D("test", num_samples=20, seed=2, **OPTIONS).layout(0) != a.layout(0)
    train = Recall2D("train", num_samples=20, seed=1, **OPTIONS)

    def sources(dataset):
        return {source for i in range(20) for source, _ in read_cells(dataset, i)[1].values()}

    # each split draws on its own MegaMNIST pool: no test canvas shows a digit a training canvas shows
    _, labels = load_mnist_digits()
    pools = _split_pools(labels, (0.7, 0.15, 0.15))
    assert sources(a) <= set(pools["test"].tolist()) and sources(train) <= set(pools["train"].tolist())
    assert sources(a) & sources(train) == set()


def test_baselines_are_counted_from_the_query_pixels():
    train = Recall2D("train", num_samples=40, seed=0, **OPTIONS)
    val = Recall2D("val", num_samples=20, seed=0, **OPTIONS)

    def pixels(dataset):
        masks = np.stack([dataset[i][1].numpy() for i in range(len(dataset))])
        return masks[masks != IGNORE_INDEX]

    train_pixels, val_pixels = pixels(train), pixels(val)
    majority = int(np.bincount(train_pixels, minlength=10).argmax())
    rules = val.baselines(train)
    share = float(np.mean(val_pixels == majority))
    assert rules["majority"]["pixel_accuracy"] == pytest.approx(share)
    assert rules["majority"]["miou"] == pytest.approx(share / len(np.unique(val_pixels)))
    assert rules["digit_on_canvas"]["pixel_accuracy"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"grid": 4, "min_distance": 4}, "num_keys=3 and num_queries=2 do not fit"),
        ({"cell_size": 12, "frame": 1, "digit_size": 11}, "digit_size"),
        ({"cell_size": 12, "frame": 6}, "frame"),
        ({"num_keys": 9}, "num_keys"),
        ({"num_queries": 0}, "num_queries"),
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
    size = dataset.cell_size
    for (row, col), label in recalled_labels(dataset, 2).items():
        assert dataset[2][1][row * size + size // 2, col * size + size // 2] == label
