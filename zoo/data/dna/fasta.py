"""Users' DNA files, never downloaded: FASTA / FASTA.gz (``FastaDataset``, one class per file or per folder, records
cut into windows) and the Genomic Benchmarks layout (``GenomicBenchmarksDataset``), both read from ``data.root``.

Every sequence is checked against the IUPAC nucleotide alphabet (``zoo.data.dna.nucleotides.check_nucleotides``): a
protein or binary file is an error naming the file and its first offending record, a truncated ``.gz`` one naming
the file."""

import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..._validate import check_int
from .._registry import DataContext, register_dataset
from ..collate import window_starts
from .nucleotides import DNASamples, DNATokenizer, check_nucleotides, read_fasta, read_sequence_file

__all__ = ["FastaDataset", "FastaOptions", "GenomicBenchmarksDataset", "GenomicBenchmarksOptions"]

_logger = logging.getLogger(__name__)

_FASTA_SUFFIX = re.compile(r"\.(fa|fasta|fna|fas|ffn|frn|seq)(\.gz)?$", re.IGNORECASE)
# the DNA sets serve causal_lm too, their tokens being the targets
_DNA_TASKS = ("classification", "causal_lm")


def _is_fasta(name: str) -> bool:
    return bool(_FASTA_SUFFIX.search(name)) and not name.startswith(".")


def _class_sources(folder: Path, *, warn: bool = True) -> dict[str, list[Path]]:
    """Class name -> FASTA files: each FASTA file in ``folder`` is a class, each sub-folder of FASTA files one. Other
    entries (``notes.txt``, ``.DS_Store``, a sub-folder) are counted in a warning (when ``warn``)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"FASTA folder {str(folder)!r} does not exist")
    sources: dict[str, list[Path]] = {}
    others: list[str] = []
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and _is_fasta(entry.name):
            sources[_FASTA_SUFFIX.sub("", entry.name)] = [entry]
        elif entry.is_dir() and not entry.name.startswith("."):
            inside = sorted(entry.iterdir())
            files = [p for p in inside if p.is_file() and _is_fasta(p.name)]
            others += [f"{entry.name}/{p.name}" for p in inside if p not in files]
            if files:
                sources[entry.name] = files
            elif not entry.name.startswith("."):
                others.append(f"{entry.name}/ (no FASTA file)")
        else:
            others.append(entry.name)
    if not sources:
        raise ValueError(f"no FASTA files (*.fa, *.fasta, *.fna, optionally .gz) in {str(folder)!r} or its sub-folders")
    if others and warn:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        _logger.warning("%s: left out %d entries that are not FASTA files (%s)", folder, len(others), shown)
    return sources


class FastaDataset(DNASamples):
    """Windows of the records of users' FASTA files, labelled by file or by folder.

    Layout: ``root/<class>.fasta[.gz]`` (one class per file) and/or ``root/<class>/*.fa[.gz]`` (one class per
    folder); with ``split``, the same under ``root/<split>/``, classes indexed from ``root/train`` so that
    every split agrees. Each record is tiled by windows of ``window`` nucleotides every ``stride``; the last
    window of a record (or a record shorter than ``window``) may be shorter and is padded by ``PadCollate``.

    Args:
        root: the folder described above.
        split: sub-folder of ``root`` to read, or None for ``root`` itself.
        window: nucleotides per window; stride: step between windows (default ``window``).
        min_length: shorter windows are dropped.
        tokenizer: default nucleotide level; rc_prob, seed: reverse-complement augmentation.
        subset: ``(count, what) -> indices or None``, the windows kept (``DataContext.subset``); None keeps all.

    Entries that are not FASTA files and records without a window (empty, or shorter than ``min_length``) are left
    out with a warning that counts them.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split: str | None = None,
        *,
        window: int,
        stride: int | None = None,
        min_length: int = 1,
        tokenizer: DNATokenizer | None = None,
        rc_prob: float = 0.0,
        seed: int = 0,
        subset: Callable[[int, str], Sequence[int] | None] | None = None,
    ):
        self.window = check_int("window", window, 1)
        self.stride = check_int("stride", stride if stride is not None else window, 1)
        check_int("min_length", min_length, 1)
        folder = Path(root) if split is None else Path(root) / split
        if not Path(root).is_dir():
            raise FileNotFoundError(f"FASTA root {str(root)!r} does not exist")
        sources = _class_sources(folder)
        train_dir = Path(root) / "train"
        self.classes = tuple(sources)
        if split not in (None, "train") and train_dir.is_dir():
            self.classes = tuple(_class_sources(train_dir, warn=False))
            unknown = sorted(set(sources) - set(self.classes))
            if unknown:
                raise ValueError(f"classes {unknown} of {str(folder)!r} are missing from {str(train_dir)!r}")
        self._setup(tokenizer, rc_prob, seed)
        self.records, rows, unused = [], [], []
        for name, files in sources.items():
            label = self.classes.index(name)
            for path in files:
                for header, codes in read_fasta(path):
                    starts = window_starts(len(codes), self.window, self.stride, min_length)
                    if not len(codes) or not len(starts):
                        unused.append(f"{path.name} >{header}")
                    record = np.full_like(starts, len(self.records))
                    rows.append(np.column_stack([record, starts, np.full_like(starts, label)]))
                    self.records.append(codes)
        if unused:
            _logger.warning(
                "%s: left out %d record(s) without nucleotides or shorter than min_length=%d, e.g. %s",
                folder, len(unused), min_length, unused[0],
            )  # fmt: skip
        self._index = np.concatenate(rows) if rows else np.zeros((0, 3), dtype=np.int64)  # [W, (record, start, label)]
        kept = subset(len(self._index), f"windows of {str(folder)!r}") if subset is not None else None
        self._index = self._index if kept is None else self._index[kept]

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        record, start, label = self._index[index]
        return self._sample(self.records[record][start : start + self.window], int(label))


class GenomicBenchmarksDataset(DNASamples):
    """Users' copy of a Genomic Benchmarks data set: ``root/<split>/<class>/*.txt``, one sequence per file.

    Classes are indexed from ``root/train`` (sorted names); items are ordered by class, then file name.
    ``max_length`` truncates longer sequences (None keeps them whole); ``subset`` as for ``FastaDataset``; entries
    that are not ``*.txt`` files and empty sequence files are counted in a warning. Nothing is downloaded.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split: str,
        *,
        max_length: int | None = None,
        tokenizer: DNATokenizer | None = None,
        rc_prob: float = 0.0,
        seed: int = 0,
        subset: Callable[[int, str], Sequence[int] | None] | None = None,
    ):
        folder = Path(root) / split
        if not folder.is_dir():
            raise FileNotFoundError(f"split folder {str(folder)!r} does not exist; expected root/<split>/<class>/*.txt")
        index_dir = Path(root) / "train" if (Path(root) / "train").is_dir() else folder
        self.classes = tuple(sorted(p.name for p in index_dir.iterdir() if p.is_dir() and not p.name.startswith(".")))
        self.max_length = None if max_length is None else check_int("max_length", max_length, 1)
        self._setup(tokenizer, rc_prob, seed)
        self.sequences, self.labels = [], []
        others, empty = [p.name for p in folder.iterdir() if not p.is_dir() or p.name.startswith(".")], []
        for class_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if class_dir.name not in self.classes:
                raise ValueError(f"class folder {str(class_dir)!r} is not a class of {str(index_dir)!r}")
            files = sorted(class_dir.iterdir())
            others += [f"{class_dir.name}/{p.name}" for p in files if not (p.suffix == ".txt" and p.is_file())]
            for path in (p for p in files if p.suffix == ".txt" and p.is_file()):
                codes = check_nucleotides(read_sequence_file(path), repr(str(path)))
                if not len(codes):
                    empty.append(f"{class_dir.name}/{path.name}")
                    continue
                self.sequences.append(codes[: self.max_length])
                self.labels.append(self.classes.index(class_dir.name))
        if not self.sequences:
            raise ValueError(f"no *.txt sequences in the class folders of {str(folder)!r}")
        if others:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            _logger.warning("%s: left out %d entries that are not *.txt sequences (%s)", folder, len(others), shown)
        if empty:
            _logger.warning("%s: left out %d empty sequence file(s), e.g. %s", folder, len(empty), empty[0])
        kept = subset(len(self.sequences), f"sequences of {str(folder)!r}") if subset is not None else None
        if kept is not None:
            self.sequences, self.labels = [self.sequences[i] for i in kept], [self.labels[i] for i in kept]

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self._sample(self.sequences[index], self.labels[index])


@dataclass(kw_only=True)
class FastaOptions:
    """``data.options`` of fasta (see ``FastaDataset``)."""

    window: int = field(metadata={"min": 1})
    # null: window (no overlap)
    stride: int | None = field(default=None, metadata={"min": 1})
    min_length: int = field(default=1, metadata={"min": 1})
    # reverse-complement augmentation, training split only
    rc_prob: float = field(default=0.0, metadata={"min": 0, "max": 1})


@register_dataset("fasta", options=FastaOptions, kind="dna", tasks=_DNA_TASKS, root="required")
def build_fasta(options: FastaOptions, context: DataContext) -> FastaDataset:
    """Windows of your FASTA files at data.root, one class per file or folder, under data.root/<split>/."""
    return FastaDataset(
        context.root,
        context.split,
        window=options.window,
        stride=options.stride,
        min_length=options.min_length,
        rc_prob=options.rc_prob if context.is_training else 0.0,
        seed=context.seed,
        subset=context.subset,
    )


@dataclass(kw_only=True)
class GenomicBenchmarksOptions:
    """``data.options`` of genomic_benchmarks (see ``GenomicBenchmarksDataset``)."""

    # null: sequences kept whole
    max_length: int | None = field(default=None, metadata={"min": 1})
    rc_prob: float = field(default=0.0, metadata={"min": 0, "max": 1})


@register_dataset("genomic_benchmarks", options=GenomicBenchmarksOptions, kind="dna", tasks=_DNA_TASKS, root="required")
def build_genomic_benchmarks(options: GenomicBenchmarksOptions, context: DataContext) -> GenomicBenchmarksDataset:
    """Your copy of a Genomic Benchmarks set at data.root (<split>/<class>/*.txt)."""
    return GenomicBenchmarksDataset(
        context.root,
        context.split,
        max_length=options.max_length,
        rc_prob=options.rc_prob if context.is_training else 0.0,
        seed=context.seed,
        subset=context.subset,
    )
