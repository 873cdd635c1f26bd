"""DNA data: tokens, reverse complement, users' FASTA / Genomic Benchmarks files, padding, and the three real
data sets from Debian packages (genomes, yeast coding, splice), loaded with every socket call blocked."""

import gzip

import numpy as np
import pytest
import torch

from zoo.data import _debian as debian
from zoo.data.collate import IGNORE_INDEX, PadCollate, pad_sequences, window_starts
from zoo.data.dna.fasta import FastaDataset, GenomicBenchmarksDataset
from zoo.data.dna.packaged import (
    CLS_ID,
    PAD_ID,
    DNATokenizer,
    Genomes,
    ReverseComplement,
    Splice,
    YeastCoding,
    encode_nucleotides,
    gc_nearest_mean_accuracy,
    genome_strains,
    read_fasta,
    reverse_complement,
    yeast_coding_labels,
)

# Every test here runs with socket connects and name lookups raising.
pytestmark = pytest.mark.usefixtures("no_network")


def needs(package: str):
    return pytest.mark.skipif(
        not debian.is_available(package), reason=f"Debian data package missing: {debian.install_hint(package)}"
    )


def test_network_is_blocked():
    import socket

    with pytest.raises(RuntimeError, match="network access"):
        socket.getaddrinfo("localhost", 80)


def _text(tokens) -> str:
    return DNATokenizer().decode(tokens)


def test_nucleotide_ids_are_fixed():
    tokenizer = DNATokenizer()
    assert tokenizer(encode_nucleotides("ACGTNacgtx")).tolist() == [3, 4, 5, 6, 7, 3, 4, 5, 6, 7]
    assert tokenizer.vocab_size == 8 and (PAD_ID, CLS_ID) == (0, 1)
    with_cls = DNATokenizer(add_cls=True)(encode_nucleotides("GA"))
    assert with_cls.tolist() == [CLS_ID, 5, 3] and with_cls.dtype == torch.int64


def test_kmer_tokens_overlapping_and_not():
    codes = encode_nucleotides("ACGTA")
    overlapping = DNATokenizer(k=2)
    # AC=1, CG=6, GT=11, TA=12 in base 4, plus the 3 special ids
    assert overlapping(codes).tolist() == [4, 9, 14, 15]
    assert overlapping.vocab_size == 20 and overlapping.num_tokens(5) == 4
    assert DNATokenizer(k=2, overlapping=False)(codes).tolist() == [4, 14]
    assert DNATokenizer(k=3)(encode_nucleotides("ANGT")).tolist() == [3 + 64, 3 + 64]
    assert len(DNATokenizer(k=4)(encode_nucleotides("ACG"))) == 0
    with pytest.raises(ValueError, match="k must be"):
        DNATokenizer(k=0)


def test_reverse_complement_and_seeded_augmentation():
    assert _text(DNATokenizer()(reverse_complement(encode_nucleotides("AACGTN")))) == "NACGTT"
    codes = encode_nucleotides("AAAC")
    assert ReverseComplement(1.0)(codes)[1] and not ReverseComplement(0.0)(codes)[1]
    augments = [ReverseComplement(0.5, seed=seed) for seed in (3, 3, 4)]
    flips = [[augment(codes)[1] for _ in range(64)] for augment in augments]
    assert flips[0] == flips[1] and flips[0] != flips[2] and 16 < sum(flips[0]) < 48
    with pytest.raises(ValueError, match="probability"):
        ReverseComplement(1.5)


def test_window_starts():
    assert window_starts(10, 8, 4).tolist() == [0, 4]
    assert window_starts(16, 8, 8).tolist() == [0, 8]
    assert window_starts(17, 8, 8).tolist() == [0, 8, 16]
    assert window_starts(17, 8, 8, min_length=2).tolist() == [0, 8]
    assert window_starts(5, 8, 8).tolist() == [0]


FASTA = ">rec1 first\r\nACGTACGTAC\r\nacgtn\r\n\n>rec2\nGGGG\n"


def test_read_fasta_plain_and_gz(tmp_path):
    plain, packed = tmp_path / "x.fa", tmp_path / "x.fa.gz"
    plain.write_text(FASTA)
    packed.write_bytes(gzip.compress(FASTA.encode()))
    for path in (plain, packed):
        records = read_fasta(path)
        assert [name for name, _ in records] == ["rec1 first", "rec2"]
        assert _text(DNATokenizer()(records[0][1])) == "ACGTACGTACACGTN" and len(records[1][1]) == 4
    with pytest.raises(FileNotFoundError, match="nope.fa"):
        read_fasta(tmp_path / "nope.fa")


def _fasta_tree(root):
    (root / "train" / "phage").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "train" / "ecoli.fasta").write_text(">a\n" + "A" * 20 + "\n")
    (root / "train" / "phage" / "p1.fa.gz").write_bytes(gzip.compress(b">p1\nCCCCCC\n>p2\nGGGGGGGGGG\n"))
    (root / "test" / "phage.fna").write_text(">t\nTTTTTTTTT\n")


def test_fasta_dataset_classes_windows_and_collate(tmp_path):
    _fasta_tree(tmp_path)
    train = FastaDataset(tmp_path, "train", window=8, stride=6)
    assert train.classes == ("ecoli", "phage")
    # ecoli: 20 nt -> starts 0, 6, 12; p1: 6 nt -> one short window; p2: 10 nt -> starts 0, 6
    assert len(train) == 6
    lengths = [len(train[i]["tokens"]) for i in range(len(train))]
    assert lengths == [8, 8, 8, 6, 8, 4]
    assert [int(train[i]["label"]) for i in range(len(train))] == [0, 0, 0, 1, 1, 1]
    test = FastaDataset(tmp_path, "test", window=4)
    assert test.classes == train.classes and int(test[0]["label"]) == 1 and len(test) == 3
    batch = PadCollate(pad_to_multiple=16)([train[3], train[0], train[5]])
    assert batch["tokens"].shape == (3, 16) and batch["label"].tolist() == [1, 0, 1]
    assert batch["mask"].sum(1).tolist() == [6, 8, 4]
    assert (batch["tokens"][~batch["mask"]] == PAD_ID).all() and (batch["tokens"][batch["mask"]] >= 3).all()
    with pytest.raises(FileNotFoundError, match="missing-root"):
        FastaDataset(tmp_path / "missing-root", window=8)


def test_genomic_benchmarks_layout(tmp_path):
    for split, rows in {
        "train": {"negative": ["ACGT", "TTTT"], "positive": ["GGGGCC"]},
        "test": {"positive": ["CA"]},
    }.items():
        for name, sequences in rows.items():
            (tmp_path / split / name).mkdir(parents=True)
            for i, seq in enumerate(sequences):
                (tmp_path / split / name / f"{i}.txt").write_text(seq + "\n")
    train = GenomicBenchmarksDataset(tmp_path, "train", max_length=5)
    assert train.classes == ("negative", "positive") and len(train) == 3
    assert [_text(train[i]["tokens"]) for i in range(3)] == ["ACGT", "TTTT", "GGGGC"]
    assert [int(train[i]["label"]) for i in range(3)] == [0, 0, 1]
    test = GenomicBenchmarksDataset(tmp_path, "test")
    assert int(test[0]["label"]) == 1
    with pytest.raises(FileNotFoundError, match="valid"):
        GenomicBenchmarksDataset(tmp_path, "valid")


def test_padding_masks_and_values():
    padded, mask = pad_sequences([torch.tensor([5, 6, 7]), torch.tensor([3])], 0, pad_to_multiple=4)
    assert padded.tolist() == [[5, 6, 7, 0], [3, 0, 0, 0]]
    assert mask.tolist() == [[True, True, True, False], [True, False, False, False]]
    samples = [
        {"tokens": torch.tensor([3, 4]), "labels": torch.tensor([1, 2])},
        {"tokens": torch.tensor([5]), "labels": torch.tensor([0])},
    ]
    batch = PadCollate()(samples)
    assert batch["labels"].tolist() == [[1, 2], [0, IGNORE_INDEX]]
    assert batch["mask"].tolist() == [[True, True], [True, False]]
    with pytest.raises(ValueError, match="shapes"):
        PadCollate()([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])


@needs("ragout-examples")
def test_genomes_strains_held_out():
    strains = genome_strains()
    assert sorted(strains) == ["E.Coli", "H.Pylori", "S.Aureus", "V.Cholerae"]
    assert sum(len(names) for table in strains.values() for names in table.values()) == 16
    for species, table in strains.items():
        assert len(table["test"]) == 1 and not set(table["test"]) & set(table["train"])
        assert not set(table["val"]) & (set(table["train"]) | set(table["test"]))
        assert len(table["val"]) == (0 if species == "E.Coli" else 1)
    test = Genomes("test", window=1024, num_windows=8)
    train = Genomes("train", window=2048, num_windows=8)
    used_test = {test.locate(i)[0] for i in range(8)}
    assert used_test == {f"{species}/{table['test'][0]}" for species, table in strains.items()}
    assert not set(train.record_names) & set(test.record_names)


@needs("ragout-examples")
def test_genomes_items_deterministic_and_long():
    test = Genomes("test", window=1024, num_windows=8)
    sample = test[5]
    assert sample["tokens"].shape == (1024,) and sample["mask"].all() and int(sample["label"]) == 1
    assert ((sample["tokens"] >= 3) & (sample["tokens"] <= 7)).all()
    assert torch.equal(Genomes("test", window=1024, num_windows=8)[5]["tokens"], sample["tokens"])
    assert not torch.equal(Genomes("test", window=1024, num_windows=8, seed=1)[5]["tokens"], sample["tokens"])
    assert [int(test[i]["label"]) for i in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    long = Genomes("val", window=65536, num_windows=4, tokenizer=DNATokenizer(k=4, overlapping=False))
    assert long[0]["tokens"].shape == (16384,)
    # E. coli has no val strain: its val windows lie in the last 10% of the train strain, which train never uses
    name, record, start = long.locate(0)
    length = len(long.records[record])
    assert name == "E.Coli/MG1655-K12" and start >= int(0.9 * length) and start + 65536 <= length


@needs("ragout-examples")
def test_gc_baseline_beats_chance():
    accuracy = gc_nearest_mean_accuracy(window=1024, num_windows=400, num_train_windows=400)
    assert 0.55 < accuracy < 0.9


def _cds_rows():
    gff = debian.find_debian_file("gbrowse-data", "var/lib/gbrowse/databases/yeast_chr1+2/yeast_chr1+2.gff3")
    rows = [line.split("\t") for line in gff.read_text().splitlines() if "\tCDS\t" in line]
    return [(f[0], int(f[3]), int(f[4]), f[6]) for f in rows]


@needs("gbrowse-data")
def test_yeast_labels_follow_gff_coordinates():
    chromosomes = yeast_coding_labels()
    codes, labels = chromosomes["chrI"]
    assert len(codes) == 230_208 and len(chromosomes["chrII"][0]) == 813_178
    # first CDS row: chrI 335..649 on +, 1-based inclusive
    assert labels[333] == 0 and (labels[334:649] == 1).all() and labels[1806] == 2
    rows = _cds_rows()
    assert len(rows) == 616
    starts_atg = []
    for chrom, start, end, strand in rows:
        seq = DNATokenizer().decode(DNATokenizer()(chromosomes[chrom][0][start - 1 : end]))
        starts_atg.append(seq.startswith("ATG") if strand == "+" else seq.endswith("CAT"))
    # most CDS rows are whole single-exon genes: ATG at the 5' end on their strand proves the coordinates
    assert np.mean(starts_atg) > 0.85
    coding = np.isin(labels, (1, 2)).mean()
    assert 0.5 < coding < 0.9


@needs("gbrowse-data")
def test_yeast_windows_splits_and_reverse_complement():
    test = YeastCoding("test", window=4096)
    assert len(test) == 57 and len(test[56]["tokens"]) == 230_208 - 56 * 4096
    # overlapping windows for training only: evaluation counts every position once
    assert len(YeastCoding("test", window=4096, stride=512)) == 57
    assert len(YeastCoding("train", window=4096, stride=512)) > 7 * len(YeastCoding("train", window=4096))
    train, val = YeastCoding("train", window=65536), YeastCoding("val", window=65536)
    assert len(train.codes) + len(val.codes) == 813_178
    sample = train[0]
    assert sample["tokens"].shape == sample["labels"].shape == (65536,)
    assert set(sample["labels"].unique().tolist()) <= {0, 1, 2, IGNORE_INDEX}
    flipped = YeastCoding("train", window=65536, rc_prob=1.0)[0]
    assert _text(flipped["tokens"]) == _text(DNATokenizer()(reverse_complement(train.codes[:65536])))
    swap = torch.tensor([0, 2, 1])
    labels = sample["labels"]
    expected = torch.where(labels >= 0, swap[labels.clamp(min=0)], labels).flip(0)
    assert torch.equal(flipped["labels"], expected)
    with pytest.raises(ValueError, match="k=1"):
        YeastCoding("test", tokenizer=DNATokenizer(k=3))


FIRST_SPLICE_ROW = "CTAGGCTCCAGATAGCCATAGAAGAACCAAACACTTTCTGCGTGTGTGAGAATAATCAGA"


@needs("r-cran-mlbench")
def test_splice_decoding_from_rda(tmp_path, monkeypatch):
    monkeypatch.setenv(debian.DEBIAN_ROOT_ENV, str(debian.package_root("r-cran-mlbench")))
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path))
    fresh = Splice("train")
    assert (tmp_path / "splice_statlog_v1.npz").is_file()
    cached = Splice("train")
    assert torch.equal(fresh[0]["tokens"], cached[0]["tokens"]) and fresh.classes == ("ei", "ie", "n")
    codes, labels = fresh.codes, fresh.labels
    everything = np.concatenate([Splice(split).rows for split in ("train", "val", "test")])
    assert sorted(everything.tolist()) == list(range(3186))
    assert fresh.rows[0] == 0 and _text(fresh[0]["tokens"]) == FIRST_SPLICE_ROW and fresh.classes[labels[0]] == "n"
    text = np.array([_text(DNATokenizer()(row)) for row in codes])
    donors, acceptors = text[labels == 0], text[labels == 1]
    # the junction lies between positions 30 and 31: introns start with GT and end with AG
    assert np.mean([s[30:32] == "GT" for s in donors]) > 0.95
    assert np.mean([s[28:30] == "AG" for s in acceptors]) > 0.95


@needs("r-cran-mlbench")
def test_splice_split_sizes_and_strata():
    sizes = {split: len(Splice(split)) for split in ("train", "val", "test")}
    assert sizes == {"train": 2231, "val": 318, "test": 637}
    test = Splice("test")
    assert np.bincount(test.labels).tolist() == [153, 153, 331]
    assert test[0]["tokens"].shape == (60,) and test.num_classes == 3


def test_missing_debian_package_says_how_to_install(tmp_path):
    with pytest.raises(debian.MissingDebianData, match=r"apt-get install -y ragout-examples.*dpkg -x"):
        genome_strains(root=tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        Splice("train", root=tmp_path)
