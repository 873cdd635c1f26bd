"""Padding and batching for variable-length 1-D sequences (DNA tokens, time series).

Every sequence dataset of zoo returns a dict per sample; the keys in use:

- ``tokens``: int64 ``[N]`` token ids (DNA), or ``values``: float32 ``[N, C]`` (time series);
- ``mask``: bool ``[N]`` key padding mask, True = a real position to keep, False = padding or missing;
- ``label``: int64 ``[]`` class of the sequence, or ``labels``: int64 ``[N]`` one class per position
  (``IGNORE_INDEX`` where there is none), or ``target``: float32 ``[H, C_out]`` (forecasting).

``PadCollate`` turns a list of such samples into a batch padded to its longest sequence. The helpers below
it (windows, stratified splits, the split check) are shared by the sequence datasets.
"""

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .._validate import check_int
from ._interface import IGNORE_INDEX

__all__ = [
    "IGNORE_INDEX",
    "PAD_VALUES",
    "SPLITS",
    "PadCollate",
    "check_split",
    "pad_sequences",
    "stratified_split",
    "window_starts",
]

SPLITS = ("train", "val", "test")

# padding value of each per-position key; tokens are padded with the DNA PAD id (0)
PAD_VALUES: dict[str, float] = {"tokens": 0, "values": 0.0, "labels": IGNORE_INDEX, "mask": False}


def pad_sequences(
    sequences: Sequence[torch.Tensor], pad_value: float, *, pad_to_multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack sequences of different lengths along a new batch dimension, padding at the end.

    Args:
        sequences: B tensors ``[N_i, *rest]`` with one dtype and the same ``rest``.
        pad_value: value of the padded positions.
        pad_to_multiple: the padded length is the longest ``N_i`` rounded up to a multiple of this
            (for attention that works on fixed-size chunks).

    Returns:
        padded: ``[B, N, *rest]`` with ``N = ceil(max N_i / pad_to_multiple) * pad_to_multiple``.
        mask: bool ``[B, N]``, True at the first ``N_i`` positions of row i.
    """
    check_int("pad_to_multiple", pad_to_multiple, 1)
    if not sequences:
        raise ValueError("pad_sequences needs at least one sequence")
    lengths = torch.tensor([len(seq) for seq in sequences])
    longest = int(lengths.max())
    padded_len = -(-longest // pad_to_multiple) * pad_to_multiple
    first = sequences[0]
    padded = first.new_full((len(sequences), padded_len, *first.shape[1:]), pad_value)
    for row, seq in enumerate(sequences):
        padded[row, : len(seq)] = seq
    mask = torch.arange(padded_len)[None, :] < lengths[:, None]  # [B, N]
    return padded, mask


class PadCollate:
    """Collate function for a DataLoader: pads the per-position keys of dict samples to one length.

    Keys listed in ``pad_values`` are padded along their first dimension to the longest sequence of the
    batch (rounded up to ``pad_to_multiple``); every other key is stacked and must have one shape across
    the batch. The padded ``mask`` is False at padded positions, and also where a sample's own mask was False;
    samples without a ``mask`` get one from the padding.

    Args:
        pad_to_multiple: round the padded length up to a multiple of this.
        pad_values: padding value per key; default ``PAD_VALUES`` (tokens 0 = PAD, values 0.0,
            labels ``IGNORE_INDEX``, mask False).

    Example::

        loader = DataLoader(dataset, batch_size=8, collate_fn=PadCollate(pad_to_multiple=64))
        batch = next(iter(loader))  # batch["tokens"]: [8, N], batch["mask"]: [8, N], batch["label"]: [8]
    """

    def __init__(self, *, pad_to_multiple: int = 1, pad_values: Mapping[str, float] | None = None):
        self.pad_to_multiple = check_int("pad_to_multiple", pad_to_multiple, 1)
        self.pad_values = dict(PAD_VALUES if pad_values is None else pad_values)

    def __call__(self, samples: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Samples (dicts with the same keys) -> one dict of batched tensors, ``[B, N, ...]`` or ``[B, ...]``."""
        if not samples:
            raise ValueError("cannot collate an empty list of samples")
        keys = list(samples[0])
        for index, sample in enumerate(samples):
            if list(sample) != keys:
                raise ValueError(f"sample {index} has keys {list(sample)}, sample 0 has {keys}")
        batch, mask = {}, None
        for key in keys:
            column = [torch.as_tensor(sample[key]) for sample in samples]
            if key in self.pad_values:
                batch[key], mask = pad_sequences(column, self.pad_values[key], pad_to_multiple=self.pad_to_multiple)
            else:
                batch[key] = self._stack(key, column)
        # samples without a mask of their own get the padding mask of their padded keys
        if "mask" not in batch and mask is not None:
            batch["mask"] = mask
        return batch

    @staticmethod
    def _stack(key: str, column: list[torch.Tensor]) -> torch.Tensor:
        shapes = {tuple(t.shape) for t in column}
        if len(shapes) > 1:
            raise ValueError(
                f"key {key!r} has shapes {sorted(shapes)} across the batch; add it to pad_values to pad it"
            )
        return torch.stack(column)

    def __repr__(self) -> str:
        return f"PadCollate(pad_to_multiple={self.pad_to_multiple}, pad_values={self.pad_values})"


def window_starts(length: int, window: int, stride: int, min_length: int = 1) -> np.ndarray:
    """Starts of windows tiling ``[0, length)`` every ``stride``; the last may be shorter than ``window``.

    A start is kept when the window before it did not already reach the end and its own window holds at
    least ``min_length`` positions. Returns int64 ``[W]``.
    """
    starts = np.arange(0, max(length, 1), stride, dtype=np.int64)
    keep = (starts == 0) | (starts - stride + window < length)
    keep &= np.minimum(window, length - starts) >= min_length
    return starts[keep]


def stratified_split(labels: np.ndarray, split: str, fractions: Sequence[float], seed: int) -> np.ndarray:
    """Sorted indices of ``split`` in a class-stratified train/val/test split drawn from a fixed seed.

    Args:
        labels: ``[R]`` class of each row.
        split: train, val or test.
        fractions: (train, val, test) shares; each class's count is rounded, test takes the rest.
        seed: seed of the permutation within each class.
    """
    check_split(split)
    rng = np.random.default_rng(seed)
    chosen = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_train, n_val = round(fractions[0] * len(members)), round(fractions[1] * len(members))
        bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, len(members))}
        chosen.append(members[slice(*bounds[split])])
    return np.sort(np.concatenate(chosen))


def check_split(split: str) -> str:
    """``split`` when it is one of ``SPLITS``, else a ValueError."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split
