"""DNA at nucleotide level: tokens, reverse-complement augmentation, users' files and three real data sets.

Token ids are fixed: ``PAD=0, CLS=1, MASK=2``, then one id per k-mer over ACGT in lexicographic order and
one last id for any k-mer holding another letter (N, IUPAC codes). For k=1: ``A=3, C=4, G=5, T=6, N=7``.

Users' data (never downloaded): FASTA / FASTA.gz files (``FastaDataset``, one class per file or per folder,
records cut into windows) and the Genomic Benchmarks layout (``GenomicBenchmarksDataset``).

Real data from Debian packages (found by ``zoo.data.debian``; ``make data-deps`` extracts them):

- ``Genomes``: species of long windows of 16 bacterial genomes (``ragout-examples``), whole strains held out.
- ``YeastCoding``: per-nucleotide coding+/coding-/non-coding labels on yeast chrI and chrII (``gbrowse-data``).
- ``Splice``: StatLog primate splice junctions, 3,186 x 60 nt (``r-cran-mlbench``, read with PyPI ``rdata``).

Samples are dicts: ``tokens`` int64 ``[N]``, ``mask`` bool ``[N]`` (True = keep), and ``label`` int64 ``[]``
or ``labels`` int64 ``[N]``; batch them with ``zoo.data.sequence.PadCollate``.
"""

import gzip
import os
import re
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .debian import cache_dir, find_debian_file
from .sequence import (
    IGNORE_INDEX,
    SPLITS,
    check_positive_int,
    check_split,
    stratified_split,
    window_starts,
    write_npz_atomic,
)

__all__ = [
    "CLS_ID",
    "MASK_ID",
    "PAD_ID",
    "DNATokenizer",
    "FastaDataset",
    "Genomes",
    "GenomicBenchmarksDataset",
    "ReverseComplement",
    "Splice",
    "YeastCoding",
    "encode_nucleotides",
    "gc_content",
    "gc_nearest_mean_accuracy",
    "genome_strains",
    "read_fasta",
    "reverse_complement",
    "yeast_coding_labels",
]


PAD_ID, CLS_ID, MASK_ID = 0, 1, 2
NUM_SPECIAL = 3
NUCLEOTIDES = "ACGT"
# nucleotide codes used inside this module: A=0 C=1 G=2 T=3, anything else 4 (lower case = soft-masked, same base)
OTHER_CODE = 4
_CODE_OF_BYTE = np.full(256, OTHER_CODE, dtype=np.uint8)
for _code, _base in enumerate(NUCLEOTIDES):
    _CODE_OF_BYTE[ord(_base)] = _CODE_OF_BYTE[ord(_base.lower())] = _code
_COMPLEMENT = np.array([3, 2, 1, 0, OTHER_CODE], dtype=np.uint8)
_FASTA_SUFFIX = re.compile(r"\.(fa|fasta|fna|fas|ffn|frn|seq)(\.gz)?$", re.IGNORECASE)


def encode_nucleotides(sequence: str | bytes) -> np.ndarray:
    """Letters -> uint8 codes ``[L]`` (A=0 C=1 G=2 T=3, other=4); case-insensitive, no whitespace allowed."""
    raw = sequence.encode("ascii", "replace") if isinstance(sequence, str) else bytes(sequence)
    return _CODE_OF_BYTE[np.frombuffer(raw, dtype=np.uint8)]


def reverse_complement(codes: np.ndarray) -> np.ndarray:
    """Reverse complement of nucleotide codes ``[L]`` (N stays N)."""
    return _COMPLEMENT[codes[::-1]]


class DNATokenizer:
    """Nucleotide codes -> token ids, one per nucleotide (k=1) or per k-mer.

    Args:
        k: k-mer length; 1 is nucleotide level.
        overlapping: k-mers start at every position (``L - k + 1`` tokens) when True, every k positions
            (``L // k`` tokens, a tail shorter than k dropped) when False.
        add_cls: prepend ``CLS_ID``.
    """

    def __init__(self, *, k: int = 1, overlapping: bool = True, add_cls: bool = False):
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 8:
            raise ValueError(f"k must be an integer in 1..8, got {k!r}")
        self.k, self.overlapping, self.add_cls = k, bool(overlapping), bool(add_cls)
        self.other_id = NUM_SPECIAL + 4**k
        self.vocab_size = self.other_id + 1
        self._weights = 4 ** np.arange(k - 1, -1, -1, dtype=np.int64)  # [k], base-4 place values

    def num_tokens(self, length: int) -> int:
        """Tokens made from ``length`` nucleotides."""
        kmers = max(length - self.k + 1, 0) if self.overlapping else length // self.k
        return kmers + self.add_cls

    def __call__(self, codes: np.ndarray) -> torch.Tensor:
        """uint8 codes ``[L]`` -> int64 token ids ``[num_tokens(L)]``."""
        codes = np.asarray(codes, dtype=np.int64)
        if self.k == 1:
            ids = codes + NUM_SPECIAL
        else:
            stride = 1 if self.overlapping else self.k
            usable = codes[: len(codes) - len(codes) % self.k] if not self.overlapping else codes
            if len(usable) < self.k:
                ids = np.zeros(0, dtype=np.int64)
            else:
                kmers = np.lib.stride_tricks.sliding_window_view(usable, self.k)[::stride]  # [T, k]
                ids = np.where((kmers == OTHER_CODE).any(axis=1), self.other_id, kmers @ self._weights + NUM_SPECIAL)
        if self.add_cls:
            ids = np.concatenate([[CLS_ID], ids])
        return torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))

    def decode(self, tokens: torch.Tensor) -> str:
        """Token ids of a k=1 tokenizer -> letters (N for other; specials dropped)."""
        if self.k != 1:
            raise ValueError(f"decode needs k=1, this tokenizer has k={self.k}")
        letters = np.frombuffer(b"ACGTN", dtype=np.uint8)
        ids = np.asarray(tokens) - NUM_SPECIAL
        return letters[ids[ids >= 0]].tobytes().decode()

    def __repr__(self) -> str:
        return f"DNATokenizer(k={self.k}, overlapping={self.overlapping}, add_cls={self.add_cls})"


class ReverseComplement:
    """Reverse-complement augmentation applied with probability ``p``, from a seeded generator.

    The stream is seeded by ``seed`` in the main process and by ``(seed, worker seed)`` in each DataLoader
    worker, so workers draw different flips, each epoch anew, and a run is reproducible given torch's seed.
    """

    def __init__(self, p: float = 0.5, *, seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"reverse-complement probability must be in [0, 1], got {p!r}")
        self.p, self.seed = float(p), int(seed)
        self._rng, self._worker_seed = None, None

    def _generator(self) -> np.random.Generator:
        info = torch.utils.data.get_worker_info()
        worker_seed = None if info is None else info.seed
        if self._rng is None or worker_seed != self._worker_seed:
            entropy = [self.seed] if worker_seed is None else [self.seed, worker_seed]
            self._rng, self._worker_seed = np.random.default_rng(entropy), worker_seed
        return self._rng

    def __call__(self, codes: np.ndarray) -> tuple[np.ndarray, bool]:
        """Codes ``[L]`` -> (codes or their reverse complement ``[L]``, whether it was flipped)."""
        if self.p == 0.0 or self._generator().random() >= self.p:
            return codes, False
        return reverse_complement(codes), True


def _read_bytes(path: str | os.PathLike) -> bytes:
    """Whole file, gunzipped when it starts with the gzip magic; FileNotFoundError names the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sequence file {str(path)!r} does not exist")
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def read_fasta(path: str | os.PathLike) -> list[tuple[str, np.ndarray]]:
    """Records of a FASTA or FASTA.gz file as ``(header, codes uint8 [L])``, in file order."""
    text = _read_bytes(path)
    if not text.lstrip().startswith(b">"):
        raise ValueError(f"{str(path)!r} is not a FASTA file: it does not start with a '>' header")
    records = []
    for chunk in text.lstrip()[1:].split(b"\n>"):
        header, _, body = chunk.partition(b"\n")
        codes = _CODE_OF_BYTE[np.frombuffer(body.translate(None, b" \t\r\n"), dtype=np.uint8)]
        records.append((header.decode(errors="replace").strip(), codes))
    return records


class _DNABase(Dataset):
    """Tokenises nucleotide codes, with optional reverse-complement augmentation, into sample dicts."""

    classes: tuple[str, ...] = ()

    def _setup(self, tokenizer: DNATokenizer | None, rc_prob: float, seed: int) -> None:
        self.tokenizer = tokenizer if tokenizer is not None else DNATokenizer()
        self.augment = ReverseComplement(rc_prob, seed=seed) if rc_prob > 0 else None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def _sample(self, codes: np.ndarray, label: int) -> dict[str, torch.Tensor]:
        """``tokens`` int64 ``[N]``, ``mask`` bool ``[N]`` (all True) and ``label`` int64 ``[]``."""
        if self.augment is not None:
            codes, _ = self.augment(codes)
        tokens = self.tokenizer(codes)
        return {"tokens": tokens, "mask": torch.ones(len(tokens), dtype=torch.bool), "label": torch.tensor(label)}


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


class FastaDataset(_DNABase):
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
        self.window = check_positive_int("window", window)
        self.stride = check_positive_int("stride", stride if stride is not None else window)
        check_positive_int("min_length", min_length)
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


class GenomicBenchmarksDataset(_DNABase):
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
        self.max_length = None if max_length is None else check_positive_int("max_length", max_length)
        self._setup(tokenizer, rc_prob, seed)
        self.sequences, self.labels = [], []
        for class_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if class_dir.name not in self.classes:
                raise ValueError(f"class folder {str(class_dir)!r} is not a class of {str(index_dir)!r}")
            for path in sorted(class_dir.glob("*.txt")):
                codes = encode_nucleotides(_read_bytes(path).translate(None, b" \t\r\n"))
                self.sequences.append(codes[: self.max_length])
                self.labels.append(self.classes.index(class_dir.name))
        if not self.sequences:
            raise ValueError(f"no *.txt sequences in the class folders of {str(folder)!r}")

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self._sample(self.sequences[index], self.labels[index])


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


class Genomes(_DNABase):
    """Which species a long DNA window comes from: 4 bacterial species, whole strains held out.

    Data: Debian ``ragout-examples`` (16 complete genomes, 48.2 Mbp). Strains per split: ``genome_strains``.
    Windows are drawn deterministically from (seed, split): item ``i`` has class ``i % 4``; its strain and
    record are chosen in proportion to the number of window positions, its start uniformly.

    Args:
        split: train, val or test.
        window: nucleotides per window (1 kb .. 64 kb and beyond).
        num_windows: items in the split; default 16,000 / 2,000 / 4,000.
        tokenizer, rc_prob, seed: as for ``FastaDataset``; seed also draws the windows.
        root: Debian root holding the package (see ``zoo.data.debian``).
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
        self.split, self.window, self.seed = check_split(split), check_positive_int("window", window), seed
        self.num_windows = check_positive_int("num_windows", num_windows or _DEFAULT_NUM_WINDOWS[split])
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
    mean GC content over the training windows is nearest to its own (about 0.71 at 1 kb; chance 0.25)."""
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


class YeastCoding(_DNABase):
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
        self.split, self.window = check_split(split), check_positive_int("window", window)
        self.stride = check_positive_int("stride", stride if stride is not None else window)
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


class Splice(_DNABase):
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
