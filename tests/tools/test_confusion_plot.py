"""The confusion PNG of tools/eval.py stays readable from 10 to 1,000 classes and with long class names: the cells
keep a readable size, the figure grows with the names instead of the matrix shrinking."""

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
    assert layout.stride == 1 and layout.font >= 6 and layout.count_font >= 6
    # at 100 classes the old plot drew 61-inch, 6,100-px squares (a minute to draw); the cells now shrink to 20 px
    assert pixels(layout.cell) >= (50 if classes == 10 else 20)
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
    side = round(pixels(wide.cell * 4))
    assert image.shape[1] > side + pixels(wide.left) - 2
    # nothing is cut at the image's edges: the outermost pixels are background
    assert (image[:, :2] > 250).all() and (image[-2:, :] > 250).all() and (image[:2, :] > 250).all()
    # a name of 200 letters is cut with an ellipsis, not given a 200-letter margin
    longest = confusion_layout(torch.tensor(values), [long[0] * 8, *long[1:]])
    assert longest.left < wide.left + 120


def test_a_thousand_classes_name_every_kth_class_and_show_a_colour_bar():
    layout = confusion_layout(torch.tensor(matrix(1000)), [f"class {i}" for i in range(1000)])
    assert layout.count_font is None and layout.stride > 1
    # named ticks are at least a line apart
    assert layout.stride * layout.cell >= layout.font
    assert max(pixels(side) for side in layout.size(1000)) < 2500
