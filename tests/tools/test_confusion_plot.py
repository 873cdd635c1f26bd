"""The confusion PNG of tools/eval.py stays readable from 10 to 1,000 classes and with long class names: the cells
keep a readable size, the figure grows with the names instead of the matrix shrinking."""

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image

from zoo.evaluate import CONFUSION_DPI, confusion_layout, plot_confusion


def matrix(classes: int, seed: int = 0) -> np.ndarray:
    """A trained model's confusion matrix: most samples on the diagonal, about three kinds of error per class."""
    rng = np.random.default_rng(seed)
    values = np.diag(rng.integers(50, 900, classes))
    wrong = rng.integers(0, classes, (3 * classes, 2))
    np.add.at(values, (wrong[:, 0], wrong[:, 1]), rng.integers(1, 30, 3 * classes))
    return values


def pixels(points: float) -> float:
    return points * CONFUSION_DPI / 72


@pytest.mark.parametrize("classes", [10, 100])
def test_every_class_is_named_and_counted_in_a_readable_cell(classes, tmp_path):
    values, names = matrix(classes), [f"species {i}" for i in range(classes)]
    layout = confusion_layout(torch.tensor(values), names)
    # cells of 36 pt (50 px) up to 40 classes, then the matrix held at 1,440 pt (20 in): 14.4 pt (20 px) at 100
    assert layout.cell == pytest.approx(min(36.0, 1440.0 / classes))
    assert round(pixels(layout.cell)) == (50 if classes == 10 else 20)
    # names at the largest size (10 pt), every one of them, as a cell is wider than a line
    assert layout.stride == 1 and layout.font == 10.0 and layout.rotate
    # the widest count has 3 digits of 0.636 em (DejaVu Sans's digit advance, 1303 / 2048): 1.91 size wide, which
    # fits 0.85 of a 36-pt cell at the largest size and of a 14.4-pt one only at the smallest, 6 pt
    assert values.max() < 1000 and layout.count_font == (10.0 if classes == 10 else 6.0)
    assert layout.right == 12.0  # counts in the cells: no colour bar beside them
    plot_confusion(values.tolist(), tmp_path / "c.png", names)
    width, height = Image.open(tmp_path / "c.png").size
    assert abs(width - pixels(layout.size(classes)[0])) <= 1 and abs(height - pixels(layout.size(classes)[1])) <= 1
    assert max(width, height) < 2600


def test_long_class_names_widen_the_figure_instead_of_shrinking_the_matrix(tmp_path):
    values = matrix(4)
    short = ["E", "H", "S", "V"]
    long = ["Escherichia coli K-12 MG1655", "Helicobacter pylori 26695", "Staphylococcus aureus", "Vibrio cholerae"]
    narrow, wide = confusion_layout(torch.tensor(values), short), confusion_layout(torch.tensor(values), long)
    assert wide.cell == narrow.cell and wide.left > narrow.left + 100 and wide.rotate
    plot_confusion(values.tolist(), tmp_path / "c.png", long)
    image = np.asarray(Image.open(tmp_path / "c.png").convert("L"))
    # the figure is the layout's size: the margins, the matrix of 4 cells and the right margin
    width, height = wide.size(4)
    assert width == pytest.approx(wide.left + 4 * wide.cell + wide.right)
    assert abs(image.shape[1] - pixels(width)) <= 1 and abs(image.shape[0] - pixels(height)) <= 1
    # nothing is cut at the image's edges: the outermost pixels are background
    assert (image[:, :2] > 250).all() and (image[-2:, :] > 250).all() and (image[:2, :] > 250).all()
    # a name of 224 letters is cut after 39 with an ellipsis, not given a 224-letter margin: the layout of the name
    # cut by hand
    longest = confusion_layout(torch.tensor(values), [long[0] * 8, *long[1:]])
    assert longest == confusion_layout(torch.tensor(values), [(long[0] * 8)[:39] + "\u2026", *long[1:]])


def test_a_thousand_classes_name_every_kth_class_and_show_a_colour_bar(tmp_path):
    values, names = matrix(1000), [f"class {i}" for i in range(1000)]
    layout = confusion_layout(torch.tensor(values), names)
    # 1,440 pt over 1,000 classes: 1.44-pt cells, names at the smallest size (6 pt), so every ceil(6 / 1.44) = 5th
    # class named (ticks 7.2 pt apart, more than a line); no count fits, a colour bar (60 pt) instead
    assert layout.cell == pytest.approx(1.44) and layout.font == 6.0 and layout.stride == 5
    assert layout.count_font is None and layout.right == 60.0
    width, height = layout.size(1000)
    assert width == pytest.approx(layout.left + 1440 + 60) and height == pytest.approx(layout.bottom + 1440 + 12)
    assert max(pixels(width), pixels(height)) < 2500
    plot_confusion(values.tolist(), tmp_path / "c.png", names)
    image = np.asarray(Image.open(tmp_path / "c.png").convert("RGB")).astype(int)
    assert abs(image.shape[1] - pixels(width)) <= 1 and abs(image.shape[0] - pixels(height)) <= 1
    # the bar: 10 pt wide, 8 pt right of the matrix, as tall as it; from top to bottom the colour map "Blues" runs
    # from the largest count down to 0, each row the colour of its count
    column = image[:, round(pixels(layout.left + 1440 + 13))]
    top = pixels(layout.top)
    blues = matplotlib.colormaps["Blues"]
    for fraction in (0.1, 0.3, 0.5, 0.7, 0.9):
        row = round(top + pixels(1440) * fraction)
        expected = np.array(blues(1 - fraction)[:3]) * 255
        assert np.abs(column[row] - expected).max() <= 4, (fraction, column[row], expected)
