"""The dataset registry: a dataset registered in a test (one function and its options dataclass, no other edit) is
usable from a recipe dict through training and evaluation; its options are checked with one-line errors that
name `data.options.<key>`; integer `tokens` data trains a 1-D model on the dataset's own vocabulary."""

import json
from dataclasses import dataclass, field

import pytest
import torch
from helpers import reset_accelerate
from torch.utils.data import Dataset

from zoo.config import RecipeError, recipe_from_dict
from zoo.data import DataContext, _registry, build_dataset, get_dataset, list_datasets, register_dataset
from zoo.splits import build_split
from zoo.train.loop import Trainer
from zoo.train.parts import model_for


class _Tokens(Dataset):
    """Sequences of ids below `vocab`, of varying length; the label says whether id 1 outnumbers id 2."""

    num_classes = 2

    def __init__(self, split: str, *, length: int, vocab: int, num_samples: int, seed: int):
        generator = torch.Generator().manual_seed(seed * 3 + ("train", "val", "test").index(split))
        self.vocab_size = vocab
        self.items = [torch.randint(0, vocab, (length - i % 4,), generator=generator) for i in range(num_samples)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        tokens = self.items[index]
        label = int((tokens == 1).sum() > (tokens == 2).sum())
        return {"tokens": tokens, "mask": torch.ones(len(tokens), dtype=torch.bool), "label": torch.tensor(label)}


class _Images(Dataset):
    num_classes, in_chans = 3, 1

    def __init__(self, size: int, num_samples: int):
        self.size, self.num_samples = size, num_samples

    def __len__(self):
        return self.num_samples

    def __getitem__(self, index):
        image = torch.zeros(1, self.size, self.size)
        image[0, index % self.size] = 1.0
        return image, index % 3


@pytest.fixture
def toy_datasets(monkeypatch):
    """Registers `toy_tokens` and `toy_images` in a copy of the registry, restored after the test."""
    register_toys(monkeypatch)


def register_toys(monkeypatch: pytest.MonkeyPatch) -> None:
    """`toy_tokens` and `toy_images` registered in a copy of the registry, which `monkeypatch` restores."""
    monkeypatch.setattr(_registry, "_DATASETS", _registry._DATASETS.copy())

    @dataclass(kw_only=True)
    class ToyTokensOptions:
        length: int = field(default=24, metadata={"min": 4})
        vocab: int = field(default=7, metadata={"min": 3})

    @register_dataset("toy_tokens", options=ToyTokensOptions, kind="tokens", tasks=("classification",))
    def build_toy_tokens(options: ToyTokensOptions, context: DataContext) -> Dataset:
        """Toy token sequences."""
        return _Tokens(
            context.split,
            length=options.length,
            vocab=options.vocab,
            num_samples=context.num_samples,
            seed=context.seed,
        )

    @dataclass(kw_only=True)
    class ToyImagesOptions:
        pass

    @register_dataset("toy_images", options=ToyImagesOptions, kind="image", tasks=("classification",))
    def build_toy_images(options: ToyImagesOptions, context: DataContext) -> Dataset:
        return _Images(context.img_size, context.num_samples)


SMALL = {
    "seed": 1,
    "optim": {"lr": 1e-3},
    "schedule": {"warmup_steps": 1},
    "train": {"epochs": 1, "max_steps": 2, "mixed_precision": "no", "log_every_steps": 1},
}
TOKENS = {
    "name": "toy",
    **SMALL,
    "model": {
        "kind": "sequence",
        "embed_dim": 16,
        "depth": 1,
        "num_heads": 2,
        "attention": {"name": "linear"},
        "sequence": {"input": "tokens", "pool": "mean"},
    },
    "data": {
        "name": "toy_tokens",
        "options": {"length": 20},
        "train_samples": 16,
        "val_samples": 8,
        "batch_size": 4,
        "num_workers": 0,
    },
}
IMAGES = {
    "name": "toy",
    **SMALL,
    "model": {
        "name": "vit_tiny_patch16_224",
        "img_size": 8,
        "patch_size": 4,
        "embed_dim": 16,
        "depth": 1,
        "num_heads": 2,
    },
    "data": {"name": "toy_images", "train_samples": 12, "val_samples": 6, "batch_size": 4, "num_workers": 0},
}


@pytest.mark.parametrize("recipe", [TOKENS, IMAGES], ids=["tokens", "image"])
def test_a_registered_dataset_trains_from_a_recipe(toy_datasets, tmp_path, recipe):
    reset_accelerate()
    trainer = Trainer(recipe_from_dict(recipe), tmp_path / "run")
    result = trainer.fit()
    reset_accelerate()
    assert result["step"] == 2 and result["val_samples"] == recipe["data"]["val_samples"]
    assert 0 <= result["val_top1"] <= 1 and result["val_loss"] > 0
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["steps"] == 2


def test_tokens_size_the_embedding_from_the_vocabulary_and_padding_is_masked(toy_datasets):
    recipe = recipe_from_dict({**TOKENS, "data": {**TOKENS["data"], "options": {"vocab": 11}}})
    train_set = build_split(recipe, "train")
    assert isinstance(train_set, _Tokens) and train_set.vocab_size == 11
    model = model_for(recipe, train_set).eval()
    assert model.embed.weight.shape == (11, 16) and model.input == "tokens"
    tokens = torch.randint(0, 11, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 13:] = False
    changed = tokens.clone()
    changed[1, 13:] = (tokens[1, 13:] + 5) % 11
    torch.testing.assert_close(model(changed, mask), model(tokens, mask))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"lenght": 9}, "data.options.lenght: unknown key (did you mean 'length'?); allowed: length, vocab"),
        ({"length": "long"}, "data.options.length: expected an integer, got 'long'"),
        ({"length": 2}, "data.options.length: expected an integer >= 4, got 2"),
        ({"vocab": 3.5}, "data.options.vocab: expected an integer, got 3.5"),
    ],
)
def test_options_are_checked_against_the_dataclass(toy_datasets, options, message):
    with pytest.raises(RecipeError) as info:
        recipe_from_dict({**TOKENS, "data": {**TOKENS["data"], "options": options}})
    assert str(info.value) == f"<dict>: {message}"


def test_the_recipe_checks_kind_and_task_against_the_registration(toy_datasets):
    with pytest.raises(
        RecipeError,
        match=r"model\.sequence\.input: data\.name 'toy_tokens' holds tokens data: "
        r"takes 'tokens', got 'dna'$",
    ):
        recipe_from_dict({**TOKENS, "model": {**TOKENS["model"], "sequence": {}}})
    with pytest.raises(RecipeError, match=r"model\.kind: data\.name 'toy_images' holds image data: needs 'vit'"):
        recipe_from_dict({**IMAGES, "model": {"kind": "sequence"}})
    with pytest.raises(RecipeError, match=r"task: data\.name 'toy_tokens' serves 'classification'; task 'causal_lm' "):
        recipe_from_dict({**TOKENS, "task": "causal_lm", "metrics": ["top1"]})


def test_registration_rules(toy_datasets):
    assert list_datasets()[-2:] == ["toy_tokens", "toy_images"]
    spec = get_dataset("toy_tokens")
    assert (spec.kind, spec.tasks, spec.root, spec.doc) == (
        "tokens",
        ("classification",),
        "none",
        "Toy token sequences.",
    )
    with pytest.raises(ValueError, match="dataset 'toy_tokens' is already registered"):
        register_dataset("toy_tokens", options=spec.options, kind="tokens", tasks=("classification",))(spec.build)
    with pytest.raises(ValueError, match="kind 'text' is not one of image, dna, series, tokens"):
        register_dataset("toy_text", options=spec.options, kind="text", tasks=("classification",))
    with pytest.raises(TypeError, match="options must be a dataclass"):
        register_dataset("toy_text", options=dict, kind="tokens", tasks=("classification",))
    with pytest.raises(ValueError, match="reads no files of yours; leave data.root out, got '/x'"):
        build_dataset("toy_tokens", DataContext("train", is_training=True, root="/x"))


def test_registrations_in_a_test_do_not_outlive_it():
    # in one test, whatever ran before it and on whichever worker: registered, then undone as a fixture's teardown
    before = list_datasets()
    with pytest.MonkeyPatch.context() as patch:
        register_toys(patch)
        assert list_datasets() == [*before, "toy_tokens", "toy_images"]
    assert list_datasets() == before and "toy_tokens" not in before
