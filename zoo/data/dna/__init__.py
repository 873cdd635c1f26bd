"""DNA: nucleotide tokens and FASTA reading (`nucleotides`), users' FASTA files and the Genomic Benchmarks
layout (`fasta`), the real sets Debian packages ship (`packaged`).
"""
