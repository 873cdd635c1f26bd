"""DNA from Debian packages (found by ``zoo.data._debian``; ``make data-deps`` extracts them), three real data sets:

- ``Genomes``: species of long windows of 16 bacterial genomes (``ragout-examples``), whole strains held out.
- ``YeastCoding``: per-nucleotide coding+/coding-/non-coding labels on yeast chrI and chrII (``gbrowse-data``).
- ``Splice``: StatLog primate splice junctions, 3,186 x 60 nt (``r-cran-mlbench``, read with PyPI ``rdata``).

Tokens, reverse complement and FASTA reading are ``zoo.data.dna.nucleotides``' (re-exported here); users' FASTA and
Genomic Benchmarks files are ``zoo.data.dna.fasta``'s. Samples are dicts: ``tokens`` int64 ``[N]``, ``mask`` bool
``[N]`` (True = keep), and ``label`` int64 ``[]`` or ``labels`` int64 ``[N]``.
"""

import os
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ..._validate import check_int
from .._cache import cache_dir, write_npz_atomic
from .._debian import find_debian_file
from .._interface import IGNORE_INDEX
from .._registry import DataContext, register_dataset
from ..collate import SPLITS, check_split, stratified_split, window_starts
from .nucleotides import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    DNASamples,
    DNATokenizer,
    ReverseComplement,
    encode_nucleotides,
    read_fasta,
    reverse_complement,
)

__all__ = [
    "CLS_ID",
    "MASK_ID",
    "PAD_ID",
    "DNATokenizer",
    "Genomes",
    "GenomesOptions",
    "ReverseComplement",
    "Splice",
    "SpliceOptions",
    "YeastCoding",
    "YeastCodingOptions",
    "encode_nucleotides",
    "gc_content",
    "gc_nearest_mean_accuracy",
    "genome_strains",
    "read_fasta",
    "reverse_complement",
    "yeast_coding_labels",
]

_DNA_TASKS = ("classification", "causal_lm")


_RAGOUT_DIR = "usr/share/doc/ragout/examples"
# share of each record of a training strain kept apart for validation, for a species with fewer than 3 strains
_VAL_TAIL = 0.1
_DEFAULT_NUM_WINDOWS = {"train": 16_000, "val": 2_000, "test": 4_000}


@lru_cache(maxsize=32)
def _strain_records(path: str) -> tuple[np.ndarray, ...]:
    """Codes of every record of one strain's FASTA.gz, read once per process."""
    return tuple(codes for _, codes in read_fasta(path))


def genome_strains(root: str | os.PathLike | None = None) -> dict[str, dict[str, tuple[str, ...]]]:
    """Species -> split -> strain names: the first strain (sorted by name) is test, the second val when the
    species has at least 3 strains, the rest train. E. coli (2 strains) has no val strain: its val windows come
    from the last 10% of each record of its train strain, which train windows never touch."""
    base = find_debian_file("ragout-examples", _RAGOUT_DIR, root=root)
    table = {}
    for species_dir in sorted(p for p in base.iterdir() if (p / "references").is_dir()):
        strains = sorted(p.name.removesuffix(".fasta.gz") for p in (species_dir / "references").glob("*.fasta.gz"))
        val = strains[1:2] if len(strains) >= 3 else []
        table[species_dir.name] = {
            "test": tuple(strains[:1]),
            "val": tuple(val),
            "train": tuple(strains[1 + len(val) :]),
        }
    return table


class Genomes(DNASamples):
    """Which species a long DNA window comes from: 4 bacterial species, whole strains held out.

    Data: Debian ``ragout-examples`` (16 complete genomes, 48.2 Mbp). Strains per split: ``genome_strains``.
    Windows are drawn deterministically from (seed, split): item ``i`` has class ``i % 4``; its strain and
    record are chosen in proportion to the number of window positions, its start uniformly.

    Args:
        split: train, val or test.
        window: nucleotides per window (1 kb .. 64 kb and beyond).
        num_windows: items in the split; default 16,000 / 2,000 / 4,000.
        tokenizer, rc_prob, seed: as for ``FastaDataset``; seed also draws the windows.
        root: Debian root holding the package (see ``zoo.data._debian``).
    """

    def __init__(
        self,
        split: str,
        *,
        window: int = 1024,
        num_windows: int | None = None,
        tokenizer: DNATokenizer | None = None,
        rc_prob: float = 0.0,
        seed: int = 0,
        root: str | os.PathLike | None = None,
    ):
        self.split, self.window, self.seed = check_split(split), check_int("window", window, 1), seed
        self.num_windows = check_int("num_windows", num_windows or _DEFAULT_NUM_WINDOWS[split], 1)
        self.root = root
        self.strains = genome_strains(root)
        self.classes = tuple(self.strains)
        self._setup(tokenizer, rc_prob, seed)
        base = find_debian_file("ragout-examples", _RAGOUT_DIR, root=root)
        # records of this split, their "species/strain" names, and each window's (record, start)
        self.records, self.record_names = [], []
        self._index = np.zeros((self.num_windows, 2), dtype=np.int64)
        for label, species in enumerate(self.classes):
            segments = self._segments(base / species / "references", self.strains[species])
            rows = np.arange(label, self.num_windows, len(self.classes))
            rng = np.random.default_rng([seed, SPLITS.index(split), label])
            positions = np.array([max(hi - lo - window + 1, 0) for _, lo, hi in segments], dtype=np.float64)
            if positions.sum() == 0:
                raise ValueError(f"window={window} is longer than every {split} record of {species}")
            chosen = rng.choice(len(segments), size=len(rows), p=positions / positions.sum())
            offsets = (rng.random(len(rows)) * positions[chosen]).astype(np.int64)
            self._index[rows, 0] = [segments[c][0] for c in chosen]
            self._index[rows, 1] = [segments[c][1] for c in chosen] + offsets

    def _segments(self, folder: Path, strains: dict[str, tuple[str, ...]]) -> list[tuple[int, int, int]]:
        """(record id in ``self.records``, lo, hi) ranges of this split for one species."""
        split_strains = strains[self.split] or (strains["train"] if self.split == "val" else ())
        segments = []
        for strain in split_strains:
            for codes in _strain_records(str(folder / f"{strain}.fasta.gz")):
                lo, hi = 0, len(codes)
                if not strains["val"] and self.split in ("train", "val"):
                    cut = int(len(codes) * (1 - _VAL_TAIL))
                    lo, hi = (0, cut) if self.split == "train" else (cut, len(codes))
                segments.append((len(self.records), lo, hi))
                self.records.append(codes)
                self.record_names.append(f"{folder.parent.name}/{strain}")
        return segments

    def locate(self, index: int) -> tuple[str, int, int]:
        """Where item ``index`` comes from: ("species/strain", record number within the split, start)."""
        record, start = self._index[index]
        return self.record_names[record], int(record), int(start)

    def window_codes(self, index: int) -> tuple[np.ndarray, int]:
        """Nucleotide codes ``[window]`` of item ``index`` and its class, without tokens or augmentation."""
        record, start = self._index[index]
        return self.records[record][start : start + self.window], index % len(self.classes)

    def __len__(self) -> int:
        return self.num_windows

    def baselines(self, train_set: "Genomes") -> dict[str, dict[str, float]]:
        """The GC-content nearest-mean rule on this split, its means from ``train_set``'s windows."""
        accuracy = gc_nearest_mean_accuracy(
            self.split,
            window=self.window,
            num_windows=len(self),
            num_train_windows=len(train_set),
            seed=self.seed,
            root=self.root,
        )
        return {"gc_nearest_mean": {"top1": accuracy}}

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        return self._sample(*self.window_codes(index % len(self)))


def gc_content(codes: np.ndarray) -> float:
    """Share of G and C among the A/C/G/T letters of ``codes`` (N ignored); 0.5 when there are none."""
    counts = np.bincount(codes, minlength=5)[:4]
    return float((counts[1] + counts[2]) / counts.sum()) if counts.sum() else 0.5


def gc_nearest_mean_accuracy(
    split: str = "test",
    *,
    window: int = 1024,
    num_windows: int | None = None,
    num_train_windows: int | None = None,
    seed: int = 0,
    root: str | os.PathLike | None = None,
) -> float:
    """Accuracy of the composition baseline on ``Genomes(split, ...)``: each window gets the species whose
    mean GC content over the training windows is nearest to its own (chance 0.25). It gives the trained models a
    floor that needs no attention at all; what it reaches beside them: benchmarks/cpu/recipes.md."""
    train = Genomes("train", window=window, num_windows=num_train_windows, seed=seed, root=root)
    evaluated = Genomes(split, window=window, num_windows=num_windows, seed=seed, root=root)
    train_gc = np.array([gc_content(train.window_codes(i)[0]) for i in range(len(train))])
    train_labels = np.arange(len(train)) % train.num_classes
    means = np.array([train_gc[train_labels == c].mean() for c in range(train.num_classes)])  # [classes]
    gc = np.array([gc_content(evaluated.window_codes(i)[0]) for i in range(len(evaluated))])
    predicted = np.abs(gc[:, None] - means[None, :]).argmin(axis=1)
    return float((predicted == np.arange(len(evaluated)) % evaluated.num_classes).mean())


_YEAST_DIR = "var/lib/gbrowse/databases"
_YEAST_FASTA = {"chrI": "yeast_scaffolds/chr1.fa", "chrII": "yeast_scaffolds/chr2.fa"}
_YEAST_GFF = "yeast_chr1+2/yeast_chr1+2.gff3"
# (chromosome, first share, last share) of each split: chrI is the test chromosome; chrII's last 10% is val
_YEAST_REGIONS = {"train": ("chrII", 0.0, 0.9), "val": ("chrII", 0.9, 1.0), "test": ("chrI", 0.0, 1.0)}


def yeast_coding_labels(root: str | os.PathLike | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Chromosome -> (codes uint8 ``[L]``, labels int64 ``[L]``) from the SGD FASTA and GFF3 CDS rows.

    Labels: 0 non-coding, 1 coding on the + strand, 2 coding on the - strand, ``IGNORE_INDEX`` where CDS of
    both strands overlap. GFF3 coordinates are 1-based and inclusive.
    """
    base = find_debian_file("gbrowse-data", _YEAST_DIR, root=root)
    chromosomes = {}
    for name, rel in _YEAST_FASTA.items():
        records = read_fasta(base / rel)
        chromosomes[name] = records[0][1]
    covered = {name: np.zeros((2, len(codes)), dtype=bool) for name, codes in chromosomes.items()}
    gff = base / _YEAST_GFF
    if not gff.is_file():
        raise FileNotFoundError(f"yeast annotation {str(gff)!r} does not exist")
    for line in gff.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 8 and fields[2] == "CDS" and fields[0] in covered and fields[6] in "+-":
            covered[fields[0]][int(fields[6] == "-"), int(fields[3]) - 1 : int(fields[4])] = True
    result = {}
    for name, codes in chromosomes.items():
        plus, minus = covered[name]
        labels = np.where(plus & minus, IGNORE_INDEX, plus * 1 + minus * 2).astype(np.int64)
        result[name] = (codes, labels)
    return result


class YeastCoding(DNASamples):
    """Per-nucleotide gene structure on yeast chrI/chrII: non-coding (0), coding + (1), coding - (2).

    Data: Debian ``gbrowse-data`` (SGD sequence and GFF3 annotation). Split by chromosome and region: test is
    chrI (230,208 bp), val the last 10% of chrII, train the first 90% of chrII. The training region is tiled by
    windows of ``window`` nucleotides every ``stride`` (default ``window``); val and test always by non-overlapping
    windows, so that every position counts once in their per-position metrics. The last window may be shorter.
    Reverse complement (``rc_prob``) reverses the labels and swaps the two strands' classes.
    Samples: ``tokens`` int64 ``[N]``, ``mask`` bool ``[N]``, ``labels`` int64 ``[N]``.
    """

    classes = ("non-coding", "coding+", "coding-")

    def __init__(
        self,
        split: str,
        *,
        window: int = 4096,
        stride: int | None = None,
        tokenizer: DNATokenizer | None = None,
        rc_prob: float = 0.0,
        seed: int = 0,
        root: str | os.PathLike | None = None,
    ):
        self.split, self.window = check_split(split), check_int("window", window, 1)
        self.stride = check_int("stride", stride if stride is not None else window, 1)
        self._setup(tokenizer, rc_prob, seed)
        if self.tokenizer.k != 1:
            raise ValueError(f"per-nucleotide labels need a k=1 tokenizer, got k={self.tokenizer.k}")
        name, first, last = _YEAST_REGIONS[split]
        codes, labels = yeast_coding_labels(root)[name]
        lo, hi = int(len(codes) * first), int(len(codes) * last)
        self.codes, self.labels = codes[lo:hi], labels[lo:hi]
        self._starts = window_starts(hi - lo, self.window, self.stride if split == "train" else self.window)

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = self._starts[index]
        codes, labels = self.codes[start : start + self.window], self.labels[start : start + self.window]
        if self.augment is not None:
            codes, flipped = self.augment(codes)
            if flipped:
                labels = np.select([labels == 1, labels == 2], [2, 1], labels)[::-1]
        tokens = self.tokenizer(codes)
        if self.tokenizer.add_cls:
            labels = np.concatenate([[IGNORE_INDEX], labels])
        return {
            "tokens": tokens,
            "mask": torch.ones(len(tokens), dtype=torch.bool),
            "labels": torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)),
        }


_MLBENCH_DNA = "usr/lib/R/site-library/mlbench/data/DNA.rda"
_SPLICE_CACHE = "splice_statlog_v1.npz"
# fixed seed of the stratified split, independent of any training seed
_SPLICE_SPLIT_SEED = 19920101
_SPLICE_FRACTIONS = (0.7, 0.1, 0.2)


def _decode_one_hot(bits: np.ndarray) -> np.ndarray:
    """StatLog's 3 binary columns per base -> codes: (1,0,0)=A (0,1,0)=C (0,0,1)=G (0,0,0)=T.

    Args: bits uint8 ``[R, 180]``. Returns uint8 codes ``[R, 60]``.
    """
    triples = bits.reshape(len(bits), -1, 3)  # [R, 60, 3]
    if (triples.sum(axis=2) > 1).any():
        raise ValueError("DNA.rda holds a base with more than one bit set; it is not the StatLog encoding")
    # argmax picks A/C/G; an all-zero triple is T
    return np.where(triples.any(axis=2), triples.argmax(axis=2), 3).astype(np.uint8)


def _read_splice(root: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(codes uint8 ``[3186, 60]``, labels int64 ``[3186]``, class names) from DNA.rda, cached as npz."""
    path = cache_dir() / _SPLICE_CACHE
    if root is None and path.is_file():
        with np.load(path, allow_pickle=False) as data:
            return data["codes"], data["labels"], tuple(str(c) for c in data["classes"])
    rda = find_debian_file("r-cran-mlbench", _MLBENCH_DNA, root=root)
    try:
        import rdata
    except ImportError as err:
        raise ImportError("the splice data set reads DNA.rda with PyPI's rdata: `pip install rdata`") from err
    with warnings.catch_warnings():
        # DNA.rda declares no string encoding; its strings are ASCII
        warnings.simplefilter("ignore", UserWarning)
        frame = rdata.read_rda(str(rda))["DNA"]
    bits = np.stack([frame[f"V{i}"].astype(str).astype(np.uint8).to_numpy() for i in range(1, 181)], axis=1)
    classes = tuple(str(c) for c in frame["Class"].cat.categories)
    codes, labels = _decode_one_hot(bits), frame["Class"].cat.codes.to_numpy().astype(np.int64)
    if root is None:
        write_npz_atomic(path, codes=codes, labels=labels, classes=np.array(classes))
    return codes, labels, classes


class Splice(DNASamples):
    """StatLog primate splice junctions: 60-nt windows, classes ei (donor), ie (acceptor), n (neither).

    Data: Debian ``r-cran-mlbench``'s DNA.rda (3,186 rows), read with PyPI ``rdata`` and cached as npz.
    Split: stratified 70/10/20 from a fixed seed (2,231 / 318 / 637 rows). The junction lies between
    positions 30 and 31: ei windows carry the intron's GT at 31-32, ie windows its AG at 29-30.
    Reverse complement is not offered: it does not keep the class of a junction.
    """

    def __init__(self, split: str, *, tokenizer: DNATokenizer | None = None, root: str | os.PathLike | None = None):
        self.split = check_split(split)
        codes, labels, self.classes = _read_splice(root)
        self._setup(tokenizer, 0.0, 0)
        rows = stratified_split(labels, split, _SPLICE_FRACTIONS, _SPLICE_SPLIT_SEED)
        self.rows, self.codes, self.labels = rows, codes[rows], labels[rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self._sample(self.codes[index], int(self.labels[index]))


@dataclass(kw_only=True)
class GenomesOptions:
    """``data.options`` of genomes (see ``Genomes``; data.train_samples / val_samples / test_samples windows)."""

    window: int = field(default=1024, metadata={"min": 1})
    # reverse-complement augmentation, training split only
    rc_prob: float = field(default=0.0, metadata={"min": 0, "max": 1})


@register_dataset("genomes", options=GenomesOptions, kind="dna", tasks=_DNA_TASKS, root="optional")
def build_genomes(options: GenomesOptions, context: DataContext) -> Genomes:
    """Species of windows of 16 bacterial genomes (Debian ragout-examples; data.root: the Debian root)."""
    return Genomes(
        context.split,
        window=options.window,
        num_windows=context.num_samples,
        rc_prob=options.rc_prob if context.is_training else 0.0,
        seed=context.seed,
        root=context.root,
    )


@dataclass(kw_only=True)
class YeastCodingOptions:
    """``data.options`` of yeast_coding (see ``YeastCoding``)."""

    window: int = field(default=4096, metadata={"min": 1})
    # the training split's window step (null: window); val and test never overlap (each position counted once)
    stride: int | None = field(default=None, metadata={"min": 1})
    rc_prob: float = field(default=0.0, metadata={"min": 0, "max": 1})


@register_dataset(
    "yeast_coding",
    options=YeastCodingOptions,
    kind="dna",
    tasks=("token_classification", "causal_lm"),
    root="optional",
)
def build_yeast_coding(options: YeastCodingOptions, context: DataContext) -> YeastCoding:
    """Per-nucleotide coding labels of yeast chrI-II (Debian gbrowse-data; data.root: the Debian root)."""
    return YeastCoding(
        context.split,
        window=options.window,
        stride=options.stride,
        rc_prob=options.rc_prob if context.is_training else 0.0,
        seed=context.seed,
        root=context.root,
    )


@dataclass(kw_only=True)
class SpliceOptions:
    """splice takes no ``data.options``: its windows and split are fixed."""


@register_dataset("splice", options=SpliceOptions, kind="dna", tasks=_DNA_TASKS, root="optional")
def build_splice(options: SpliceOptions, context: DataContext) -> Splice:
    """StatLog primate splice junctions (Debian r-cran-mlbench; data.root: the Debian root)."""
    return Splice(context.split, root=context.root)
