"""`mask_folder`: masks read pixel for pixel as written (palette indices, grey values, the ignore value), cropped
with the image's own geometry, the three splits of one folder, and the class options. The odd folders (missing
masks, sizes, unknown values, RGB masks) are cases of test_odd_inputs.py."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from odd_inputs import mask_tree, write_mask
from PIL import Image

from zoo.data import DataContext, build_dataset, collate_for
from zoo.data._interface import IGNORE_INDEX
from zoo.data.images import mask_folder as mask_folder_module
from zoo.evaluate import plot_masks, shown_image

pytestmark = pytest.mark.usefixtures("no_network")

# timm's evaluation transform at 16 px: the shorter side resized to floor(16 / 0.875) = 18, the centre 16 cut out
IMG_SIZE = 16


def build(root: Path, split: str = "train", *, training: bool = False, seed: int = 0, in_chans: int = 3, **options):
    context = DataContext(split, training, seed=seed, root=str(root), img_size=IMG_SIZE, in_chans=in_chans)
    return build_dataset("mask_folder", context, **options)


def write_pair(root: Path, name: str, classes: np.ndarray, *, palette: bool = True, image: np.ndarray | None = None):
    """`root/images/<name>.jpg` (`image`, or noise) and `root/masks/<name>.png` holding `classes`."""
    rng = np.random.default_rng(len(name))
    pixels = image if image is not None else rng.integers(0, 256, (*classes.shape, 3), dtype=np.uint8)
    (root / "images").mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(root / "images" / f"{name}.png")
    write_mask(root / "masks" / f"{name}.png", classes, palette=palette)


@pytest.mark.parametrize("palette", [True, False], ids=["palette", "grey"])
def test_masks_read_pixel_for_pixel_with_the_ignore_value(tmp_path, palette):
    rng = np.random.default_rng(0)
    # 18 x 28 (h x w): the resize to a shorter side of 18 changes nothing, the centre crop starts at row 1, column 6
    classes = rng.integers(0, 5, (18, 28)).astype(np.uint8)
    classes[2:5, 7:12] = 255
    write_pair(tmp_path, "a", classes, palette=palette)
    dataset = build(tmp_path, num_classes=5, test_fraction=0, val_fraction=0)
    image, mask = dataset[0]
    expected = classes[1:17, 6:22].astype(np.int64)
    expected[expected == 255] = IGNORE_INDEX
    assert mask.dtype == torch.int64 and image.dtype == torch.float32 and image.shape == (3, IMG_SIZE, IMG_SIZE)
    np.testing.assert_array_equal(mask.numpy(), expected)
    assert (mask == IGNORE_INDEX).sum() == 3 * 5


def test_downscaled_masks_take_a_pixel_never_a_blend(tmp_path):
    """A 36 x 36 mask of 2 x 2 blocks, halved to 18 by nearest neighbour: each output pixel is its block's class."""
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 4, (18, 18)).astype(np.uint8)
    write_pair(tmp_path, "a", np.kron(blocks, np.ones((2, 2), np.uint8)), palette=False)
    _, mask = build(tmp_path, num_classes=4, test_fraction=0, val_fraction=0)[0]
    np.testing.assert_array_equal(mask.numpy(), blocks[1:17, 1:17])


def test_other_ignore_value_and_sixteen_bit_and_grey_rgb_masks(tmp_path):
    """ignore_value 7 (255 is then an unknown value); a 16-bit mask of 300 classes; an RGB mask with equal channels."""
    rng = np.random.default_rng(2)
    classes = rng.integers(0, 3, (18, 18)).astype(np.uint8)
    classes[0:4, 0:4] = 7
    write_pair(tmp_path / "ignore", "a", classes)
    _, mask = build(tmp_path / "ignore", num_classes=3, test_fraction=0, val_fraction=0, ignore_value=7)[0]
    expected = np.where(classes == 7, IGNORE_INDEX, classes.astype(np.int64))[1:17, 1:17]
    np.testing.assert_array_equal(mask.numpy(), expected)

    wide = rng.integers(0, 300, (18, 18)).astype(np.uint16)
    write_pair(tmp_path / "deep", "a", np.zeros((18, 18), np.uint8))
    Image.fromarray(wide).save(tmp_path / "deep" / "masks" / "a.png")
    assert Image.open(tmp_path / "deep" / "masks" / "a.png").mode.startswith("I")
    _, mask = build(tmp_path / "deep", num_classes=300, ignore_value=300, test_fraction=0, val_fraction=0)[0]
    np.testing.assert_array_equal(mask.numpy(), wide[1:17, 1:17])

    write_pair(tmp_path / "rgb", "a", np.zeros((18, 18), np.uint8))
    Image.fromarray(np.repeat(classes[..., None], 3, axis=2)).save(tmp_path / "rgb" / "masks" / "a.png")
    _, mask = build(tmp_path / "rgb", num_classes=3, ignore_value=7, test_fraction=0, val_fraction=0)[0]
    np.testing.assert_array_equal(mask.numpy(), expected)


def _block_picture(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A 64 x 64 mask of 8 x 8 blocks of classes 0-3, and an image whose red channel is 30 + 60 x class."""
    blocks = np.random.default_rng(seed).integers(0, 4, (8, 8))
    classes = np.kron(blocks, np.ones((8, 8), np.int64)).astype(np.uint8)
    image = np.stack([30 + 60 * classes, np.full_like(classes, 128), np.full_like(classes, 40)], axis=2)
    return classes, image.astype(np.uint8)


def _misaligned(image: torch.Tensor, mask: torch.Tensor, mean: float, std: float) -> int:
    """Inner pixels whose red value lies outside the red values of the classes in the mask's 3 x 3 neighbourhood
    (3 levels of slack): 0 when the mask sits where the image does. A bilinear (antialiased) pixel mixes the source
    up to its neighbours' nearest source pixels, and a block (8 source pixels) is wider than their spacing (at most
    64 / 16), so its value lies between theirs; a border pixel's mix reaches past the mask's last column, unchecked."""
    red = (image[0] * std + mean) * 255
    level = (30.0 + 60.0 * mask.double())[None, None]
    high = torch.nn.functional.max_pool2d(level, 3, stride=1)[0, 0]
    low = -torch.nn.functional.max_pool2d(-level, 3, stride=1)[0, 0]
    inner = red[1:-1, 1:-1]
    return int(((inner < low - 3) | (inner > high + 3)).sum())


def test_the_mask_follows_the_image_through_random_crops_and_flips(tmp_path):
    classes, image = _block_picture(3)
    write_pair(tmp_path, "a", classes, image=image)
    dataset = build(tmp_path, training=True, num_classes=4, test_fraction=0, val_fraction=0)
    # colour jitter changes the red values this check reads; the geometry is what is tested
    dataset.transform.colour = lambda picture: picture
    mean, std = dataset.mean[0], dataset.std[0]
    masks, flipped_off = [], 0
    for seed in range(12):
        # timm's crop draws from `random`, the flip from torch
        random.seed(seed)
        torch.manual_seed(seed)
        image_out, mask = dataset[0]
        assert _misaligned(image_out, mask, mean, std) == 0, seed
        flipped_off += _misaligned(image_out, mask.flip(-1), mean, std) > 0
        masks.append(mask)
    # the crops differ between draws, and a mask flipped alone is caught by the same check
    assert len({tuple(m.flatten().tolist()) for m in masks}) == len(masks)
    assert flipped_off >= 10

    _, eval_image = _block_picture(4)
    write_pair(tmp_path / "eval", "a", _block_picture(4)[0], image=eval_image)
    image_out, mask = build(tmp_path / "eval", num_classes=4, test_fraction=0, val_fraction=0)[0]
    assert _misaligned(image_out, mask, mean, std) == 0 < _misaligned(image_out, mask.flip(-1), mean, std)


def test_one_folder_is_split_by_the_seed_into_three_disjoint_shares(tmp_path):
    for k in range(20):
        write_pair(tmp_path, f"{k:02d}", np.full((10, 12), k % 3, np.uint8))

    def names(split: str, seed: int = 0) -> list[str]:
        return [Path(image).stem for image, _ in build(tmp_path, split, seed=seed, num_classes=3).samples]

    shares = {split: names(split) for split in ("train", "val", "test")}
    assert [len(shares[s]) for s in ("train", "val", "test")] == [16, 2, 2]
    assert sorted(sum(shares.values(), [])) == [f"{k:02d}" for k in range(20)]
    assert names("val") == shares["val"] and names("val", seed=1) != shares["val"]


def test_split_folders_are_used_as_they_are_and_collate_as_image_and_label(tmp_path):
    root = mask_tree(tmp_path / "set", per_split=2)
    dataset = build(root, "val", num_classes=3)
    assert [Path(image).relative_to(root).as_posix() for image, _ in dataset.samples] == [
        "val/images/0.png",
        "val/images/1.png",
    ]
    batch = collate_for("image")([dataset[0], dataset[1]])
    written = [np.asarray(Image.open(root / "val" / "masks" / f"{k}.png")) for k in range(2)]
    # 12 x 10 images: shorter side 10 -> 18 (x1.8), long side 21; the centre 16 x 16 of that
    expected = [np.asarray(Image.fromarray(w).resize((21, 18), Image.Resampling.NEAREST))[1:17, 2:18] for w in written]
    assert batch["image"].shape == (2, 3, IMG_SIZE, IMG_SIZE)
    np.testing.assert_array_equal(batch["label"].numpy(), np.stack(expected))


def test_class_names_from_the_options_or_classes_txt(tmp_path):
    root = mask_tree(tmp_path / "set")
    assert build(root, num_classes=3).classes == ("0", "1", "2")
    named = build(root, classes=["sky", "road", "car"])
    assert named.classes == ("sky", "road", "car") and named.num_classes == 3
    (root / "classes.txt").write_text("sky\nroad\n\ncar\n")
    assert build(root).classes == ("sky", "road", "car")
    with pytest.raises(ValueError, match=r"classes\.txt' names 3 classes, data\.options\.num_classes is 4"):
        build(root, num_classes=4)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_classes": 2, "classes": ["a", "b", "c"]}, r"data\.options\.classes: names 3 classes, num_classes is 2"),
        ({"num_classes": 3, "ignore_value": 2}, r"data\.options\.ignore_value: 2 is a class \(of 3\)"),
        ({"num_classes": 3, "val_fraction": 0.5, "test_fraction": 0.5}, r"test_fraction: plus val_fraction"),
    ],
)
def test_options_that_disagree_are_refused_naming_the_key(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        build(mask_tree(tmp_path / "set"), **options)


def test_the_most_frequent_class_baseline_scores_as_torchmetrics_does(tmp_path):
    """Class 2 is the most frequent in train; val's masks hold classes 0 and 2 (and ignored pixels) of 4."""
    from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

    rng = np.random.default_rng(6)
    for split, choices in (("train", [0, 1, 2, 2, 2]), ("val", [0, 0, 2, 255])):
        for k in range(3):
            write_pair(tmp_path / split, f"{k}", rng.choice(choices, (18, 18)).astype(np.uint8))
    train, val = build(tmp_path, "train", num_classes=4), build(tmp_path, "val", num_classes=4)
    masks = torch.stack([val[index][1] for index in range(len(val))])
    guess = torch.full_like(masks, 2)
    expected = {
        "miou": MulticlassJaccardIndex(4, average="macro", ignore_index=IGNORE_INDEX)(guess, masks).item(),
        "pixel_accuracy": MulticlassAccuracy(4, average="micro", ignore_index=IGNORE_INDEX)(guess, masks).item(),
    }
    scores = val.baselines(train)["most_frequent_class"]
    assert scores == pytest.approx(expected, abs=1e-6) and 0.3 < scores["pixel_accuracy"] < 0.45


@pytest.mark.parametrize(
    ("spoil", "match"),
    [
        (lambda masks: write_mask(masks / "3.png", np.zeros((5, 6))), r"mask .*3\.png is 6x5 pixels, its .*12x10"),
        (lambda masks: Image.new("RGB", (12, 10), (200, 0, 0)).save(masks / "3.png"), r"3\.png is an RGB image"),
        (lambda masks: Image.new("F", (12, 10)).save(masks / "3.tif"), r"3\.tif has the PIL mode 'F'"),
    ],
    ids=["size", "rgb", "float"],
)
def test_a_bad_mask_stops_the_split_when_it_is_built_before_any_pair_is_read(tmp_path, monkeypatch, spoil, match):
    root = mask_tree(tmp_path / "masks", per_split=4)
    masks = root / "train" / "masks"
    (masks / "3.png").unlink()
    spoil(masks)
    read, real = [], mask_folder_module.read_mask
    monkeypatch.setattr(mask_folder_module, "read_mask", lambda path: read.append(path) or real(path))
    with pytest.raises(ValueError, match=match + r".*on_bad_image: skip leaves such pairs out"):
        build(root, num_classes=3)
    # only the header was looked at, but for the RGB mask, read whole to tell grey from colours
    assert all(Path(path).name.startswith("3.") for path in read)
    # the other splits build
    assert len(build(root, "val", num_classes=3)) == 4


def test_the_evaluation_figure_shows_the_image_as_it_was_read(tmp_path):
    # navy and orange, normalised with ImageNet's mean and std: clipped to [0, 1], navy showed black and orange yellow
    colours = {"navy": (0, 0, 128), "orange": (255, 165, 0)}
    for name, rgb in colours.items():
        write_pair(tmp_path, name, np.zeros((16, 16), dtype=np.int64), image=np.full((16, 16, 3), rgb, np.uint8))
    dataset = build(tmp_path, "train", num_classes=2, val_fraction=0, test_fraction=0)
    for index, (name, _) in enumerate(sorted(dataset.samples)):
        expected = torch.tensor(colours[Path(name).stem], dtype=torch.float32).reshape(3, 1, 1) / 255
        shown = shown_image(dataset[index][0], dataset)
        torch.testing.assert_close(shown, expected.expand(3, 16, 16), atol=1e-6, rtol=0)

    class Background(torch.nn.Conv2d):
        def forward(self, images):  # [n, 2, H, W]: class 0 everywhere
            return torch.stack([torch.ones_like(images[:, 0]), torch.zeros_like(images[:, 0])], 1)

    plot_masks(Background(3, 2, 1), dataset, tmp_path / "masks.png")
    pixels = np.asarray(Image.open(tmp_path / "masks.png").convert("RGB")).reshape(-1, 3)
    for rgb in colours.values():
        assert (pixels == rgb).all(1).sum() > 1000, rgb
