"""Which rows each client holds, decided by a Flower Datasets partitioner
(``flwr_datasets.partitioner``: Iid, Dirichlet, Pathological, NaturalId, ...), and the per-client
concept a natural id carries (for diagnostics)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lightning_fedcluster.datamodules.hugging_face.source import arrow_table, column_array, require_hf

__all__ = ["ROW_COLUMN", "PartitionerRows", "client_concepts"]

ROW_COLUMN = "__fedcluster_row__"
"""The row ids the partitioner's data set carries, so each partition names the source rows it took."""


class PartitionerRows:
    """``partition(pool)`` for ``plan_scenario``: the partitioner is given the client pool's rows
    of ``dataset`` (with their row ids in ``ROW_COLUMN``) and each of its partitions becomes a client,
    client i = ``partitioner.load_partition(i)``. ``natural_ids`` holds a NaturalIdPartitioner's
    id of each client once it has run."""

    def __init__(self, dataset: Any, partitioner: Any, inputs: list[str] | None = None) -> None:
        require_hf()
        from flwr_datasets.partitioner import Partitioner

        if not isinstance(partitioner, Partitioner):
            raise TypeError(
                f"partitioner must be a flwr_datasets.partitioner.Partitioner (e.g. IidPartitioner("
                f"num_partitions=10)), got {type(partitioner).__name__}"
            )
        if partitioner.is_dataset_assigned():
            raise ValueError(
                "the partitioner already has a data set: pass a new one (the clients' data set is "
                "assigned to it here, after the global test rows are held out)"
            )
        if ROW_COLUMN in dataset.column_names:
            raise ValueError(f"the data set has a column {ROW_COLUMN!r}, a name used here: rename it")
        self.dataset = dataset
        self.partitioner = partitioner
        self.inputs = set(inputs or ())
        self.natural_ids: list[Any] | None = None

    def __call__(self, pool: np.ndarray) -> list[np.ndarray]:
        """The partitions of the pool's rows, as row ids of the data set. The partitioner is given
        the pool's other columns than the inputs (ids, labels: what partitioners read), in memory,
        with the row ids; the inputs stay in the Arrow table until each client is read."""
        import pyarrow as pa

        datasets = require_hf()
        from datasets.table import InMemoryTable

        kept = [c for c in self.dataset.column_names if c not in self.inputs]
        table = arrow_table(self.dataset).select(kept).take(pa.array(pool.astype(np.int64)))
        table = table.append_column(ROW_COLUMN, pa.array(pool.astype(np.int64)))
        features = datasets.Features(
            {**{c: self.dataset.features[c] for c in kept}, ROW_COLUMN: datasets.Value("int64")}
        )
        # From the Arrow table as it is (Dataset.from_dict would encode every value in Python).
        info = datasets.DatasetInfo(features=features)
        self.partitioner.dataset = datasets.Dataset(InMemoryTable(table), info=info)
        count = self.partitioner.num_partitions
        if count > pool.size:
            raise ValueError(
                f"the partitioner has {count} partitions but the client pool has {pool.size} rows: at "
                "least one client would be empty; use fewer partitions"
            )
        parts = []
        for i in range(count):
            parts.append(column_array(self.partitioner.load_partition(i), ROW_COLUMN).astype(np.int64))
        names = getattr(self.partitioner, "partition_id_to_natural_id", None)
        if isinstance(names, dict) and names:
            self.natural_ids = [names[i] for i in range(len(parts))]
        return parts


def client_concepts(
    concept: str | Callable[[Any], int], parts: list[np.ndarray], dataset: Any, natural_ids: list[Any] | None
) -> np.ndarray:
    """Each client's concept (for diagnostics): the value of column ``concept``, which must be one
    value per client, or ``concept(natural_id)`` (a NaturalIdPartitioner's clients)."""
    if callable(concept):
        if natural_ids is None:
            raise ValueError(
                "concept is a function of the natural id, but the partitioner has none: use a "
                "NaturalIdPartitioner, or name a column with concept='column'"
            )
        values = [concept(natural) for natural in natural_ids]
    else:
        if concept not in dataset.column_names:
            raise ValueError(
                f"concept: column {concept!r} is not in the data set, whose columns are "
                f"{dataset.column_names}"
            )
        column = column_array(dataset, concept)
        values = []
        for i, rows in enumerate(parts):
            seen = np.unique(column[rows])
            if seen.size != 1:
                raise ValueError(
                    f"concept column {concept!r} takes {seen.size} values on client {i} ({seen[:4].tolist()}"
                    "...): a concept is one per client; partition by it, or leave concept unset"
                )
            values.append(seen[0])
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.integer) or (array < 0).any():
        raise ValueError(
            f"concept values must be integers >= 0 (one per client), got {array[:4].tolist()}...: map them "
            "to 0..K-1 first"
        )
    return array.astype(np.int64)
