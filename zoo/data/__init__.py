"""Datasets that load with no network, each registered by name in its own module (see ``_registry.py``).

A dataset module calls ``register_dataset``; this file imports it, and the import order is the order of
``list_datasets()``. ``build_dataset(name, DataContext(split, ...), **options)`` builds any of them; image sets give
``(image [C, H, W] float32, label int)`` pairs, the 1-D ones dict samples (``tokens`` or ``values``, ``mask``, and
``label`` / ``labels`` / ``target``, see ``zoo.data.collate``), all batched as dicts by ``collate_for(kind)``.
"""

# One line per dataset module, in the order of list_datasets().
# isort: off
from .images import megamnist  # noqa: F401
from .images import folder  # noqa: F401
from .images import mask_folder  # noqa: F401
from .images import recall2d  # noqa: F401
from .images import native  # noqa: F401
from .dna import packaged  # noqa: F401
from .dna import fasta  # noqa: F401
from .series import classification  # noqa: F401
from .series import forecast  # noqa: F401
from .tokens import listops, lra_image, pathfinder  # noqa: F401
from .tokens import recall  # noqa: F401

# isort: on
from ._registry import (
    INPUT_KINDS,
    DataContext,
    DatasetSpec,
    build_dataset,
    collate_for,
    get_dataset,
    list_datasets,
    register_dataset,
)
from .collate import PadCollate
from .dna.fasta import FastaDataset, GenomicBenchmarksDataset
from .dna.packaged import DNATokenizer, Genomes, ReverseComplement, Splice, YeastCoding, gc_nearest_mean_accuracy
from .images.folder import ImageFolderDataset
from .images.megamnist import MegaMNIST
from .series.classification import UCR, CsvSeriesDataset, TsFileDataset, bundled_ucr_names, read_ts
from .series.forecast import Elecdemand, ForecastWindows, linear_forecast_scores, seasonal_naive_scores

__all__ = [
    "INPUT_KINDS",
    "UCR",
    "CsvSeriesDataset",
    "DNATokenizer",
    "DataContext",
    "DatasetSpec",
    "Elecdemand",
    "FastaDataset",
    "ForecastWindows",
    "Genomes",
    "GenomicBenchmarksDataset",
    "ImageFolderDataset",
    "MegaMNIST",
    "PadCollate",
    "ReverseComplement",
    "Splice",
    "TsFileDataset",
    "YeastCoding",
    "build_dataset",
    "bundled_ucr_names",
    "collate_for",
    "gc_nearest_mean_accuracy",
    "get_dataset",
    "linear_forecast_scores",
    "list_datasets",
    "read_ts",
    "register_dataset",
    "seasonal_naive_scores",
]
