"""data.options.augment (timm's create_transform training route) for megamnist and folder: the training split is
augmented, validation and test are left exactly as they were."""

import numpy as np
import pytest
import torch
from helpers import TINY_CANVAS, tiny_vit_recipe
from PIL import Image
from timm.data.auto_augment import RandAugment
from timm.data.random_erasing import RandomErasing

from zoo.config import RecipeError, recipe_from_dict
from zoo.splits import build_split

AUGMENT = {"auto_augment": "rand-m9-mstd0.5", "re_prob": 0.5, "scale": [0.9, 1.0], "hflip": 0.0}


def splits(augment):
    options = {**TINY_CANVAS, "augment": augment} if augment is not None else TINY_CANVAS
    recipe = recipe_from_dict(tiny_vit_recipe(data={"options": options}))
    return {split: build_split(recipe, split) for split in ("train", "val", "test")}


def test_only_the_training_canvases_change():
    plain, augmented = splits(None), splits(AUGMENT)
    for split in ("val", "test"):
        for index in range(4):
            image, label = augmented[split][index]
            assert torch.equal(image, plain[split][index][0]) and label == plain[split][index][1]
    changed = [not torch.equal(augmented["train"][i][0], plain["train"][i][0]) for i in range(8)]
    assert all(changed)
    assert [augmented["train"][i][1] for i in range(8)] == [plain["train"][i][1] for i in range(8)]
    assert augmented["train"].num_classes == 10 and augmented["train"][0][0].shape == (1, 32, 32)


def test_random_erasing_alone_blanks_one_box_and_keeps_the_rest():
    # no crop (scale and ratio 1), no flip, no policy, always erased: each pixel is the canvas's own or 0
    erase = {"auto_augment": None, "re_prob": 1.0, "scale": [1.0, 1.0], "ratio": [1.0, 1.0], "hflip": 0.0}
    plain, augmented = splits(None)["train"], splits(erase)["train"]
    torch.manual_seed(0)
    for index in range(4):
        original, erased = plain[index][0], augmented[index][0]
        differ = erased != original
        assert bool((erased[differ] == 0).all()) and bool((erased[~differ] == original[~differ]).all())
        rows, cols = differ[0].nonzero(as_tuple=True)
        if len(rows):
            # one rectangle: the bounding box of the changed pixels holds no unchanged ink
            box = (slice(int(rows.min()), int(rows.max()) + 1), slice(int(cols.min()), int(cols.max()) + 1))
            assert bool((erased[0][box] == 0).all())


def test_folder_training_transform_has_the_policy_and_erasing(tmp_path):
    for split in ("train", "val"):
        for label in ("a", "b"):
            (tmp_path / split / label).mkdir(parents=True)
            Image.fromarray(np.full((40, 40, 3), 100, np.uint8)).save(tmp_path / split / label / "x.png")
    tree = tiny_vit_recipe(data={"name": "folder", "root": str(tmp_path), "options": {"augment": AUGMENT}})
    recipe = recipe_from_dict(tree)
    train, val = build_split(recipe, "train"), build_split(recipe, "val")
    kinds = [type(t) for t in train.transform.transforms]
    assert RandAugment in kinds and RandomErasing in kinds
    crop = train.transform.transforms[0]
    assert crop.scale == (0.9, 1.0)
    plain_tree = tiny_vit_recipe(data={"name": "folder", "root": str(tmp_path), "options": {}})
    plain = build_split(recipe_from_dict(plain_tree), "val")
    assert repr(val.transform) == repr(plain.transform)


@pytest.mark.parametrize(
    ("augment", "message"),
    [
        ({"scale": [0.9, 0.5]}, r"data\.options\.augment\.scale: scale and ratio are \[low, high\]"),
        ({"re_prob": 2}, r"data\.options\.augment\.re_prob: expected a number in \[0, 1\], got 2"),
        ({"auto_augment": "randaug"}, None),
        ({"auto_augment": "m9"}, r"data\.options\.augment\.auto_augment: a timm policy string"),
        ({"rand": 1}, r"data\.options\.augment\.rand: unknown key"),
    ],
)
def test_bad_augment_options_name_the_key(augment, message):
    tree = tiny_vit_recipe(data={"options": {**TINY_CANVAS, "augment": augment}})
    if message is None:
        recipe_from_dict(tree)
        return
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict(tree)
