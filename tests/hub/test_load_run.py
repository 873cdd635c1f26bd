"""A run is a model: tools/train.py records what rebuilds it (model.json beside recipe.yaml and in every checkpoint)
and zoo.load_model reads a run directory, a checkpoint folder or its weights without the training data (tiny ViT
and 1-D runs trained in tmp_path)."""

import json
import shutil
from pathlib import Path

import pytest
import timm
import torch
import yaml
from helpers import reset_accelerate, run_tool_here, shrink_1d, tiny_vit_recipe
from safetensors.torch import load_model as load_safetensors
from timm.data import resolve_data_config

import zoo
from zoo import splits
from zoo.config import load_recipe
from zoo.hub.checkpoints import CheckpointError
from zoo.kinds import build_model, get_model_kind, sizes_of
from zoo.splits import build_split
from zoo.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("no_network")

VIT = tiny_vit_recipe(data={"train_samples": 32})
# Shrinks a shipped 1-D recipe to seconds.
TINY_1D = shrink_1d(max_steps=2)


def train(recipe, run_dir: Path) -> Path:
    reset_accelerate()
    Trainer(recipe, run_dir).fit()
    reset_accelerate()
    return run_dir


def vit_recipe(tmp_path: Path, **changes):
    tree = yaml.safe_load(yaml.safe_dump(VIT))
    for key, value in changes.items():
        tree[key] = {**tree[key], **value}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return load_recipe(path)


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("vit")
    return train(vit_recipe(folder), folder / "run")


def reference(run_dir: Path, which: str = "best") -> torch.nn.Module:
    """The run's model as tools/eval.py builds it: sized from the training split, the checkpoint loaded."""
    recipe = load_recipe(run_dir / "recipe.yaml")
    model = build_model(recipe, sizes_of(recipe, build_split(recipe, "train")))
    load_safetensors(model, str(run_dir / "checkpoints" / which / "model.safetensors"))
    return model.eval()


def images(size: int = 32) -> torch.Tensor:
    return torch.rand(3, 1, size, size, generator=torch.Generator().manual_seed(0))


def test_the_run_records_what_rebuilds_its_model(vit_run):
    description = json.loads((vit_run / "model.json").read_text())
    assert description["kind"] == "vit" and description["task"] == "classification"
    assert description["label_names"] == [str(d) for d in range(10)]
    assert description["sizes"] == {"num_classes": 10, "in_chans": 1}
    cfg = description["pretrained_cfg"]
    assert cfg["input_size"] == [1, 32, 32] and cfg["mean"] == [0.0] and cfg["std"] == [1.0]
    assert cfg["crop_pct"] == 1.0
    for which in ("best", "last"):
        folder = vit_run / "checkpoints" / which
        assert (folder / "model.json").read_text() == (vit_run / "model.json").read_text()
        assert (folder / "recipe.yaml").read_text() == (vit_run / "recipe.yaml").read_text()
        assert {"model.json", "recipe.yaml"} <= set(json.loads((folder / "manifest.json").read_text())["files"])


def test_load_model_reads_a_run_without_its_training_data(vit_run, monkeypatch):
    expected = reference(vit_run)(images())

    def no_data(*args, **kwargs):
        raise AssertionError("the training data was read")

    monkeypatch.setattr(splits, "build_split", no_data)
    monkeypatch.setattr(splits, "build_dataset", no_data)
    model = zoo.load_model(vit_run)
    assert not model.training
    torch.testing.assert_close(model(images()), expected, rtol=0, atol=0)
    assert model.pretrained_cfg["label_names"] == tuple(str(d) for d in range(10))
    assert model.zoo_run["sizes"]["num_classes"] == 10


def test_timm_resolves_the_runs_own_preprocessing(vit_run):
    config = resolve_data_config(model=zoo.load_model(vit_run))
    assert config["input_size"] == (1, 32, 32) and config["mean"] == (0.0,) and config["std"] == (1.0,)
    assert config["crop_pct"] == 1.0 and config["interpolation"] == "bilinear"


@pytest.mark.parametrize(
    "where", ["checkpoints/best", "checkpoints/last", "checkpoints/best/model.safetensors"], ids=lambda w: w
)
def test_a_checkpoint_folder_or_its_weights_load_alike(vit_run, where):
    which = where.split("/")[1]
    torch.testing.assert_close(zoo.load_model(vit_run / where)(images()), reference(vit_run, which)(images()))


def test_a_checkpoint_copied_out_of_its_run_still_loads(vit_run, tmp_path):
    copy = shutil.copytree(vit_run / "checkpoints" / "best", tmp_path / "elsewhere")
    torch.testing.assert_close(zoo.load_model(copy)(images()), reference(vit_run)(images()))


def test_the_last_checkpoint_is_chosen_by_name(vit_run):
    torch.testing.assert_close(
        zoo.load_model(vit_run, checkpoint="last")(images()), reference(vit_run, "last")(images())
    )
    with pytest.raises(ValueError, match="unknown checkpoint 'middle'.*best, last"):
        zoo.load_model(vit_run, checkpoint="middle")


def test_save_pretrained_of_a_loaded_run_reads_back_in_timm(vit_run, tmp_path):
    model = zoo.load_model(vit_run)
    folder = zoo.save_pretrained(model, tmp_path / "hub")
    config = json.loads((folder / "config.json").read_text())
    assert config["label_names"] == [str(d) for d in range(10)]
    assert config["pretrained_cfg"]["input_size"] == [1, 32, 32] and config["pretrained_cfg"]["mean"] == [0.0]
    again = timm.create_model(
        config["architecture"],
        pretrained=True,
        pretrained_cfg_overlay={"file": str(folder / "model.safetensors")},
        **config["model_args"],
    ).eval()
    torch.testing.assert_close(again(images()), model(images()), rtol=0, atol=0)
    assert resolve_data_config(model=zoo.load_model(folder))["input_size"] == (1, 32, 32)


def test_overrides_rebuild_a_run_at_another_size(vit_run):
    model = zoo.load_model(vit_run, img_size=64)
    assert tuple(model.patch_embed.img_size) == (64, 64) and model(images(64)).shape == (3, 10)
    assert resolve_data_config(model=model)["input_size"] == (1, 64, 64)
    assert zoo.load_model(vit_run, num_classes=3).pretrained_cfg.get("label_names") is None


def test_a_run_without_model_json_says_what_is_missing(vit_run, tmp_path):
    # every run of tools/train.py writes model.json: without it the model's sizes are unknown
    bare = shutil.copytree(vit_run, tmp_path / "bare")
    for path in [*bare.rglob("model.json"), *bare.rglob("manifest.json")]:
        path.unlink()
    with pytest.raises(FileNotFoundError, match=r"best/model\.json does not exist: is .*best a run of tools/train.py"):
        zoo.load_model(bare / "checkpoints" / "best" / "model.safetensors")


def test_run_directories_that_cannot_load_say_why(vit_run, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "recipe.yaml").write_text((vit_run / "recipe.yaml").read_text())
    with pytest.raises(FileNotFoundError, match="run directory without a 'best' checkpoint"):
        zoo.load_model(empty)
    broken = shutil.copytree(vit_run, tmp_path / "broken")
    (broken / "checkpoints" / "best" / "model.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"checkpoints/best is damaged: model.json has 9 bytes"):
        zoo.load_model(broken)
    (broken / "checkpoints" / "best" / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"checkpoints/best/model.json: not valid JSON"):
        zoo.load_model(broken)
    other = shutil.copytree(vit_run, tmp_path / "other")
    (other / "checkpoints" / "last" / "manifest.json").unlink()
    description = json.loads((other / "model.json").read_text())
    description["sizes"]["num_classes"] = 3
    (other / "checkpoints" / "last" / "model.json").write_text(json.dumps(description))
    with pytest.raises(zoo.WeightsError, match=r"last/model.safetensors: weights do not fit .*class"):
        zoo.load_model(other, checkpoint="last")
    with pytest.raises(ValueError, match="no config.json and no recipe.yaml"):
        zoo.load_model(tmp_path)


def test_the_cli_reports_a_run_that_cannot_load_in_one_line(tmp_path):
    # in this process: README's segmentation block launches tools/predict.py as a user does (tests/test_docs.py)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(VIT))
    image = tmp_path / "x.png"
    image.write_bytes(b"")
    proc = run_tool_here("tools/predict.py", tmp_path, image)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "without a 'best' checkpoint" in proc.stderr


def test_a_sequence_run_loads_with_its_sizes_and_inputs(tmp_path, monkeypatch):
    from zoo.data import _debian as debian

    if not debian.is_available("r-cran-mlbench"):
        pytest.skip("Debian data package r-cran-mlbench missing (make data-deps)")
    run_dir = train(load_recipe(ROOT / "recipes" / "splice_quick.yaml", TINY_1D), tmp_path / "splice")
    description = json.loads((run_dir / "model.json").read_text())
    assert description["input"] == "dna" and description["sizes"]["seq_len"] == 60
    assert description["label_names"] == ["ei", "ie", "n"]
    assert description["inputs"]["tokenizer"] == {"k": 1, "overlapping": True, "add_cls": False}
    tokens = torch.randint(3, 7, (2, 60))
    expected = reference(run_dir)(tokens, None)
    monkeypatch.setattr(splits, "build_split", None)
    model = zoo.load_model(run_dir)
    torch.testing.assert_close(model(tokens, None), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="construction overrides rebuild ViT models"):
        zoo.load_model(run_dir, img_size=64)


def test_an_image_folder_run_records_its_classes_and_timms_eval_transform(tmp_path):
    from PIL import Image

    from zoo.hub.runs import describe_model

    for split in ("train", "val"):
        for name in ("cat", "dog"):
            (tmp_path / split / name).mkdir(parents=True)
            Image.new("RGB", (40, 30), (10, 20, 30)).save(tmp_path / split / name / "a.png")
    recipe = vit_recipe(tmp_path, data={"name": "folder", "root": str(tmp_path), "options": {}})
    kind = get_model_kind(recipe.model.kind)
    train_set = build_split(recipe, "train")
    description = describe_model(recipe, train_set, kind.task(recipe), sizes_of(recipe, train_set))
    assert description["label_names"] == ["cat", "dog"] and description["sizes"] == {"num_classes": 2, "in_chans": 3}
    cfg = description["pretrained_cfg"]
    assert cfg["input_size"] == [3, 32, 32] and cfg["crop_pct"] == 0.875 and cfg["mean"] == [0.485, 0.456, 0.406]


def test_one_route_resolves_a_run_a_checkpoint_and_its_weights(vit_run):
    from zoo.hub._run_weights import resolve_run

    best = vit_run / "checkpoints" / "best"
    by_run, by_folder, by_file = (resolve_run(source) for source in (vit_run, best, best / "model.safetensors"))
    # the checkpoint's own recipe.yaml and model.json rebuild it; tools/eval.py reads the run's (files_from="run")
    assert by_run.home == by_folder.home == by_file.home == best
    assert resolve_run(vit_run, files_from="run").home == vit_run
    assert by_run.weights == by_folder.weights == by_file.weights == best / "model.safetensors"
    assert by_run.manifest is not None and by_run.manifest == by_folder.manifest
    assert by_run.description == json.loads((vit_run / "model.json").read_text())
    assert by_run.recipe.model == by_run.recipe.model.without_pretrained()
    assert resolve_run(vit_run, "last").folder == vit_run / "checkpoints" / "last"
    with pytest.raises(ValueError, match=r"unknown checkpoint 'bset' \(did you mean 'best'\?\); known: best, last"):
        resolve_run(vit_run, "bset")
    with pytest.raises(FileNotFoundError, match=r"checkpoint weights .*elsewhere\.safetensors do not exist"):
        resolve_run(vit_run, str(vit_run / "elsewhere.safetensors"))


def test_evaluating_a_run_reads_the_evaluated_split_and_the_training_labels(vit_run, monkeypatch):
    from zoo import evaluate as evaluation

    read = []

    def only_recorded(recipe, split):
        read.append(split)
        return build_split(recipe, split)

    monkeypatch.setattr(evaluation, "build_split", only_recorded)
    result = evaluation.evaluate(vit_run, split="val")
    # the model is sized by model.json alone; the training split is read for its labels only (the majority class)
    assert read == ["val", "train"] and result["metrics"]["samples"] == 16
    recipe = load_recipe(vit_run / "recipe.yaml")
    train_labels = [label for _, label in build_split(recipe, "train")]
    val_labels = [label for _, label in build_split(recipe, "val")]
    majority = max(set(train_labels), key=lambda c: (train_labels.count(c), -c))
    assert result["baselines"] == {
        "majority_class": {"top1": pytest.approx(val_labels.count(majority) / len(val_labels))},
        "chance": {"top1": pytest.approx(0.1)},
    }


def test_model_sizes_read_once_and_written_as_model_json_holds_them():
    from zoo.data._sizes import ModelSizes

    class Split(torch.utils.data.Dataset):
        num_classes, in_chans, columns = 3, 2, ("a", "b")

        def __len__(self):
            return 2

        def __getitem__(self, index):
            return {"values": torch.zeros(5 + 4 * index, 2)}

    sizes = ModelSizes.of(Split(), length=True)
    assert sizes == ModelSizes(num_classes=3, in_chans=2, columns=("a", "b"), seq_len=9)
    assert sizes.to_json() == {"num_classes": 3, "in_chans": 2, "columns": ["a", "b"], "seq_len": 9}
    assert ModelSizes.from_json(sizes.to_json()) == sizes
    assert ModelSizes.of(Split(), length=False).seq_len is None
    with pytest.raises(ValueError, match=r"unknown model sizes \['width'\]; known: num_classes, "):
        ModelSizes.from_json({"width": 3})
