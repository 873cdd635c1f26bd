"""Images at their own size and aspect ratio, as NaFlex patch sequences (`model.kind: naflex`): a folder of
mixed-size images (`native_folder`) and MegaMNIST canvases of mixed sizes and shapes (`native_megamnist`).

Each image is kept at its own resolution while its patches fit `data.options.max_tokens` (a token budget a
sample); a larger one is scaled down keeping its aspect ratio (timm's `get_image_size_for_seq`, never upscaled),
then patchified by timm's `patchify_image` in raster order. `resize: square` instead resizes every image to the
largest square grid within the same budget (the baseline native resolution is compared with). A sample is a dict
`{"patches": [n, p*p*c], "patch_coord": [n, 2], "patch_valid": [n], "label"}`; `collate` pads a batch to its
longest sample (timm's `NaFlexCollator` pads to a fixed maximum instead) and `token_batches` groups samples of
similar length into batches of at most `data.options.batch_tokens` tokens (padding included).

What is left out is counted in one warning per split: an image with a side shorter than `min_side` px (a
1-pixel-wide scan is mostly padding) and one whose aspect ratio exceeds `max_aspect` (its short side would fall
below one patch within the budget, or stretch the position table beyond its grid). Grey, palette and 16-bit
images are read as `zoo.data.images.decode.open_image` reads them (8-bit, the model's channels).

Letter legend: n - patches, p - patch side in px, c - channels.
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from PIL import Image
from timm.data.naflex_transforms import get_image_size_for_seq, patchify_image
from torch.utils.data import Dataset, Sampler

from .._interface import IGNORE_INDEX
from .._registry import DataContext, register_dataset
from .decode import open_image
from .folder import _IMG_MODES, ImageFolderDataset
from .mask_folder import MaskFolderDataset, MaskFolderOptions, _header_size
from .megamnist import MegaMNIST, MegaMNISTSegmentation

__all__ = [
    "READING_KEYS",
    "RESIZE_RULES",
    "NativeImages",
    "NativeLoader",
    "TokenBatches",
    "collate_patches",
    "image_of",
    "check_reading",
    "mask_at",
    "native_logits",
    "predict_masks",
    "native_size",
    "read_image",
    "to_patches",
]

_logger = logging.getLogger(__name__)
PATCH_KEYS = ("patches", "patch_coord", "patch_valid")
# what `NativeLoader` reads of a model's description (model.json's or a save_pretrained config.json's `naflex` entry)
READING_KEYS = ("patch_size", "max_tokens", "resize", "mean", "std")
RESIZE_RULES = ("native", "square")


def native_size(height: int, width: int, patch: int, max_tokens: int, resize: str = "native") -> tuple[int, int]:
    """The size `(height, width)` in px an image is patchified at: its own while its ceil(h / p) * ceil(w / p)
    patches fit `max_tokens`, else scaled down keeping its aspect ratio to fit (whole patches); `square`: the
    largest square grid within the budget."""
    if resize == "square":
        side = math.isqrt(max_tokens) * patch
        return side, side
    if math.ceil(height / patch) * math.ceil(width / patch) <= max_tokens:
        return height, width
    _, (new_height, new_width) = get_image_size_for_seq((height, width), patch, max_tokens, max_ratio=1.0)
    return new_height, new_width


def collate_patches(samples: Sequence[dict[str, Any]], labels: bool = True) -> dict[str, torch.Tensor]:
    """Samples of `n_i` patches -> `{"patches": [b, n, p*p*c], "patch_coord": [b, n, 2], "patch_valid": [b, n],
    "label": [b]}` padded to the longest, n = max n_i (padding: zero patches, coordinate (0, 0), invalid);
    `labels=False`: without `label`. Segmentation masks `[H_i, W_i]` are padded to `[b, max H_i, max W_i]` with
    `IGNORE_INDEX` (the corner layout of `zoo.models.naflex.NaFlexSegmentation`'s logits)."""
    n = max(len(sample["patches"]) for sample in samples)
    batch = {}
    for key in PATCH_KEYS:
        batch[key] = torch.stack([F.pad(s[key], (0, 0) * (s[key].dim() - 1) + (0, n - len(s[key]))) for s in samples])
    if labels and torch.is_tensor(samples[0]["label"]) and samples[0]["label"].dim() == 2:
        height, width = (max(s["label"].shape[i] for s in samples) for i in (0, 1))
        batch["label"] = torch.stack([
            F.pad(s["label"], (0, width - s["label"].shape[1], 0, height - s["label"].shape[0]), value=IGNORE_INDEX)
            for s in samples
        ])  # fmt: skip
    elif labels:
        batch["label"] = torch.as_tensor([sample["label"] for sample in samples])
    return batch


def mask_at(mask: torch.Tensor, size: tuple[int, int], patch: int) -> torch.Tensor:
    """An int64 mask `[H, W]` at the `size` its image is patchified at (nearest neighbour, as labels scale), then
    padded with `IGNORE_INDEX` to whole patches (the pixels `patchify_image` pads the image with)."""
    if tuple(mask.shape) != tuple(size):
        mask = F.interpolate(mask[None, None].float(), size=size, mode="nearest-exact")[0, 0].long()
    return F.pad(mask, (0, -size[1] % patch, 0, -size[0] % patch), value=IGNORE_INDEX)


def to_patches(
    image: torch.Tensor, patch: int, max_tokens: int, resize: str, mean: torch.Tensor, std: torch.Tensor
) -> dict[str, torch.Tensor]:
    """A float `[c, h, w]` image in [0, 1] at its `native_size`, normalised (`mean`, `std`: `[c, 1, 1]`) and
    patchified in raster order -> `{"patches": [n, p*p*c], "patch_coord": [n, 2], "patch_valid": [n]}`."""
    size = native_size(*image.shape[-2:], patch, max_tokens, resize)
    if size != tuple(image.shape[-2:]):
        image = F.interpolate(image[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    patches, coord, valid = patchify_image((image - mean) / std, (patch, patch))
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}


def image_of(sample: dict[str, torch.Tensor], in_chans: int) -> torch.Tensor:
    """A sample's image back from its patches (as normalised): `[n, p*p*c]` on its grid -> `[c, rows*p, cols*p]`."""
    rows, cols = (sample["patch_coord"][sample["patch_valid"].bool()].amax(0) + 1).tolist()
    p = math.isqrt(sample["patches"].shape[1] // in_chans)
    return rearrange(sample["patches"][: rows * cols], "(h w) (ph pw c) -> c (h ph) (w pw)", h=rows, ph=p, pw=p)


def predict_masks(model: torch.nn.Module, samples: Sequence[dict[str, Any]]) -> list[tuple[torch.Tensor, ...]]:
    """Each segmentation sample alone through a NaFlex segmentation `model` -> `(image [c, H, W], true mask
    [H, W], predicted mask [H, W])` at its own size (padding to whole patches included, unlabelled)."""
    device = next(model.parameters()).device
    out = []
    model.eval()
    with torch.no_grad():
        for sample in samples:
            inputs = {key: sample[key][None].to(device) for key in PATCH_KEYS}
            predicted = model(inputs)[0].argmax(0).cpu()
            out.append((image_of(sample, model.in_chans), sample["label"], predicted))
    return out


def read_image(path: str, in_chans: int) -> torch.Tensor:
    """An image file as float `[in_chans, h, w]` in [0, 1], decoded by `open_image` (any bit depth, palette,
    alpha)."""
    return _tensor(open_image(path, _IMG_MODES[in_chans]))


def _tensor(image: Image.Image) -> torch.Tensor:
    """An 8-bit PIL image -> float `[c, h, w]` in [0, 1]."""
    tensor = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
    return tensor[None] if tensor.dim() == 2 else tensor.permute(2, 0, 1)


def check_reading(reading: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`reading` (`READING_KEYS`: what `NativeLoader` reads) as a plain dict; a one-line ValueError naming `where`
    and the first entry that is missing or wrong."""
    missing = [key for key in READING_KEYS if key not in reading]
    if missing:
        raise ValueError(f"{where}: the NaFlex reading settings lack {', '.join(missing)} (give {READING_KEYS})")
    for key in ("patch_size", "max_tokens"):
        value = reading[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {key}={value!r} must be an integer >= 1")
    if reading["resize"] not in RESIZE_RULES:
        raise ValueError(f"{where}: resize={reading['resize']!r} must be one of {', '.join(RESIZE_RULES)}")
    for key in ("mean", "std"):
        value = reading[key]
        if not isinstance(value, list) or not value or not all(isinstance(v, (int, float)) for v in value):
            raise ValueError(f"{where}: {key}={value!r} must be a list of numbers, one per channel")
    mean, std = reading["mean"], reading["std"]
    if len(mean) != len(std) or 0 in std:
        raise ValueError(f"{where}: std={std!r} must be non-zero, as many values as mean={mean!r}")
    return {key: reading[key] for key in READING_KEYS}


class NativeLoader:
    """How `zoo.predict` reads an image file for a NaFlex model: as training read it, at its own size within the
    token budget (`description`: `READING_KEYS` of a run's model.json or a save_pretrained config.json, its
    `naflex` entry) -> the sample dict of `to_patches`."""

    def __init__(self, description: dict[str, Any], in_chans: int) -> None:
        self.description, self.in_chans = description, in_chans
        self.mean = torch.tensor(description["mean"], dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(description["std"], dtype=torch.float32)[:, None, None]

    def __call__(self, path: str) -> dict[str, torch.Tensor]:
        """The sample dict, and its `image_size` (the file's `[H, W]`) and `input_size` (the `[h, w]` it is
        patchified at), which `native_logits` reads to give a segmentation at the file's size."""
        d = self.description
        image = read_image(path, self.in_chans)
        sample = to_patches(image, d["patch_size"], d["max_tokens"], d["resize"], self.mean, self.std)
        size = native_size(*image.shape[-2:], d["patch_size"], d["max_tokens"], d["resize"])
        return {**sample, "image_size": torch.tensor(image.shape[-2:]), "input_size": torch.tensor(size)}


def native_logits(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """A NaFlex segmentation batch's logits `[b, k, H, W]` (each image in its corner) -> each image's `[k, H_i,
    W_i]` at its file's size: cropped to the size it was patchified at (`input_size`), then resized bilinearly to
    `image_size` where the token budget had scaled it down."""
    out = []
    for row, (height, width), (file_height, file_width) in zip(
        logits, batch["input_size"].tolist(), batch["image_size"].tolist(), strict=True
    ):
        row = row[:, :height, :width]
        if (height, width) != (file_height, file_width):
            row = F.interpolate(row[None], size=(file_height, file_width), mode="bilinear", align_corners=False)[0]
        out.append(row)
    return out


class TokenBatches(Sampler[list[int]]):
    """Batches of sample indices whose padded size (count x longest) stays within `batch_tokens`, at most
    `max_batch` samples each. Evaluation: in order, greedily packed. Training: shuffled, then sorted by length
    within windows of 50 batches' worth of samples (similar lengths share a batch, little padding), packed, the
    batches shuffled; every epoch has the first epoch's batch count (the Trainer counts on a fixed epoch length): a
    plan with fewer batches splits its largest ones, one with more leaves the surplus out (as `drop_last` does)."""

    def __init__(self, lengths: Sequence[int], batch_tokens: int, max_batch: int, shuffle: bool, seed: int = 0):
        longest = max(lengths)
        if longest > batch_tokens:
            raise ValueError(
                f"data.options.batch_tokens={batch_tokens} is smaller than the longest sample ({longest} patches): "
                f"raise it to at least {longest} or lower data.options.max_tokens"
            )
        self.lengths, self.batch_tokens, self.max_batch = list(lengths), batch_tokens, max_batch
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.count = len(self._plan(0))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _plan(self, epoch: int) -> list[list[int]]:
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng = random.Random(self.seed * 100_003 + epoch)
            rng.shuffle(order)
            window = self.max_batch * 50
            by_length = self.lengths.__getitem__
            order = [i for s in range(0, len(order), window) for i in sorted(order[s : s + window], key=by_length)]
        batches, current, longest = [], [], 0
        for index in order:
            grown = max(longest, self.lengths[index])
            if current and (grown * (len(current) + 1) > self.batch_tokens or len(current) == self.max_batch):
                batches.append(current)
                current, grown = [], self.lengths[index]
            current.append(index)
            longest = grown
        if current:
            batches.append(current)
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch + 1).shuffle(batches)
        return batches

    def _batches(self) -> list[list[int]]:
        batches = self._plan(self.epoch)
        while len(batches) < self.count and max(map(len, batches)) > 1:
            largest = max(range(len(batches)), key=lambda i: len(batches[i]))
            half = len(batches[largest]) // 2
            batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
        return batches[: self.count]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches()
        self.epoch += 1
        return iter(batches)

    def __len__(self) -> int:
        return self.count


class NativeImages(Dataset):
    """A set of `(image, label)` pairs as NaFlex patch sequences (see the module docstring); `sizes[i]` is image
    i's `(height, width)` in px, `read(i)` its float `[c, h, w]` image in [0, 1]."""

    def __init__(
        self,
        *,
        sizes: Sequence[tuple[int, int]],
        patch_size: int,
        max_tokens: int,
        resize: str,
        mean: Sequence[float],
        std: Sequence[float],
        min_side: int,
        max_aspect: float,
        where: str,
    ):
        self.patch_size, self.max_tokens, self.resize = patch_size, max_tokens, resize
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]
        left_out = Counter()
        self.indices = []
        for index, (height, width) in enumerate(sizes):
            if min(height, width) < min_side:
                left_out[f"a side under min_side={min_side} px"] += 1
            elif max(height, width) / min(height, width) > max_aspect:
                left_out[f"an aspect ratio over max_aspect={max_aspect:g}"] += 1
            else:
                self.indices.append(index)
        if left_out:
            reasons = ", ".join(f"{count} with {reason}" for reason, count in sorted(left_out.items()))
            _logger.warning("%s: left out %d of %d images (%s)", where, sum(left_out.values()), len(sizes), reasons)
        # a split with no image at all is refused by the dataset registry, naming the split; here only one whose
        # images were all left out by the checks above
        if sizes and not self.indices:
            raise ValueError(f"{where}: no image is left (see the warning above); lower min_side or raise max_aspect")
        self.sizes = [sizes[i] for i in self.indices]
        self.lengths = [self.tokens_of(*size) for size in self.sizes]

    def tokens_of(self, height: int, width: int) -> int:
        new_height, new_width = native_size(height, width, self.patch_size, self.max_tokens, self.resize)
        return math.ceil(new_height / self.patch_size) * math.ceil(new_width / self.patch_size)

    def read(self, index: int) -> tuple[torch.Tensor, int]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Sample `index`: its patches, and its label (a class, or a mask `[rows * p, cols * p]` at the size the
        image is patchified at, `IGNORE_INDEX` on the pixels padded to whole patches)."""
        image, label = self.read(self.indices[index])
        sample = to_patches(image, self.patch_size, self.max_tokens, self.resize, self.mean, self.std)
        if torch.is_tensor(label) and label.dim() == 2:
            size = native_size(*image.shape[-2:], self.patch_size, self.max_tokens, self.resize)
            label = mask_at(label, size, self.patch_size)
        return {**sample, "label": label}

    collate = staticmethod(collate_patches)

    def batch_sampler(self, batch_tokens: int | None, batch_size: int, train: bool, seed: int) -> Sampler | None:
        """Batches by token budget (`TokenBatches`) where `batch_tokens` is set; None: `batch_size` samples."""
        if batch_tokens is None:
            return None
        return TokenBatches(self.lengths, batch_tokens, batch_size, shuffle=train, seed=seed)


class NativeFolder(NativeImages):
    """Your images at `root/<split>/<class>/*` (listed and checked as `folder` lists them), at native size."""

    def __init__(
        self, root: str, split: str, *, in_chans: int, on_bad_image: str, mean, std, subset=None, **options: Any
    ):
        # the folder's listing, class index, checks and data.<split>_samples; its fixed-size transform is not used
        listing = ImageFolderDataset(
            root, split, img_size=8, is_training=False, in_chans=in_chans, mean=mean, std=std,
            on_bad_image=on_bad_image, subset=subset,
        )  # fmt: skip
        self.samples, self.classes, self.in_chans = listing.samples, listing.classes, in_chans
        self.num_classes = len(self.classes)
        sizes = []
        for path, _ in self.samples:
            with Image.open(path) as image:  # the header only
                sizes.append(image.size[::-1])
        super().__init__(sizes=sizes, mean=listing.mean, std=listing.std, where=f"{root}/{split}", **options)

    def read(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return read_image(path, self.in_chans), label


def _pixel_counts(dataset: NativeImages) -> np.ndarray:
    """Labelled pixels of each class over a segmentation split's masks (at the size the images are read at)."""
    counts = np.zeros(dataset.num_classes, dtype=np.int64)
    for index in range(len(dataset)):
        mask = dataset[index]["label"]
        counts += np.bincount(mask[mask != IGNORE_INDEX].numpy(), minlength=dataset.num_classes)
    return counts


def _one_class_rule(name: str, majority: int, counts: np.ndarray) -> dict[str, dict[str, float]]:
    """Every labelled pixel predicted `majority`: its IoU is the class's share of the labelled pixels, 0 for every
    other class present, so its mIoU (macro over the classes present) is the share over those classes."""
    share = float(counts[majority] / max(counts.sum(), 1))
    present = int((counts > 0).sum()) + int(counts[majority] == 0)
    return {name: {"miou": share / present, "pixel_accuracy": share}}


class NativeMaskFolder(NativeImages):
    """Your images and masks (the `mask_folder` layout, `ROOT/images/a.jpg` + `ROOT/masks/a.png`, listed, split and
    checked as `mask_folder` does), each pair at its image's own size within the budget; the mask's `ignore_value`
    becomes `IGNORE_INDEX`."""

    def __init__(self, root: str, split: str, *, pairs: dict[str, Any], in_chans: int, mean, std, subset=None,
                 **options: Any):  # fmt: skip
        # the pair listing, its checks and data.<split>_samples; its square transform is not used
        self.pairs = MaskFolderDataset(
            root, split, img_size=8, is_training=False, in_chans=in_chans, mean=mean, std=std, subset=subset, **pairs
        )
        self.classes, self.num_classes, self.in_chans = self.pairs.classes, self.pairs.num_classes, in_chans
        sizes = [_header_size(image)[::-1] for image, _ in self.pairs.samples]  # (width, height) -> (height, width)
        super().__init__(sizes=sizes, mean=self.pairs.mean, std=self.pairs.std, where=f"{root}/{split}", **options)

    def baselines(self, train_set: NativeImages | None = None) -> dict[str, dict[str, float]]:
        """The most frequent class of the training split's labelled pixels, predicted for every pixel here."""
        majority = int(_pixel_counts(train_set if train_set is not None else self).argmax())
        return _one_class_rule("most_frequent_class", majority, _pixel_counts(self))

    def read(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = self.pairs._load(index)
        mask = torch.from_numpy(np.asarray(mask, dtype=np.int64))
        return _tensor(image), mask.masked_fill(mask == self.pairs.ignore_value, IGNORE_INDEX)


class NativeMegaMNIST(NativeImages):
    """MegaMNIST canvases of mixed sizes and shapes: canvas i is a square MegaMNIST canvas of a side drawn from
    `sides` (its digits whole, its label theirs), placed at a random offset on a black rectangle whose long side is
    up to `max_stretch` times the square's, along a random axis. Deterministic in (seed, split, index). Normalised
    by mean 0.1 and std 0.3 (about the ink's share of a canvas): a ViT with a linear patch embedding learns faster
    from centred inputs than from black canvases in [0, 1]."""

    num_classes, in_chans, classes = MegaMNIST.num_classes, 1, MegaMNIST.classes

    # the square canvases' generator (MegaMNISTSegmentation for masks) and its extra arguments
    generator: type[MegaMNIST] = MegaMNIST

    def __init__(self, split: str, *, num_samples: int, seed: int, sides: Sequence[int], max_stretch: float,
                 digit_size: int, num_other: int, num_clutter: int, num_target: int = 3,
                 generator_options: dict[str, Any] | None = None, **options: Any):  # fmt: skip
        self.canvases = {
            side: self.generator(split, canvas_size=side, num_samples=num_samples, seed=seed, digit_size=digit_size,
                                 num_target=num_target, num_other=num_other, num_clutter=num_clutter,
                                 **(generator_options or {}))
            for side in sorted(set(sides))
        }  # fmt: skip
        self.split_id = ("train", "val", "test").index(split)
        self.seed, self.sides, self.max_stretch = seed, list(sides), max_stretch
        self.layouts = [self._layout(i) for i in range(num_samples)]
        sizes = [(height, width) for _, height, width, _, _ in self.layouts]
        super().__init__(sizes=sizes, mean=(0.1,), std=(0.3,), where=f"native_megamnist/{split}", **options)

    def _layout(self, index: int) -> tuple[int, int, int, int, int]:
        rng = np.random.default_rng([self.seed, self.split_id, index, 7])
        side = int(rng.choice(self.sides))
        long = int(round(side * rng.uniform(1.0, self.max_stretch)))
        height, width = (long, side) if rng.random() < 0.5 else (side, long)
        return side, height, width, int(rng.integers(height - side + 1)), int(rng.integers(width - side + 1))

    def read(self, index: int) -> tuple[torch.Tensor, int]:
        side, height, width, top, left = self.layouts[index]
        square, label = self.canvases[side][index]
        image = torch.zeros(1, height, width)
        image[:, top : top + side, left : left + side] = square
        return image, label


class NativeMegaMNISTSegmentation(NativeMegaMNIST):
    """`NativeMegaMNIST`'s canvases of mixed sizes and shapes with per-pixel masks at each canvas's own size: the
    square's mask (`MegaMNISTSegmentation`: 0 background, 1 + d on digit d's box or ink, `IGNORE_INDEX` on clutter)
    placed on a background rectangle."""

    generator = MegaMNISTSegmentation
    num_classes, classes = MegaMNISTSegmentation.num_classes, MegaMNISTSegmentation.classes

    def baselines(self, train_set: NativeImages | None = None) -> dict[str, dict[str, float]]:
        """Every labelled pixel predicted background (`megamnist_seg`'s rule), over this split's own pixels."""
        return _one_class_rule("all_background", 0, _pixel_counts(self))

    def read(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        side, height, width, top, left = self.layouts[index]
        square, square_mask = self.canvases[side][index]
        image, mask = torch.zeros(1, height, width), torch.zeros(height, width, dtype=torch.int64)
        image[:, top : top + side, left : left + side] = square
        mask[top : top + side, left : left + side] = square_mask
        return image, mask


@dataclass(kw_only=True)
class NativeOptions:
    """The budget and checks shared by the native-resolution sets."""

    # patch side in px: must equal the model's (model.patch_size)
    patch_size: int = field(default=16, metadata={"min": 1})
    # patches a sample at most; larger images are scaled down keeping their aspect ratio
    max_tokens: int = field(default=256, metadata={"min": 1})
    # padded tokens a batch at most (count x longest); null: data.batch_size samples a batch
    batch_tokens: int | None = field(default=None, metadata={"min": 1})
    # native: each image at its own size within the budget; square: resized to the largest square grid within it
    resize: Literal["native", "square"] = "native"
    # images with a shorter side (px) or a longer aspect ratio are left out, counted in a warning
    min_side: int = field(default=4, metadata={"min": 1})
    max_aspect: float = field(default=16.0, metadata={"min": 1.0})

    def problems(self) -> list[tuple[str, str]]:
        if self.batch_tokens is not None and self.batch_tokens < self.max_tokens:
            return [("batch_tokens", f"must hold one sample of max_tokens={self.max_tokens}, got {self.batch_tokens}")]
        return []


def _shared(options: NativeOptions) -> dict[str, Any]:
    return {
        "patch_size": options.patch_size, "max_tokens": options.max_tokens, "resize": options.resize,
        "min_side": options.min_side, "max_aspect": options.max_aspect,
    }  # fmt: skip


@dataclass(kw_only=True)
class NativeFolderOptions(NativeOptions):
    mean: list[float] | None = None
    std: list[float] | None = None
    on_bad_image: Literal["error", "skip"] = "error"


@register_dataset(
    "native_folder", options=NativeFolderOptions, kind="image", tasks=("classification",), root="required"
)
def build_native_folder(options: NativeFolderOptions, context: DataContext) -> NativeFolder:
    """Your images at data.root (ROOT/<split>/<class>/*), each at its own size within data.options.max_tokens."""
    dataset = NativeFolder(
        context.root, context.split, in_chans=context.in_chans or 3, on_bad_image=options.on_bad_image,
        subset=context.subset,
        mean=options.mean, std=options.std, **_shared(options),
    )  # fmt: skip
    dataset.batch_tokens = options.batch_tokens
    return dataset


@dataclass(kw_only=True)
class NativeMegaMNISTOptions(NativeOptions):
    sides: list[int] = field(default_factory=lambda: [48, 64, 96], metadata={"min": 8})
    max_stretch: float = field(default=2.5, metadata={"min": 1.0})
    digit_size: int = field(default=16, metadata={"min": 4})
    num_target: int = field(default=3, metadata={"min": 1})
    num_other: int = field(default=1, metadata={"min": 0})
    num_clutter: int = field(default=2, metadata={"min": 0})


@register_dataset("native_megamnist", options=NativeMegaMNISTOptions, kind="image", tasks=("classification",))
def build_native_megamnist(options: NativeMegaMNISTOptions, context: DataContext) -> NativeMegaMNIST:
    """MegaMNIST canvases of mixed sizes and aspect ratios, generated (no download), at their own size."""
    return _generated(NativeMegaMNIST, options, context)


def _generated(cls: type, options: NativeMegaMNISTOptions, context: DataContext, **extra) -> NativeMegaMNIST:
    """`cls` (NativeMegaMNIST or its segmentation) with the options both builders share, `extra` beside them."""
    defaults = {"train": 10000, "val": 1000, "test": 1000}
    dataset = cls(
        context.split, num_samples=context.num_samples or defaults[context.split], seed=context.seed,
        sides=options.sides, max_stretch=options.max_stretch, digit_size=options.digit_size,
        num_target=options.num_target, num_other=options.num_other, num_clutter=options.num_clutter,
        **extra, **_shared(options),
    )  # fmt: skip
    dataset.batch_tokens = options.batch_tokens
    return dataset


@dataclass(kw_only=True)
class NativeMegaMNISTSegOptions(NativeMegaMNISTOptions):
    # the pixels a digit owns: its ink's bounding box or its strokes (MegaMNISTSegmentation)
    mask: Literal["box", "ink"] = "box"


@register_dataset("native_megamnist_seg", options=NativeMegaMNISTSegOptions, kind="image", tasks=("segmentation",))
def build_native_megamnist_seg(options: NativeMegaMNISTSegOptions, context: DataContext) -> NativeMegaMNIST:
    """MegaMNIST canvases of mixed sizes and aspect ratios with masks at each canvas's own size, generated."""
    return _generated(NativeMegaMNISTSegmentation, options, context, generator_options={"mask": options.mask})


@dataclass(kw_only=True)
class NativeMaskFolderOptions(MaskFolderOptions, NativeOptions):
    """`mask_folder`'s options and the native budget."""

    def problems(self) -> list[tuple[str, str]]:
        return MaskFolderOptions.problems(self) + NativeOptions.problems(self)


@register_dataset(
    "native_mask_folder", options=NativeMaskFolderOptions, kind="image", tasks=("segmentation",), root="required"
)
def build_native_mask_folder(options: NativeMaskFolderOptions, context: DataContext) -> NativeMaskFolder:
    """Your images and masks at data.root (ROOT/images/a.jpg + ROOT/masks/a.png), each at its own size."""
    pairs = {
        "classes": options.class_names(context.root), "ignore_value": options.ignore_value,
        "mask_values": options.mask_values,
        "on_bad_image": options.on_bad_image, "mask_size": options.mask_size, "val_fraction": options.val_fraction,
        "test_fraction": options.test_fraction, "seed": context.seed,
    }  # fmt: skip
    dataset = NativeMaskFolder(
        context.root, context.split, pairs=pairs, in_chans=context.in_chans or 3, mean=options.mean, std=options.std,
        subset=context.subset, **_shared(options),
    )  # fmt: skip
    dataset.batch_tokens = options.batch_tokens
    return dataset
