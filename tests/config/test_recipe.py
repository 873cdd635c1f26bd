"""Recipe loading: schema checks, error messages, bases, overrides and round trips."""

import re
from pathlib import Path

import pytest

from zoo.config import (
    AttentionConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    Recipe,
    RecipeError,
    ScheduleConfig,
    SequenceConfig,
    TrainConfig,
    load_recipe,
    recipe_from_dict,
    recipe_to_dict,
    save_recipe,
)
from zoo.data import list_datasets
from zoo.kinds import ViTOptions


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def error_of(data: dict) -> str:
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data)
    message = str(info.value)
    assert "\n" not in message
    return message


# Defaults and types


def test_defaults():
    recipe = recipe_from_dict({"name": "x"})
    assert recipe == Recipe(name="x")
    assert recipe.model == ModelConfig()
    assert recipe.model.attention == AttentionConfig(name="softmax", options={})
    assert recipe.model.img_size == 224 and recipe.model.in_chans is None
    assert recipe.data == DataConfig()
    assert recipe.data.dataset_options().canvas_size == 1024 and recipe.data.batch_size == 64
    assert recipe.optim == OptimConfig(name="adamw", lr=1e-3, weight_decay=0.05, betas=[0.9, 0.999])
    assert recipe.schedule == ScheduleConfig()
    assert recipe.train == TrainConfig()
    assert recipe.train.clip_grad == 1.0 and recipe.train.mixed_precision == "auto"
    assert recipe.metrics == ["top1", "top5", "f1"]
    assert recipe.output_dir is None and recipe.description == "" and recipe.seed == 0


def test_default_lists_are_not_shared():
    first, second = recipe_from_dict({"name": "a"}), recipe_from_dict({"name": "b"})
    first.metrics.append("confusion")
    first.optim.betas[0] = 0.5
    assert second.metrics == ["top1", "top5", "f1"] and second.optim.betas == [0.9, 0.999]


def test_int_accepted_for_float_and_converted():
    recipe = recipe_from_dict({"name": "x", "optim": {"lr": 1, "betas": [0, 0]}, "model": {"mlp_ratio": 4}})
    assert recipe.optim.lr == 1.0 and type(recipe.optim.lr) is float
    assert all(type(beta) is float for beta in recipe.optim.betas)
    assert type(recipe.model.mlp_ratio) is float


def test_string_rejected_for_int():
    message = error_of({"name": "x", "train": {"epochs": "3"}})
    assert message == "<dict>: train.epochs: expected an integer, got '3'"
    message = error_of({"name": "x", "data": {"batch_size": "sixty"}})
    assert message == "<dict>: data.batch_size: expected an integer, got 'sixty'"


@pytest.mark.parametrize("value", [2.0, True])
def test_float_and_bool_rejected_for_int(value):
    assert f"train.epochs: expected an integer, got {value!r}" in error_of({"name": "x", "train": {"epochs": value}})


@pytest.mark.parametrize("value", [1, 0, "true", "yes"])
def test_non_bool_rejected_for_bool(value):
    message = error_of({"name": "x", "model": {"pretrained": value}})
    assert message == f"<dict>: model.pretrained: expected true or false, got {value!r}"


def test_bool_rejected_for_float_and_str():
    assert "optim.lr: expected a number, got True" in error_of({"name": "x", "optim": {"lr": True}})
    assert "model.name: expected a string, got 3" in error_of({"name": "x", "model": {"name": 3}})


def test_optional_fields():
    recipe = recipe_from_dict({"name": "x", "train": {"clip_grad": None, "max_steps": 50}, "model": {"depth": 2}})
    assert recipe.train.clip_grad is None and recipe.train.max_steps == 50 and recipe.model.depth == 2
    message = error_of({"name": "x", "model": {"patch_size": "16"}})
    assert message == "<dict>: model.patch_size: expected an integer or null, got '16'"


def test_required_name():
    assert error_of({"seed": 1}) == "<dict>: name: missing required key"


def test_source_is_named():
    with pytest.raises(RecipeError, match=r"^cli: train\.epochs: "):
        recipe_from_dict({"name": "x", "train": {"epochs": 0}}, source="cli")


@pytest.mark.parametrize("data", [[1, 2], "name: x", None])
def test_top_level_must_be_mapping(data):
    with pytest.raises(RecipeError, match="expected a mapping at the top level"):
        recipe_from_dict(data)


def test_section_must_be_mapping():
    assert error_of({"name": "x", "train": [1]}) == "<dict>: train: expected a mapping, got [1]"


def test_empty_section_means_defaults():
    assert recipe_from_dict({"name": "x", "train": None}).train == TrainConfig()


# Unknown keys, ranges and choices


def test_unknown_key_did_you_mean():
    message = error_of({"name": "x", "train": {"epocs": 3}})
    assert message.startswith("<dict>: train.epocs: unknown key (did you mean 'epochs'?); allowed: epochs, max_steps, ")


def test_unknown_key_nested_depth():
    message = error_of({"name": "x", "model": {"attention": {"nmae": "performer"}}})
    assert message == "<dict>: model.attention.nmae: unknown key (did you mean 'name'?); allowed: name, options"


def test_unknown_key_without_close_match_lists_allowed():
    message = error_of({"name": "x", "zzzz": 1})
    assert "zzzz: unknown key; allowed: name, description, seed, model," in message


def test_unknown_key_reported_before_missing_name():
    assert "nmae: unknown key (did you mean 'name'?)" in error_of({"nmae": "x"})


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        ("model", "img_size", -3, "expected an integer >= 8, got -3"),
        ("model", "drop_rate", 1.0, "expected a number in [0, 1), got 1.0"),
        ("model", "drop_path_rate", -0.1, "expected a number in [0, 1), got -0.1"),
        ("model", "mlp_ratio", 0, "expected a number > 0 or null, got 0"),
        ("model", "num_heads", 0, "expected an integer >= 1 or null, got 0"),
        ("data.options", "canvas_size", 15, "expected an integer >= 16, got 15"),
        ("data.options", "num_other", -1, "expected an integer >= 0, got -1"),
        ("optim", "lr", 0.0, "expected a number > 0, got 0.0"),
        ("optim", "lr", float("nan"), "expected a number > 0, got nan"),
        ("optim", "layer_decay", 1.5, "expected a number in (0, 1] or null, got 1.5"),
        ("optim", "layer_decay", 0, "expected a number in (0, 1] or null, got 0"),
        ("schedule", "warmup_steps", -1, "expected an integer >= 0, got -1"),
        ("train", "clip_grad", 0.0, "expected a number > 0 or null, got 0.0"),
        ("train", "label_smoothing", 1, "expected a number in [0, 1), got 1"),
    ],
)
def test_out_of_range(section, key, value, expected):
    outer, _, inner = section.partition(".")
    tree = {outer: {inner: {key: value}}} if inner else {section: {key: value}}
    assert error_of({"name": "x", **tree}) == f"<dict>: {section}.{key}: {expected}"


def test_range_bounds_are_inclusive_where_allowed():
    recipe = recipe_from_dict(
        {
            "name": "x",
            "model": {"img_size": 8, "patch_size": 8, "drop_rate": 0},
            "optim": {"layer_decay": 1},
            "data": {"options": {"num_other": 0}},
        }
    )
    assert recipe.model.img_size == 8 and recipe.optim.layer_decay == 1.0


def test_betas():
    assert error_of({"name": "x", "optim": {"betas": [0.9]}}) == (
        "<dict>: optim.betas: expected a list of length 2, got [0.9]"
    )
    assert error_of({"name": "x", "optim": {"betas": [0.9, 1.0]}}) == (
        "<dict>: optim.betas[1]: expected a number in [0, 1), got 1.0"
    )
    assert recipe_from_dict({"name": "x", "optim": {"betas": (0.8, 0.99)}}).optim.betas == [0.8, 0.99]


def test_literal_choices():
    message = error_of({"name": "x", "train": {"mixed_precision": "bf32"}})
    assert message == "<dict>: train.mixed_precision: expected one of 'auto', 'no', 'bf16', 'fp16', got 'bf32'"
    # every registered dataset, in registration order: a new dataset needs no edit here
    known = ", ".join(repr(name) for name in list_datasets())
    assert (
        error_of({"name": "x", "data": {"name": "mnist"}}) == f"<dict>: data.name: expected one of {known}, got 'mnist'"
    )
    assert "schedule.name: expected one of" in error_of({"name": "x", "schedule": {"name": "linear"}})
    assert recipe_from_dict({"name": "x", "train": {"mixed_precision": "no"}}).train.mixed_precision == "no"


def test_metrics_entries():
    assert recipe_from_dict({"name": "x", "metrics": ["confusion", "top1"]}).metrics == ["confusion", "top1"]
    message = error_of({"name": "x", "metrics": ["top1", "top3"]})
    assert message == (
        "<dict>: metrics[1]: expected one of 'top1', 'top5', 'f1', 'confusion', 'mcc', 'auroc', 'miou', 'iou', "
        "'pixel_accuracy', 'mse', 'mae', 'perplexity', got 'top3'"
    )
    assert error_of({"name": "x", "metrics": "top1"}) == "<dict>: metrics: expected a list, got 'top1'"
    assert error_of({"name": "x", "metrics": ["f1", "f1"]}) == "<dict>: metrics[1]: duplicate entry 'f1'"


def test_free_form_options():
    options = {"window": 64, "global_indices": [0, 5]}
    recipe = recipe_from_dict({"name": "x", "model": {"attention": {"name": "longformer", "options": options}}})
    assert recipe.model.attention.options == options
    options["global_indices"].append(3)
    assert recipe.model.attention.options["global_indices"] == [0, 5]
    message = error_of({"name": "x", "model": {"timm_kwargs": {1: "a"}}})
    assert message == "<dict>: model.timm_kwargs: expected a string as key, got 1"
    message = error_of({"name": "x", "model": {"timm_kwargs": {"act_layer": object}}})
    assert message.startswith("<dict>: model.timm_kwargs.act_layer: expected plain YAML data")


def test_attention_name_and_options_are_checked_against_the_variant():
    def attention_error(name, **options):
        return error_of({"name": "x", "model": {"attention": {"name": name, "options": options}}})

    assert attention_error("performr").startswith(
        "<dict>: model.attention.name: unknown attention 'performr' (did you mean 'performer', 'reformer'?); known: "
    )
    assert attention_error("performer", nb_featres=4).startswith(
        "<dict>: model.attention.options.nb_featres: unknown option of 'performer' (did you mean 'nb_features'?); "
        "allowed: nb_features, kernel,"
    )
    assert attention_error("performer", nb_features="abc") == (
        "<dict>: model.attention.options.nb_features: expected an integer, got 'abc'"
    )
    assert attention_error("performer", kernel="exp") == (
        "<dict>: model.attention.options.kernel: expected one of 'softmax', 'relu', got 'exp'"
    )
    assert attention_error("nystrom", conv_kernel_size=1.5) == (
        "<dict>: model.attention.options.conv_kernel_size: expected an integer or null, got 1.5"
    )
    options = {"eps": 0, "reference": True, "projection": "hadamard"}
    recipe = recipe_from_dict({"name": "x", "model": {"attention": {"name": "performer", "options": options}}})
    assert recipe.model.attention.options == options


def test_cross_field_checks():
    message = error_of({"name": "x", "data": {"name": "folder"}})
    assert message == "<dict>: data.root: required when data.name is 'folder', got null"
    assert recipe_from_dict({"name": "x", "data": {"name": "folder", "root": "/data"}}).data.root == "/data"
    assert "model.num_heads: must divide embed_dim 100, got 3" in error_of(
        {"name": "x", "model": {"embed_dim": 100, "num_heads": 3}}
    )
    assert "data.options.digit_size: must be <= canvas_size 16, got 28" in error_of(
        {"name": "x", "data": {"options": {"canvas_size": 16}}}
    )


# Files, bases and overrides


def test_load_file_name_defaults_to_stem(tmp_path):
    path = write(tmp_path / "vit_tiny.yaml", "train:\n  epochs: 3\noptim:\n  lr: 3e-4\n")
    recipe = load_recipe(path)
    assert recipe.name == "vit_tiny" and recipe.train.epochs == 3
    assert recipe.optim.lr == pytest.approx(3e-4)
    assert load_recipe(write(tmp_path / "named.yaml", "name: other\n")).name == "other"


def test_yaml12_scalars(tmp_path):
    path = write(tmp_path / "r.yaml", "train: {mixed_precision: no}\nmodel: {pretrained: true, drop_rate: .5}\n")
    recipe = load_recipe(path)
    assert recipe.train.mixed_precision == "no" and recipe.model.pretrained is True and recipe.model.drop_rate == 0.5
    with pytest.raises(RecipeError, match=r"model\.pretrained: expected true or false, got 'yes'"):
        load_recipe(write(tmp_path / "s.yaml", "model: {pretrained: yes}\n"))


def test_error_names_the_file(tmp_path):
    path = write(tmp_path / "x.yaml", "train:\n  epocs: 3\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"{path}: train.epocs: unknown key (did you mean 'epochs'?); allowed: ")


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(RecipeError, match=f"^{re.escape(str(path))}: file not found$"):
        load_recipe(path)


def test_bad_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.yaml", "name: x\ntrain:\n  epochs: [3\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line ") and "invalid YAML" in message and "\n" not in message
    path = write(tmp_path / "bad2.yaml", "name: x\ntrain: {epochs: 3}\n  seed: 1\n")
    with pytest.raises(RecipeError, match=r"bad2\.yaml: line 3, column \d+: invalid YAML"):
        load_recipe(path)


def test_duplicate_yaml_key(tmp_path):
    path = write(tmp_path / "dup.yaml", "train:\n  epochs: 3\ntrain:\n  seed: 1\n")
    with pytest.raises(RecipeError, match=r"dup\.yaml: line 3, column 1: invalid YAML: duplicate key 'train'"):
        load_recipe(path)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "3\n"])
def test_top_level_not_mapping_in_file(tmp_path, text):
    with pytest.raises(RecipeError, match="expected a mapping at the top level"):
        load_recipe(write(tmp_path / "r.yaml", text))


def test_empty_file_is_an_error_of_its_own(tmp_path):
    # an empty file is more likely a file cut short or the wrong path than a wish for every default
    for text in ("", "# only a comment\n"):
        with pytest.raises(RecipeError, match=r"empty\.yaml: empty recipe"):
            load_recipe(write(tmp_path / "empty.yaml", text))


@pytest.fixture
def inherited(tmp_path):
    write(
        tmp_path / "parts" / "root.yaml",
        "name: root\ndescription: shared\nmetrics: [top1, top5, f1, confusion]\n"
        "model:\n  depth: 4\n  attention:\n    name: performer\n    options: {nb_features: 32, redraw_interval: 100}\n"
        "optim:\n  betas: [0.8, 0.9]\n",
    )
    write(
        tmp_path / "parts" / "vit.yaml",
        "base: root.yaml\nmodel:\n  embed_dim: 192\n  attention:\n    options: {nb_features: 64}\ntrain: {epochs: 5}\n",
    )
    return write(
        tmp_path / "exp" / "child.yaml",
        "base: ../parts/vit.yaml\nmetrics: [top1]\noptim:\n  betas: [0.9, 0.95]\nmodel:\n  depth: 2\n",
    )


def test_base_inheritance(inherited):
    recipe = load_recipe(inherited)
    # the name comes from the file that is loaded, not from a base
    assert recipe.name == "child" and recipe.description == "shared"
    # lists are replaced
    assert recipe.metrics == ["top1"] and recipe.optim.betas == [0.9, 0.95]
    # mappings merge at every depth
    assert recipe.model.depth == 2 and recipe.model.embed_dim == 192
    assert recipe.model.attention == AttentionConfig(
        name="performer", options={"nb_features": 64, "redraw_interval": 100}
    )
    assert recipe.train.epochs == 5


def test_base_list_in_order(tmp_path):
    write(tmp_path / "a.yaml", "train: {epochs: 1, max_steps: 7}\n")
    write(tmp_path / "b.yaml", "train: {epochs: 2}\n")
    path = write(tmp_path / "r.yaml", "base: [a.yaml, b.yaml]\nseed: 3\n")
    recipe = load_recipe(path)
    assert (recipe.train.epochs, recipe.train.max_steps, recipe.seed) == (2, 7, 3)


def test_empty_section_keeps_base(tmp_path):
    write(tmp_path / "a.yaml", "model: {depth: 3}\n")
    assert load_recipe(write(tmp_path / "r.yaml", "base: a.yaml\nmodel:\n")).model.depth == 3


def test_error_in_base_names_the_recipe_and_the_base(inherited):
    base = inherited.parent.parent / "parts" / "vit.yaml"
    write(base, "base: root.yaml\ntrain: {epochs: 0}\n")
    expected = r"child\.yaml: train\.epochs: expected an integer >= 1, got 0 \(set in its base .*parts/vit\.yaml\)"
    with pytest.raises(RecipeError, match=expected):
        load_recipe(inherited)


def test_missing_base(tmp_path):
    path = write(tmp_path / "r.yaml", "base: parts/none.yaml\n")
    with pytest.raises(RecipeError, match=r"r\.yaml: base: file not found: .*parts/none\.yaml"):
        load_recipe(path)


def test_bad_base_value(tmp_path):
    with pytest.raises(RecipeError, match=r"r\.yaml: base: expected a path or a list of paths, got 3"):
        load_recipe(write(tmp_path / "r.yaml", "base: 3\n"))


def test_base_cycle(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: c.yaml\n")
    write(tmp_path / "c.yaml", "base: a.yaml\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "a.yaml")
    message = str(info.value)
    assert "c.yaml: base: cycle of bases: " in message
    assert re.search(r"a\.yaml -> .*b\.yaml -> .*c\.yaml -> .*a\.yaml$", message)


def test_self_base_is_a_cycle(tmp_path):
    with pytest.raises(RecipeError, match="cycle of bases"):
        load_recipe(write(tmp_path / "a.yaml", "base: ./a.yaml\n"))


def test_shared_base_is_not_a_cycle(tmp_path):
    write(tmp_path / "common.yaml", "seed: 5\n")
    write(tmp_path / "x.yaml", "base: common.yaml\n")
    write(tmp_path / "y.yaml", "base: common.yaml\n")
    assert load_recipe(write(tmp_path / "r.yaml", "base: [x.yaml, y.yaml]\n")).seed == 5


def test_overrides(inherited):
    recipe = load_recipe(
        inherited,
        [
            "train.epochs=3",
            "model.attention.options.nb_features=128",
            "model.attention.options.projection=hadamard",
            "optim.lr=1e-4",
            "train.mixed_precision=no",
            "metrics=[top5, f1]",
            "name=renamed",
            "train.max_steps=",
        ],
    )
    assert recipe.train.epochs == 3 and recipe.train.max_steps is None
    options = {"nb_features": 128, "redraw_interval": 100, "projection": "hadamard"}
    assert recipe.model.attention == AttentionConfig(name="performer", options=options)
    assert recipe.optim.lr == pytest.approx(1e-4) and recipe.train.mixed_precision == "no"
    assert recipe.metrics == ["top5", "f1"] and recipe.name == "renamed"


def test_override_is_type_checked(inherited):
    with pytest.raises(RecipeError) as info:
        load_recipe(inherited, ["train.epochs=three"])
    assert str(info.value) == "override 'train.epochs=three': train.epochs: expected an integer, got 'three'"
    with pytest.raises(RecipeError, match=r"override 'train\.epochs\.x=1': train\.epochs: expected an integer"):
        load_recipe(inherited, ["train.epochs.x=1"])


def test_override_unknown_key(inherited):
    with pytest.raises(RecipeError) as info:
        load_recipe(inherited, ["train.epocs=3"])
    message = str(info.value)
    assert message.startswith("override 'train.epocs=3': train.epocs: unknown key (did you mean 'epochs'?); allowed: ")
    with pytest.raises(RecipeError, match=r"model\.attenton: unknown key \(did you mean 'attention'\?\)"):
        load_recipe(inherited, ["model.attenton.name=x"])


@pytest.mark.parametrize("item", ["train.epochs", "=3", "train..epochs=3", ".epochs=3"])
def test_malformed_override(inherited, item):
    with pytest.raises(RecipeError, match=r"expected KEY\.PATH=VALUE"):
        load_recipe(inherited, [item])


def test_override_bad_yaml_value(inherited):
    with pytest.raises(RecipeError, match=r"^override 'metrics=\[top1': .*invalid YAML"):
        load_recipe(inherited, ["metrics=[top1"])


# Saving


def test_round_trip(inherited, tmp_path):
    overrides = ["optim.lr=3e-4", "model.attention.options.eps=1e-5", "model.timm_kwargs.qk_norm=true"]
    recipe = load_recipe(inherited, overrides)
    recipe.model.attention.options["kernel"] = "relu"
    recipe.description = "1e5"
    saved = save_recipe(recipe, tmp_path / "run" / "recipe.yaml")
    assert saved.is_file()
    assert "base" not in saved.read_text()
    assert load_recipe(saved) == recipe
    assert recipe_from_dict(recipe_to_dict(recipe)) == recipe


def test_recipe_to_dict_is_plain(inherited):
    data = recipe_to_dict(load_recipe(inherited))
    assert data["model"]["attention"] == {"name": "performer", "options": {"nb_features": 64, "redraw_interval": 100}}
    assert data["train"]["epochs"] == 5 and isinstance(data["metrics"], list)


def test_save_checks_a_changed_recipe(tmp_path):
    recipe = Recipe(name="x")
    recipe.train.epochs = 0
    with pytest.raises(RecipeError, match=r"bad\.yaml: train\.epochs: expected an integer >= 1, got 0"):
        save_recipe(recipe, tmp_path / "bad.yaml")
    assert not (tmp_path / "bad.yaml").exists()


# Tasks, the 1-D model and dataset options


def test_task_kind_and_options_defaults():
    recipe = recipe_from_dict({"name": "x"})
    assert recipe.task == "classification" and recipe.model.kind == "vit" and recipe.data.options == {}
    # a ViT's options are its kind's alone: no model.sequence section beside them
    assert recipe.model.options == ViTOptions() and not hasattr(recipe.model, "sequence")
    sequence = recipe_from_dict({"name": "x", "model": {"kind": "sequence"}, "data": {"name": "genomes"}})
    assert sequence.model.sequence == SequenceConfig() and not hasattr(sequence.model, "img_size")


def test_dataset_options_keep_only_what_is_set():
    forecaster = {"kind": "sequence", "sequence": {"input": "series"}}
    data = {"name": "elecdemand", "options": {"horizon": 192, "targets": ("Demand",)}}
    recipe = recipe_from_dict({"name": "x", "task": "forecast", "metrics": ["mse"], "model": forecaster, "data": data})
    # left-out options keep the dataset's own defaults: nothing is filled in
    assert recipe.data.options == {"horizon": 192, "targets": ["Demand"]}
    data = {"name": "elecdemand", "options": {"targets": "Demand"}}
    message = error_of({"name": "x", "task": "forecast", "model": forecaster, "data": data})
    assert message == "<dict>: data.options.targets: expected a list, got 'Demand'"


def test_options_schema_follows_the_dataset_name():
    message = error_of(
        {"name": "x", "model": {"kind": "sequence"}, "data": {"name": "splice", "options": {"window": 3}}}
    )
    assert message == "<dict>: data.options.window: unknown key; this section takes none"
    message = error_of({"name": "x", "model": {"kind": "sequence"}, "data": {"name": "fasta", "root": "/d"}})
    assert message == "<dict>: data.options.window: missing required key"


def test_metrics_are_checked_per_task():
    base = {"name": "x", "model": {"kind": "sequence"}, "data": {"name": "yeast_coding"}}
    recipe = recipe_from_dict({**base, "task": "token_classification", "metrics": ["f1", "mcc"]})
    assert recipe.metrics == ["f1", "mcc"]
    message = error_of({**base, "task": "token_classification", "metrics": ["f1", "auroc"]})
    assert message == (
        "<dict>: metrics[1]: task 'token_classification' takes one of 'top1', 'f1', 'confusion', 'mcc', got 'auroc'"
    )


def test_score_labelled_is_for_the_tasks_that_take_it_in_eager_runs():
    base = {"name": "x", "model": {"kind": "sequence", "sequence": {"score": "labelled"}}, "data": {"name": "splice"}}
    tokens = {**base, "data": {"name": "yeast_coding"}, "task": "token_classification", "metrics": ["f1"]}
    assert recipe_from_dict(tokens).model.sequence.score == "labelled"
    assert error_of(base) == (
        "<dict>: model.sequence.score: only task 'token_classification', 'causal_token_classification' uses it "
        "(task is 'classification'); leave it at 'all', got 'labelled'"
    )
    assert error_of({**tokens, "train": {"compile": "default"}}) == (
        "<dict>: model.sequence.score: labelled needs train.compile: false (positions vary per batch), got 'default'"
    )


def test_one_d_recipe_round_trip(tmp_path):
    recipe = load_recipe(
        Path(__file__).resolve().parents[2] / "recipes" / "genomes_quick.yaml", ["data.options.window=2048"]
    )
    assert recipe.model.kind == "sequence" and recipe.data.options == {"window": 2048, "rc_prob": 0.5}
    saved = save_recipe(recipe, tmp_path / "recipe.yaml")
    assert load_recipe(saved) == recipe
