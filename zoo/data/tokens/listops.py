"""ListOps as Long Range Arena defines it, generated on the fly (nothing is downloaded).

Nangia & Bowman, "ListOps: A Diagnostic Dataset for Latent Tree Learning", 2018, https://arxiv.org/abs/1804.06028;
the long version from Tay et al., "Long Range Arena", ICLR 2021, https://arxiv.org/abs/2011.04006, whose generator
(``lra_benchmarks/data/listops.py``) fixes the settings used here:

- an expression is a value (a digit 0-9) or an operator applied to 2 to ``max_args`` (10) expressions; a node is an
  operator with probability 0.25 (LRA's ``VALUE_P``) while its depth is below ``max_depth`` (10; the root has
  depth 1 and nodes at depth ``max_depth`` are digits); the root is always an operator here (a lone digit is
  never long enough);
- operators ``[MIN``, ``[MAX``, ``[MED`` (``int(np.median(args))``: the mean of the two middle arguments,
  rounded down, for an even count) and ``[SM`` (sum modulo 10), each closed by ``]``; the label is the value;
- the length counts digits, operators and closing brackets (not parentheses) and LRA keeps the trees of length
  500 to 2000 (its check is ``500 < length < 2000``; here both bounds are inclusive options);
- LRA's raw strings wrap every application in parentheses (``( ( [MAX 2 ) 9 ) ] )``), but its tokenizer drops them,
  so its models see ``[MAX 2 9 ]``. That is the default here; ``parentheses=True`` keeps them (about 3x longer).

Generation is LRA's own process (the same distribution over trees, labels and lengths), with rejection to the
length range made cheap: a tree is abandoned as soon as it outgrows ``max_length``, so a rejected draw costs at
most ``max_length`` tokens and generating a split stays a small part of a run. Labels follow LRA's
distribution, which favours 0 and 9 (MIN and MAX of many arguments): 15-17% each against 7-10% for the others.

Sample ``i`` of a split depends only on (seed, split, i) and the options. Samples are dicts: ``tokens`` int64
``[N]``, ``mask`` bool ``[N]`` (all True) and ``label`` int64 ``[]``; ``zoo.data.collate.PadCollate`` pads them
with ``PAD_ID`` (0).
"""

from __future__ import annotations

import operator
import random
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch.utils.data import Dataset

from ..._validate import check_int
from .._registry import DataContext, register_dataset

__all__ = ["OPERATORS", "PAD_ID", "VOCAB", "ListOps", "ListOpsOptions", "evaluate_operator"]

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
# fixed vocabulary: PAD, the operators, the closing bracket, LRA's parentheses, the digits
VOCAB = ("<pad>", *OPERATORS, "]", "(", ")", *(str(d) for d in range(10)))
PAD_ID = 0
_OP0, _END, _OPEN, _CLOSE, _DIGIT0 = 1, 5, 6, 7, 8
_TOKEN_IDS = {token: index for index, token in enumerate(VOCAB)}

# LRA's VALUE_P: a node below the root is an operator when random() <= 0.25
_OPERATOR_P = 0.25
_SPLITS = ("train", "val", "test")
# LRA's 96k / 2k / 2k
_DEFAULT_NUM_SAMPLES = {"train": 96_000, "val": 2_000, "test": 2_000}
# draws per sample before the settings are declared infeasible (the defaults accept about 1 draw in 12)
_MAX_DRAWS = 200_000


class _TooLong(Exception):
    """Raised inside a draw that outgrew ``max_length``; the draw is abandoned."""


def evaluate_operator(op: int, args: list[int]) -> int:
    """LRA's value of operator ``OPERATORS[op]`` on digit arguments (MED: ``int(np.median(args))``)."""
    if op == 0:
        return min(args)
    if op == 1:
        return max(args)
    if op == 2:
        ordered, mid = sorted(args), len(args) // 2
        return ordered[mid] if len(args) % 2 else (ordered[mid - 1] + ordered[mid]) // 2
    return sum(args) % 10


class _Draw:
    """One run of LRA's tree process, writing token ids as it goes and abandoning trees longer than ``limit``."""

    def __init__(self, rnd: random.Random, *, max_depth: int, max_args: int, limit: int, parentheses: bool):
        self.random = rnd.random
        self.max_depth, self.max_args, self.limit, self.parentheses = max_depth, max_args, limit, parentheses
        self.tokens: list[int] = []
        # LRA's length: digits, operators and closing brackets
        self.length = 0

    def tree(self) -> int:
        """Draw a whole expression (the root is an operator); returns its value."""
        return self._operator(1)

    def _node(self, depth: int) -> int:
        if depth >= self.max_depth or self.random() > _OPERATOR_P:
            value = int(self.random() * 10)
            self._emit(_DIGIT0 + value)
            return value
        return self._operator(depth)

    def _operator(self, depth: int) -> int:
        num_args = 2 + int(self.random() * (self.max_args - 1))
        op = int(self.random() * len(OPERATORS))
        if self.parentheses:
            # LRA's string nests one pair per argument plus one for the closing bracket
            self.tokens.extend([_OPEN] * (num_args + 1))
        self._emit(_OP0 + op)
        args = []
        for _ in range(num_args):
            args.append(self._node(depth + 1))
            if self.parentheses:
                self.tokens.append(_CLOSE)
        self._emit(_END)
        if self.parentheses:
            self.tokens.append(_CLOSE)
        return evaluate_operator(op, args)

    def _emit(self, token: int) -> None:
        self.tokens.append(token)
        self.length += 1
        if self.length > self.limit:
            raise _TooLong


def _max_tree_length(max_depth: int, max_args: int) -> int:
    """The longest expression (in LRA's length) the depth and argument limits allow."""
    longest = 1
    for _ in range(max_depth - 1):
        longest = 2 + max_args * longest
    return longest


class ListOps(Dataset):
    """LRA's ListOps: bracketed MIN / MAX / MED / SM expressions over digits, labelled by their value (10 classes).

    Args:
        split: ``train``, ``val`` or ``test`` (different draws of the same distribution).
        num_samples: length of the split; default LRA's 96,000 / 2,000 / 2,000. Sample ``i`` does not depend on it.
        seed: seed of the draws.
        min_length, max_length: inclusive range of LRA's length (digits, operators, ``]``).
        max_depth: nodes at this depth are digits (the root has depth 1).
        max_args: most arguments of one operator (at least 2).
        parentheses: keep LRA's raw-string parentheses in the tokens (its models never saw them).

    Attributes:
        vocab_size, num_classes, class_names, max_length (longest token sequence, for sizing a model).
    """

    num_classes = 10
    class_names = classes = tuple(str(d) for d in range(10))
    vocab = VOCAB
    vocab_size = len(VOCAB)
    pad_id = PAD_ID

    def __init__(
        self,
        split: str,
        *,
        num_samples: int | None = None,
        seed: int = 0,
        min_length: int = 500,
        max_length: int = 2000,
        max_depth: int = 10,
        max_args: int = 10,
        parentheses: bool = False,
    ):
        if split not in _SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(_SPLITS)}")
        self.split = split
        self.num_samples = check_int(
            "num_samples", _DEFAULT_NUM_SAMPLES[split] if num_samples is None else num_samples, 1
        )
        self.seed = check_int("seed", seed, 0)
        self.min_length = check_int("min_length", min_length, 1)
        self.max_tree_length = check_int("max_length", max_length, self.min_length)
        self.max_depth = check_int("max_depth", max_depth, 2)
        self.max_args = check_int("max_args", max_args, 2)
        if not isinstance(parentheses, bool):
            raise TypeError(f"parentheses={parentheses!r} must be true or false")
        self.parentheses = parentheses
        longest = _max_tree_length(self.max_depth, self.max_args)
        if self.min_length > longest:
            raise ValueError(
                f"min_length={self.min_length} cannot be reached: with max_depth={self.max_depth} and "
                f"max_args={self.max_args} the longest expression has {longest} tokens"
            )
        # an expression of LRA length L has 3L - 2 tokens with its parentheses
        self.max_length = 3 * self.max_tree_length - 2 if parentheses else self.max_tree_length
        self._split_id = _SPLITS.index(split)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Sample ``index``: ``tokens`` int64 ``[N]``, ``mask`` bool ``[N]`` (all True), ``label`` int64 ``[]``."""
        tokens, label = self.draw(index)
        ids = torch.from_numpy(tokens)
        return {"tokens": ids, "mask": torch.ones(len(ids), dtype=torch.bool), "label": torch.tensor(label)}

    def draw(self, index: int) -> tuple[np.ndarray, int]:
        """Token ids int64 ``[N]`` and value of expression ``index``, drawn from a generator seeded by
        (seed, split, index): LRA's process, redrawn until its length is within [min_length, max_length]."""
        index = self._normalise_index(index)
        state = np.random.SeedSequence([self.seed, self._split_id, index]).generate_state(2, dtype=np.uint64)
        rnd = random.Random(int(state[0]) << 64 | int(state[1]))
        options = {"max_depth": self.max_depth, "max_args": self.max_args, "parentheses": self.parentheses}
        for _ in range(_MAX_DRAWS):
            draw = _Draw(rnd, limit=self.max_tree_length, **options)
            try:
                value = draw.tree()
            except _TooLong:
                continue
            if draw.length >= self.min_length:
                return np.asarray(draw.tokens, dtype=np.int64), value
        raise RuntimeError(
            f"no ListOps expression of length {self.min_length}..{self.max_tree_length} in {_MAX_DRAWS} draws "
            f"(max_depth={self.max_depth}, max_args={self.max_args}); widen the length range"
        )

    def decode(self, tokens: torch.Tensor | np.ndarray | list[int]) -> str:
        """Token ids ``[N]`` -> the expression in LRA's spelling, tokens separated by spaces (PAD dropped)."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= len(VOCAB)):
            raise ValueError(f"token ids must be in 0..{len(VOCAB) - 1}, got {ids.min()}..{ids.max()}")
        return " ".join(VOCAB[i] for i in ids.tolist() if i != PAD_ID)

    def encode(self, expression: str) -> torch.Tensor:
        """An expression in LRA's spelling (tokens separated by spaces) -> token ids int64 ``[N]``."""
        try:
            return torch.tensor([_TOKEN_IDS[token] for token in expression.split()], dtype=torch.int64)
        except KeyError as err:
            raise ValueError(f"unknown ListOps token {err.args[0]!r}; known: {' '.join(VOCAB[1:])}") from None

    def _normalise_index(self, index: int) -> int:
        index = operator.index(index)
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for ListOps {self.split!r} of {self.num_samples} samples")
        return index % self.num_samples

    def __repr__(self) -> str:
        return (
            f"ListOps(split={self.split!r}, num_samples={self.num_samples}, seed={self.seed}, "
            f"min_length={self.min_length}, max_length={self.max_tree_length}, max_depth={self.max_depth}, "
            f"max_args={self.max_args}, parentheses={self.parentheses})"
        )


@dataclass(kw_only=True)
class ListOpsOptions:
    """``data.options`` of ``listops``: LRA's settings by default."""

    min_length: int = field(default=500, metadata={"min": 1, "max": 65_536})
    max_length: int = field(default=2000, metadata={"min": 1, "max": 65_536})
    max_depth: int = field(default=10, metadata={"min": 2, "max": 32})
    max_args: int = field(default=10, metadata={"min": 2, "max": 32})
    parentheses: bool = False

    def problems(self) -> list[tuple[str, str]]:
        if self.min_length > self.max_length:
            return [("min_length", f"must be <= max_length {self.max_length}, got {self.min_length}")]
        longest = _max_tree_length(self.max_depth, self.max_args)
        if self.min_length > longest:
            return [("min_length", f"must be <= {longest}, the longest expression of max_depth and max_args")]
        return []


@register_dataset("listops", options=ListOpsOptions, kind="tokens", tasks=("classification",))
def build_listops(options: ListOpsOptions, context: DataContext) -> ListOps:
    """LRA ListOps: nested MIN / MAX / MED / SM expressions of 500-2000 tokens, 10 classes (generated)."""
    return ListOps(context.split, num_samples=context.num_samples, seed=context.seed, **asdict(options))
