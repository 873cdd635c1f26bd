"""Synthetic recall probes that separate attention families: MQAR, induction heads and selective copying.

- ``mqar``: multi-query associative recall, Arora, Eyuboglu et al., "Zoology: Measuring and Improving Recall in
  Efficient Language Models", 2023, https://arxiv.org/abs/2312.04927, after its generator
  (``zoology/data/multiquery_ar.py``): keys drawn without replacement from ``1 .. vocab_size // 2 - 1``, values
  from ``vocab_size // 2 .. vocab_size - 1``; the pairs ``k1 v1 k2 v2 ...`` fill the first ``2 * num_kv_pairs``
  tokens; every key is queried once, at position ``2 * num_kv_pairs + 2 * gap`` with the gaps drawn without
  replacement from Zoology's power law ``p(g) ~ power_a * (g + 1) ** (power_a - 1)`` over ``(seq_len - 2 *
  num_kv_pairs) // 2`` slots; every other position holds a token drawn uniformly from the whole vocabulary
  (Zoology's ``random_non_queries``). The label of a query position is its key's value; every other label is
  ``IGNORE_INDEX``. Zoology requires ``vocab_size > seq_len`` and ``4 * num_kv_pairs <= seq_len``; so does this.
  Two layouts:

  - ``bidirectional`` (default): Zoology's sample as its code builds it: the slot after each query holds a random
    token, so the answer is never among the inputs and encoder-only variants (Linformer, Nystromformer) can be
    measured as well as causal ones;
  - ``causal``: the next-token stream a language model reads (the paper's picture, ``... A 4 ... A -> 4``): the
    value is written after its query, so the label of a query position is the next input token. Only a causal
    model may be measured on it (a bidirectional one reads the answer one position ahead).

- ``induction_heads``: the H3 and Mamba synthetic task (Fu, Dao et al., "Hungry Hungry Hippos", 2023,
  https://arxiv.org/abs/2212.14052; Gu & Dao, "Mamba", 2023, https://arxiv.org/abs/2312.00752): random tokens
  from ``vocab_size`` symbols, a trigger token (id ``vocab_size``) once at a random position followed by the
  answer, and the trigger again at the last position, whose label is the answer (the one labelled position).
  The papers train at vocabulary 20 / length 30 (H3) and vocabulary 16 / length 256 (Mamba; tested to 1M);
  the defaults here are Mamba's training setting, which a CPU runs.
- ``selective_copying``: Mamba's selective copying (after the copying task of the S4 code): ``num_tokens`` tokens
  from ``1 .. vocab_size`` placed in order at random positions of the first ``seq_len - num_tokens`` slots, noise
  (id 0) elsewhere, then ``num_tokens`` marker tokens (id ``vocab_size + 1``) whose labels are the placed tokens in
  order. Mamba uses length 4,096, 16 tokens and a vocabulary of 16; scaled to a CPU the defaults are length 256,
  16 tokens, vocabulary 16.

Every sample depends only on (seed, split, index) and the options; samples are dicts ``tokens`` int64 ``[N]``,
``mask`` bool ``[N]`` (all True) and ``labels`` int64 ``[N]`` (``IGNORE_INDEX`` where nothing is asked).
``num_classes`` is the whole vocabulary, so accuracy is over every token, not only the answers' half.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from ..._validate import check_int
from .._interface import IGNORE_INDEX
from .._registry import DataContext, register_dataset
from ..collate import check_split

__all__ = [
    "MQAR",
    "InductionHeads",
    "InductionHeadsOptions",
    "MQAROptions",
    "SelectiveCopying",
    "SelectiveCopyingOptions",
    "mqar_power_law",
]

_SPLITS = ("train", "val", "test")
# Zoology's 100k training and 3k test examples
_DEFAULT_NUM_SAMPLES = {"train": 100_000, "val": 3_000, "test": 3_000}
_TASKS = ("token_classification", "causal_token_classification")
MQAR_LAYOUTS = ("bidirectional", "causal")


def mqar_power_law(space: int, power_a: float) -> np.ndarray:
    """Zoology's query-gap distribution over ``0 .. space - 1``: ``p(g) ~ power_a * (g + 1) ** (power_a - 1)``."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


class _Generated(Dataset):
    """A split of independently drawn samples; subclasses implement ``draw(rng) -> (tokens [N], labels [N])``."""

    vocab_size: int
    num_classes: int
    max_length: int

    def __init__(self, split: str, *, num_samples: int | None, seed: int) -> None:
        self.split = check_split(split)
        default = _DEFAULT_NUM_SAMPLES[split]
        self.num_samples = check_int("num_samples", default if num_samples is None else num_samples, 1)
        self.seed = check_int("seed", seed, 0)
        self._split_id = _SPLITS.index(split)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Sample ``index``: ``tokens`` int64 ``[N]``, ``mask`` bool ``[N]`` (all True), ``labels`` int64 ``[N]``."""
        tokens, labels = self.sample(index)
        ids = torch.from_numpy(tokens)
        return {"tokens": ids, "mask": torch.ones(len(ids), dtype=torch.bool), "labels": torch.from_numpy(labels)}

    def sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and labels, int64 ``[N]`` each, drawn from a generator seeded by (seed, split, index)."""
        index = operator.index(index)
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for a {self.split!r} split of {self.num_samples} samples")
        rng = np.random.default_rng([self.seed, self._split_id, index % self.num_samples])
        return self.draw(rng)

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


class MQAR(_Generated):
    """Zoology's multi-query associative recall (see the module docstring for the sample and the two layouts).

    Args:
        split: train, val or test (different draws of one distribution).
        num_samples: samples in the split (default Zoology's 100,000 / 3,000 / 3,000).
        seed: seed of the draws.
        vocab_size: tokens; keys come from the lower half (without 0), values from the upper half.
        seq_len: tokens per sample.
        num_kv_pairs: key-value pairs, each queried once.
        power_a: exponent of the power law of the query gaps (Zoology's 0.01 puts most queries near the start).
        layout: ``bidirectional`` (the answer is never an input) or ``causal`` (the answer follows its query).
    """

    def __init__(
        self,
        split: str,
        *,
        num_samples: int | None = None,
        seed: int = 0,
        vocab_size: int = 8192,
        seq_len: int = 64,
        num_kv_pairs: int = 8,
        power_a: float = 0.01,
        layout: Literal["bidirectional", "causal"] = "bidirectional",
    ) -> None:
        super().__init__(split, num_samples=num_samples, seed=seed)
        problem = _mqar_problem(vocab_size, seq_len, num_kv_pairs, power_a, layout)
        if problem:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        self.vocab_size = self.num_classes = vocab_size
        self.max_length = self.seq_len = seq_len
        self.num_kv_pairs, self.power_a, self.layout = num_kv_pairs, power_a, layout
        self._gap_p = mqar_power_law((seq_len - 2 * num_kv_pairs) // 2, power_a)

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        pairs, half = self.num_kv_pairs, self.vocab_size // 2
        keys = rng.choice(np.arange(1, half), size=pairs, replace=False)
        values = rng.choice(np.arange(half, self.vocab_size), size=pairs, replace=False)
        gaps = rng.choice(len(self._gap_p), size=pairs, replace=False, p=self._gap_p)
        tokens = rng.integers(0, self.vocab_size, size=self.seq_len)
        tokens[0 : 2 * pairs : 2], tokens[1 : 2 * pairs : 2] = keys, values
        queries = 2 * pairs + 2 * gaps
        tokens[queries] = keys
        if self.layout == "causal":
            tokens[queries + 1] = values
        labels = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        labels[queries] = values
        return tokens.astype(np.int64), labels

    def __repr__(self) -> str:
        return (
            f"MQAR(split={self.split!r}, num_samples={self.num_samples}, seed={self.seed}, vocab_size="
            f"{self.vocab_size}, seq_len={self.seq_len}, num_kv_pairs={self.num_kv_pairs}, power_a={self.power_a}, "
            f"layout={self.layout!r})"
        )


def _mqar_problem(vocab_size: int, seq_len: int, pairs: int, power_a: float, layout: str) -> tuple[str, str] | None:
    """The first (option, message) that makes an MQAR sample impossible, or None."""
    if vocab_size <= seq_len:
        return "vocab_size", f"must be > seq_len {seq_len} (Zoology's condition), got {vocab_size}"
    if 4 * pairs > seq_len:
        return "num_kv_pairs", f"must be <= seq_len / 4 = {seq_len // 4} (Zoology's condition), got {pairs}"
    if not power_a > 0:
        return "power_a", f"must be > 0, got {power_a}"
    if layout not in MQAR_LAYOUTS:
        return "layout", f"must be one of {', '.join(MQAR_LAYOUTS)}, got {layout!r}"
    return None


class InductionHeads(_Generated):
    """H3's and Mamba's induction heads: ``... t a ... t`` -> ``a`` at the last position (``t`` the trigger).

    Args:
        split, num_samples, seed: as for ``MQAR``.
        vocab_size: symbols ``0 .. vocab_size - 1``; the trigger is ``vocab_size`` (so ``vocab_size + 1`` tokens).
        seq_len: tokens per sample (at least 4: trigger, answer, one more, trigger).
    """

    def __init__(
        self, split: str, *, num_samples: int | None = None, seed: int = 0, vocab_size: int = 16, seq_len: int = 256
    ) -> None:
        super().__init__(split, num_samples=num_samples, seed=seed)
        self.symbols = check_int("vocab_size", vocab_size, 2)
        self.max_length = self.seq_len = check_int("seq_len", seq_len, 4)
        self.trigger = vocab_size
        self.vocab_size = self.num_classes = vocab_size + 1

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        tokens = rng.integers(0, self.symbols, size=self.seq_len)
        # the first trigger and its answer lie before the final trigger, with at least one token between
        at = int(rng.integers(0, self.seq_len - 2))
        tokens[at], tokens[-1] = self.trigger, self.trigger
        labels = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        labels[-1] = tokens[at + 1]
        return tokens.astype(np.int64), labels


class SelectiveCopying(_Generated):
    """Mamba's selective copying: the non-noise tokens of the input, in order, at the trailing marker positions.

    Args:
        split, num_samples, seed: as for ``MQAR``.
        vocab_size: data symbols ``1 .. vocab_size``; 0 is noise and ``vocab_size + 1`` the marker.
        seq_len: tokens per sample, the ``num_tokens`` markers included.
        num_tokens: tokens to copy.
    """

    noise = 0

    def __init__(
        self,
        split: str,
        *,
        num_samples: int | None = None,
        seed: int = 0,
        vocab_size: int = 16,
        seq_len: int = 256,
        num_tokens: int = 16,
    ) -> None:
        super().__init__(split, num_samples=num_samples, seed=seed)
        self.symbols = check_int("vocab_size", vocab_size, 1)
        self.num_tokens = check_int("num_tokens", num_tokens, 1)
        self.max_length = self.seq_len = check_int("seq_len", seq_len, 2 * num_tokens)
        self.marker = vocab_size + 1
        self.vocab_size = self.num_classes = vocab_size + 2

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        count, body = self.num_tokens, self.seq_len - self.num_tokens
        data = rng.integers(1, self.symbols + 1, size=count)
        where = np.sort(rng.choice(body, size=count, replace=False))
        tokens = np.full(self.seq_len, self.noise, dtype=np.int64)
        tokens[where] = data
        tokens[body:] = self.marker
        labels = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        labels[body:] = data
        return tokens, labels


@dataclass(kw_only=True)
class MQAROptions:
    """``data.options`` of ``mqar``: Zoology's defaults (vocabulary 8,192, length 64, 8 pairs, power 0.01)."""

    vocab_size: int = field(default=8192, metadata={"min": 3, "max": 1 << 20})
    seq_len: int = field(default=64, metadata={"min": 4, "max": 1 << 20})
    num_kv_pairs: int = field(default=8, metadata={"min": 1})
    power_a: float = field(default=0.01, metadata={"min": 0, "min_exclusive": True})
    layout: Literal["bidirectional", "causal"] = "bidirectional"

    def problems(self) -> list[tuple[str, str]]:
        problem = _mqar_problem(self.vocab_size, self.seq_len, self.num_kv_pairs, self.power_a, self.layout)
        return [problem] if problem else []


@dataclass(kw_only=True)
class InductionHeadsOptions:
    """``data.options`` of ``induction_heads``: Mamba's training setting (16 symbols, length 256)."""

    vocab_size: int = field(default=16, metadata={"min": 2, "max": 1 << 20})
    seq_len: int = field(default=256, metadata={"min": 4, "max": 1 << 20})


@dataclass(kw_only=True)
class SelectiveCopyingOptions:
    """``data.options`` of ``selective_copying``: Mamba's 16 tokens of 16 symbols, at length 256 instead of 4,096."""

    vocab_size: int = field(default=16, metadata={"min": 1, "max": 1 << 20})
    seq_len: int = field(default=256, metadata={"min": 2, "max": 1 << 20})
    num_tokens: int = field(default=16, metadata={"min": 1})

    def problems(self) -> list[tuple[str, str]]:
        if 2 * self.num_tokens > self.seq_len:
            return [("num_tokens", f"must be <= seq_len / 2 = {self.seq_len // 2}, got {self.num_tokens}")]
        return []


def _counts(context: DataContext) -> dict[str, int | None]:
    return {"num_samples": context.num_samples, "seed": context.seed}


@register_dataset("mqar", options=MQAROptions, kind="tokens", tasks=_TASKS)
def build_mqar(options: MQAROptions, context: DataContext) -> MQAR:
    """Zoology's multi-query associative recall: recall each queried key's value (generated)."""
    return MQAR(context.split, **_counts(context), **asdict(options))


@register_dataset("induction_heads", options=InductionHeadsOptions, kind="tokens", tasks=_TASKS)
def build_induction_heads(options: InductionHeadsOptions, context: DataContext) -> InductionHeads:
    """H3 / Mamba induction heads: the token after the trigger's first occurrence (generated)."""
    return InductionHeads(context.split, **_counts(context), **asdict(options))


@register_dataset("selective_copying", options=SelectiveCopyingOptions, kind="tokens", tasks=_TASKS)
def build_selective_copying(options: SelectiveCopyingOptions, context: DataContext) -> SelectiveCopying:
    """Mamba's selective copying: the non-noise tokens in order, after the markers (generated)."""
    return SelectiveCopying(context.split, **_counts(context), **asdict(options))
