"""The recipe keys of train.ema, train.mixup, train.early_stopping, train.deterministic and optim.name: each bad value
is one line naming the key, the value and what is allowed."""

import pytest
from helpers import tiny_vit_recipe

from zoo.config import RecipeError, recipe_from_dict


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"optim": {"name": "adamm"}},
            r"optim\.name: unknown optimizer 'adamm' \(did you mean 'adam', .*\); one of timm\.optim\.list_optim",
        ),
        ({"optim": {"name": "lookahead_sgdd"}}, r"optim\.name: unknown optimizer 'lookahead_sgdd'"),
        ({"train": {"ema": {"decai": 0.9}}}, r"train\.ema\.decai: unknown key \(did you mean 'decay'\?\)"),
        ({"train": {"ema": {"decay": 1.0}}}, r"train\.ema\.decay: expected a number in \(0, 1\), got 1\.0"),
        ({"train": {"ema": {"evaluate": "best"}}}, r"train\.ema\.evaluate: expected one of 'ema', 'raw', got 'best'"),
        (
            {"train": {"ema": {}, "distributed": "fsdp"}},
            r"train\.ema: averages whole weights: needs .*'ddp', got 'fsdp'",
        ),
        ({"train": {"mixup": {"mixup_alpha": 0, "cutmix_alpha": 0}}}, r"train\.mixup\.mixup_alpha: .* got both 0"),
        ({"train": {"mixup": {"switch_prob": 1.5}}}, r"train\.mixup\.switch_prob: expected a number in \[0, 1\]"),
        ({"train": {"early_stopping": {"patience": 0}}}, r"train\.early_stopping\.patience: expected an integer >= 1"),
        (
            {"train": {"early_stopping": {}, "validate": False}},
            r"train\.early_stopping: watches the validation score: needs train\.validate true",
        ),
        ({"train": {"deterministic": "yes"}}, r"train\.deterministic: expected true or false, got 'yes'"),
    ],
)
def test_bad_values_name_the_key(sections, message):
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict(tiny_vit_recipe(**sections))


def test_good_values_load():
    recipe = recipe_from_dict(
        tiny_vit_recipe(
            optim={"name": "lookahead_adamw"},
            train={"ema": {"decay": 0.99}, "mixup": {"cutmix_alpha": 0}, "early_stopping": {}, "deterministic": True},
        )
    )
    assert (recipe.train.ema.decay, recipe.train.ema.evaluate) == (0.99, "ema")
    assert (recipe.train.mixup.mixup_alpha, recipe.train.mixup.cutmix_alpha) == (0.8, 0.0)
    assert recipe.train.early_stopping.patience == 5 and recipe.train.deterministic
