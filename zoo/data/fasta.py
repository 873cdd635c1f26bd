"""Users' DNA files, never downloaded: FASTA / FASTA.gz (``FastaDataset``, one class per file or per folder, records
cut into windows) and the Genomic Benchmarks layout (``GenomicBenchmarksDataset``), both read from ``data.root``.

Every sequence is checked against the IUPAC nucleotide alphabet (``zoo.data.nucleotides.check_nucleotides``): a
protein or binary file is an error naming the file and its first offending record, a truncated ``.gz`` one naming
the file."""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._validate import check_int
from ._registry import DataContext, register_dataset
from .nucleotides import DNASamples, DNATokenizer, check_nucleotides, read_fasta, read_sequence_file
from .sequence import window_starts

__all__ = ["FastaDataset", "FastaOptions", "GenomicBenchmarksDataset", "GenomicBenchmarksOptions"]

_FASTA_SUFFIX = re.compile(r"\.(fa|fasta|fna|fas|ffn|frn|seq)(\.gz)?$", re.IGNORECASE)
# the DNA sets serve causal_lm too, their tokens being the targets
_DNA_TASKS = ("classification", "causal_lm")


def _is_fasta(name: str) -> bool:
    return bool(_FASTA_SUFFIX.search(name)) and not name.startswith(".")


def _class_sources(folder: Path) -> dict[str, list[Path]]:
    """Class name -> FASTA files: each FASTA file in ``folder`` is a class, each sub-folder of FASTA files one."""
    if not folder.is_dir():
        raise FileNotFoundError(f"FASTA folder {str(folder)!r} does not exist")
    sources: dict[str, list[Path]] = {}
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and _is_fasta(entry.name):
            sources[_FASTA_SUFFIX.sub("", entry.name)] = [entry]
        elif entry.is_dir() and not entry.name.startswith("."):
            files = sorted(p for p in entry.iterdir() if p.is_file() and _is_fasta(p.name))
            if files:
                sources[entry.name] = files
    if not sources:
        raise ValueError(f"no FASTA files (*.fa, *.fasta, *.fna, optionally .gz) in {str(folder)!r} or its sub-folders")
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
            self.classes = tuple(_class_sources(train_dir))
            unknown = sorted(set(sources) - set(self.classes))
            if unknown:
                raise ValueError(f"classes {unknown} of {str(folder)!r} are missing from {str(train_dir)!r}")
        self._setup(tokenizer, rc_prob, seed)
        self.records, rows = [], []
        for name, files in sources.items():
            label = self.classes.index(name)
            for path in files:
                for _, codes in read_fasta(path):
                    starts = window_starts(len(codes), self.window, self.stride, min_length)
                    record = np.full_like(starts, len(self.records))
                    rows.append(np.column_stack([record, starts, np.full_like(starts, label)]))
                    self.records.append(codes)
        self._index = np.concatenate(rows) if rows else np.zeros((0, 3), dtype=np.int64)  # [W, (record, start, label)]

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        record, start, label = self._index[index]
        return self._sample(self.records[record][start : start + self.window], int(label))


class GenomicBenchmarksDataset(DNASamples):
    """Users' copy of a Genomic Benchmarks data set: ``root/<split>/<class>/*.txt``, one sequence per file.

    Classes are indexed from ``root/train`` (sorted names); items are ordered by class, then file name.
    ``max_length`` truncates longer sequences (None keeps them whole). Nothing is downloaded.
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
    ):
        folder = Path(root) / split
        if not folder.is_dir():
            raise FileNotFoundError(f"split folder {str(folder)!r} does not exist; expected root/<split>/<class>/*.txt")
        index_dir = Path(root) / "train" if (Path(root) / "train").is_dir() else folder
        self.classes = tuple(sorted(p.name for p in index_dir.iterdir() if p.is_dir() and not p.name.startswith(".")))
        self.max_length = None if max_length is None else check_int("max_length", max_length, 1)
        self._setup(tokenizer, rc_prob, seed)
        self.sequences, self.labels = [], []
        for class_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if class_dir.name not in self.classes:
                raise ValueError(f"class folder {str(class_dir)!r} is not a class of {str(index_dir)!r}")
            for path in sorted(class_dir.glob("*.txt")):
                codes = check_nucleotides(read_sequence_file(path), repr(str(path)))
                self.sequences.append(codes[: self.max_length])
                self.labels.append(self.classes.index(class_dir.name))
        if not self.sequences:
            raise ValueError(f"no *.txt sequences in the class folders of {str(folder)!r}")

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
    )
