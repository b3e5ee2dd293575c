"""Hugging Face data sets as a source of `FederatedDataModule` (``from_hugging_face``): named
columns read from the memory-mapped Arrow table, a Flower Datasets partitioner deciding each
client's rows, the library's shifts on top. Needs the ``hf`` extra (``datasets``,
``flwr-datasets``), imported only when a data set is built."""

from lightning_fedcluster.datamodules.hugging_face.builder import HuggingFaceClients, hugging_face_arguments
from lightning_fedcluster.datamodules.hugging_face.partition import ROW_COLUMN, PartitionerRows
from lightning_fedcluster.datamodules.hugging_face.source import ColumnReader, load_source, require_hf

__all__ = [
    "ROW_COLUMN",
    "ColumnReader",
    "HuggingFaceClients",
    "PartitionerRows",
    "hugging_face_arguments",
    "load_source",
    "require_hf",
]
