"""train.mixup: the training loss of a mixed batch equals the soft-target cross-entropy written out here (numpy's
draw of lam, the batch paired with its reverse, smoothed one-hot targets), for mixup and for CutMix; a recipe that
is not images of one class each is refused by name."""

import numpy as np
import pytest
import torch
from helpers import tiny_sequence_recipe, tiny_vit_recipe

from zoo.config import RecipeError, recipe_from_dict
from zoo.kinds import get_model_kind
from zoo.train._mixup import MixupObjective

B, C, H, W, K, EPS = 4, 1, 8, 8, 5, 0.1


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(C * H * W, K)

    def forward(self, x):
        return self.fc(x.flatten(1))


def objective(**mixup):
    recipe = recipe_from_dict(tiny_vit_recipe(train={"mixup": mixup, "label_smoothing": EPS}))
    kind = get_model_kind(recipe.model.kind)
    return MixupObjective(kind, kind.task(recipe), recipe.train, num_classes=K)


def batch():
    generator = torch.Generator().manual_seed(1)
    return {"image": torch.rand(B, C, H, W, generator=generator), "label": torch.tensor([0, 3, 1, 4])}


def soft_cross_entropy(model, images, labels, partner_labels, lam):
    smoothed = torch.full((B, K), EPS / K)
    one_hot = smoothed + (1 - EPS) * torch.nn.functional.one_hot(labels, K)
    partner = smoothed + (1 - EPS) * torch.nn.functional.one_hot(partner_labels, K)
    target = lam * one_hot + (1 - lam) * partner
    return -(target * model(images).log_softmax(-1)).sum(-1).mean()


def test_mixup_loss_is_the_hand_computed_soft_target_loss():
    model, data = Linear(), batch()
    np.random.seed(7)
    loss = objective(mixup_alpha=0.4, cutmix_alpha=0.0).loss(model, {k: v.clone() for k, v in data.items()})
    np.random.seed(7)
    np.random.rand()  # timm's draw of whether to mix (prob 1)
    lam = float(np.random.beta(0.4, 0.4))
    images = lam * data["image"] + (1 - lam) * data["image"].flip(0)
    expected = soft_cross_entropy(model, images, data["label"], data["label"].flip(0), lam)
    assert 0.01 < lam < 0.99
    torch.testing.assert_close(loss, expected)


def test_cutmix_loss_uses_the_share_of_pixels_kept():
    model, data = Linear(), batch()
    mixed = {}
    model.register_forward_pre_hook(lambda module, args: mixed.setdefault("images", args[0].clone()))
    np.random.seed(3)
    loss = objective(mixup_alpha=0.0, cutmix_alpha=1.0).loss(model, {k: v.clone() for k, v in data.items()})
    # every pixel is the sample's own or its partner's (random images: never both); lam is the share kept
    own = mixed["images"] == data["image"]
    partner = mixed["images"] == data["image"].flip(0)
    assert bool((own ^ partner).all())
    lam = own[0].float().mean().item()
    assert 0 < lam < 1 and bool((own.float().mean((1, 2, 3)) == lam).all())
    expected = soft_cross_entropy(model, mixed["images"], data["label"], data["label"].flip(0), lam)
    torch.testing.assert_close(loss, expected)


def test_mixup_on_a_1d_recipe_is_refused_by_name():
    tree = tiny_sequence_recipe("seq", {"name": "listops"}, "classification", "tokens", train={"mixup": {}})
    with pytest.raises(RecipeError, match=r"train\.mixup: mixes images of one class each.*got data\.name 'listops'"):
        recipe_from_dict(tree)


def test_mixup_needs_an_even_batch():
    with pytest.raises(RecipeError, match=r"data\.batch_size: must be even under train\.mixup.*got 7"):
        recipe_from_dict(tiny_vit_recipe(train={"mixup": {}}, data={"batch_size": 7}))
