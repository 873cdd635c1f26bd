"""Nucleotides: letter codes, tokens (one per nucleotide or per k-mer), reverse complement, FASTA reading, and the
base of every DNA dataset of zoo.

Token ids are fixed: ``PAD=0, CLS=1, MASK=2``, then one id per k-mer over ACGT in lexicographic order and
one last id for any k-mer holding another letter (N, IUPAC codes). For k=1: ``A=3, C=4, G=5, T=6, N=7``.

Samples are dicts: ``tokens`` int64 ``[N]``, ``mask`` bool ``[N]`` (True = keep), and ``label`` int64 ``[]``
or ``labels`` int64 ``[N]``; batch them with ``zoo.data.collate.PadCollate``.

Users' sequences are checked against the IUPAC nucleotide alphabet (``check_nucleotides``), any case: A C G T, U
(RNA, read as T), N and the ambiguity codes R Y S W K M B D H V (read as N); alignment gaps ``-`` and ``.`` are
dropped (the sequence without them); whitespace is ignored. Any other character (a protein's E F I L P Q, a digit,
binary bytes) is an error naming the file, the record and the position, and so is a record most of whose letters
are ambiguity codes (a protein written only in letters that are also IUPAC codes).
"""

import gzip
import os
import zlib
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .._streams import WorkerStream

__all__ = [
    "CLS_ID",
    "IUPAC_CODES",
    "MASK_ID",
    "NUCLEOTIDES",
    "PAD_ID",
    "DNASamples",
    "DNATokenizer",
    "ReverseComplement",
    "check_nucleotides",
    "encode_nucleotides",
    "read_fasta",
    "read_sequence_file",
    "reverse_complement",
]


PAD_ID, CLS_ID, MASK_ID = 0, 1, 2
NUM_SPECIAL = 3
NUCLEOTIDES = "ACGT"
# nucleotide codes used inside this module: A=0 C=1 G=2 T=3, anything else 4 (lower case = soft-masked, same base)
OTHER_CODE = 4
_CODE_OF_BYTE = np.full(256, OTHER_CODE, dtype=np.uint8)
for _code, _base in enumerate(NUCLEOTIDES + "U"):
    # U (RNA) is T
    _CODE_OF_BYTE[ord(_base)] = _CODE_OF_BYTE[ord(_base.lower())] = min(_code, 3)
_COMPLEMENT = np.array([3, 2, 1, 0, OTHER_CODE], dtype=np.uint8)

# IUPAC nucleotide codes: bases, N (any base), ambiguity codes; gaps and whitespace are dropped before encoding
IUPAC_CODES = "ACGTUNRYSWKMBDHV"
_AMBIGUOUS = "RYSWKMBDHV"
_GAPS, _WHITESPACE = b"-.", b" \t\r\n\v\f"
_INVALID, _BASE, _AMBIGUITY, _GAP = 0, 1, 2, 3
_KIND_OF_BYTE = np.full(256, _INVALID, dtype=np.uint8)
for _letter in IUPAC_CODES:
    _KIND_OF_BYTE[[ord(_letter), ord(_letter.lower())]] = _AMBIGUITY if _letter in _AMBIGUOUS else _BASE
_KIND_OF_BYTE[list(_GAPS)] = _GAP


def encode_nucleotides(sequence: str | bytes) -> np.ndarray:
    """Letters -> uint8 codes ``[L]`` (A=0 C=1 G=2 T=3, other=4); case-insensitive, no whitespace allowed."""
    raw = sequence.encode("ascii", "replace") if isinstance(sequence, str) else bytes(sequence)
    return _CODE_OF_BYTE[np.frombuffer(raw, dtype=np.uint8)]


def check_nucleotides(raw: bytes, where: str) -> np.ndarray:
    """IUPAC letters -> uint8 codes ``[L]`` as ``encode_nucleotides``, gaps and whitespace dropped, once every
    character is a IUPAC code and at most half the letters ambiguity codes; a ValueError naming ``where`` (the file
    and record) and the first bad character otherwise."""
    body = np.frombuffer(raw.translate(None, _WHITESPACE), dtype=np.uint8)
    kinds = _KIND_OF_BYTE[body]
    invalid = np.flatnonzero(kinds == _INVALID)
    if len(invalid):
        at = int(invalid[0])
        char = bytes(body[at : at + 1]).decode("latin-1")
        share = f"{len(invalid) / len(body):.0%} of its characters are not" if len(invalid) > 1 else "not"
        raise ValueError(
            f"{where}: {char!r} at position {at + 1} is not a nucleotide ({share} IUPAC codes "
            f"{IUPAC_CODES}, any case; gaps - and .): is it a protein or binary file?"
        )
    letters, ambiguous = int((kinds != _GAP).sum()), int((kinds == _AMBIGUITY).sum())
    if ambiguous * 2 > letters:
        raise ValueError(
            f"{where}: {ambiguous} of its {letters} letters are ambiguity codes ({_AMBIGUOUS}), not bases: "
            "is it a protein file?"
        )
    return _CODE_OF_BYTE[body[kinds != _GAP]]


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
        self._generator = WorkerStream(seed)

    def __call__(self, codes: np.ndarray) -> tuple[np.ndarray, bool]:
        """Codes ``[L]`` -> (codes or their reverse complement ``[L]``, whether it was flipped)."""
        if self.p == 0.0 or self._generator().random() >= self.p:
            return codes, False
        return reverse_complement(codes), True


def read_sequence_file(path: str | os.PathLike) -> bytes:
    """Whole file, gunzipped when it starts with the gzip magic; FileNotFoundError names the path, a ValueError a
    truncated or corrupt gzip file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sequence file {str(path)!r} does not exist")
    raw = path.read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as error:
        reason = "truncated (a copy or download cut short?)" if isinstance(error, EOFError) else f"corrupt ({error})"
        raise ValueError(f"{str(path)!r}: gzip file {reason}") from None


def read_fasta(path: str | os.PathLike) -> list[tuple[str, np.ndarray]]:
    """Records of a FASTA or FASTA.gz file as ``(header, codes uint8 [L])``, in file order, each checked by
    ``check_nucleotides`` (an error names the file and the first bad record)."""
    text = read_sequence_file(path)
    if not text.lstrip().startswith(b">"):
        raise ValueError(f"{str(path)!r} is not a FASTA file: it does not start with a '>' header")
    records = []
    for number, chunk in enumerate(text.lstrip()[1:].split(b"\n>"), start=1):
        header, _, body = chunk.partition(b"\n")
        name = header.decode(errors="replace").strip()
        shown = name if len(name) <= 40 else name[:37] + "..."
        records.append((name, check_nucleotides(body, f"{str(path)!r} record {number} ('>{shown}')")))
    return records


class DNASamples(Dataset):
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
