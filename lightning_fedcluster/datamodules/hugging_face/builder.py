"""``FederatedDataModule.from_hugging_face``'s work: the scenario's draws from the label column
and the partitioner's row ids (``plan_scenario``), then every client's rows read, shifted and
written one client at a time (``scenario_arguments_from`` into a ``ClientStore``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_fedcluster.datamodules.client_store import ClientStore
from lightning_fedcluster.datamodules.hugging_face.partition import PartitionerRows, client_concepts
from lightning_fedcluster.datamodules.hugging_face.source import ColumnReader, load_source
from lightning_fedcluster.datamodules.scenario import plan_scenario
from lightning_fedcluster.datamodules.scenario_clients import scenario_arguments_from

__all__ = ["HuggingFaceClients", "hugging_face_arguments"]


@dataclass
class HuggingFaceClients:
    """What the built clients came from: ``source_rows[i]`` the rows of the clients' split that
    client i holds (the partitioner's partition i), ``natural_ids[i]`` its natural id (a
    NaturalIdPartitioner's; else None), ``store`` where its rows are kept."""

    source_rows: list[np.ndarray]
    natural_ids: list[Any] | None
    store: ClientStore


def hugging_face_arguments(
    source: Any,
    *,
    features: str | Sequence[str],
    label: str,
    partitioner: Any,
    split: str = "train",
    test_split: str | None = None,
    transform: Callable[[Tensor], Tensor] | None = None,
    concept: str | Callable[[Any], int] | None = None,
    concepts: int = 1,
    corrupt_fraction: float | Sequence[float] | None = 0.0,
    concept_proportions: Sequence[float] | None = None,
    corruptions: Sequence[str] | None = None,
    preset: str | None = None,
    image_shape: tuple[int, int, int] | None = None,
    test_fraction: float | None = None,
    global_test_fraction: float | None = None,
    num_classes: int | None = None,
    seed: int = 0,
    memory_map: str | Path | None = None,
    cache_dir: str | None = None,
) -> tuple[dict[str, Any], HuggingFaceClients]:
    """`FederatedDataModule` arguments from a Hugging Face data set and a Flower Datasets
    partitioner (see ``FederatedDataModule.from_hugging_face``), and where they came from."""
    train, test = load_source(source, split, test_split, cache_dir)
    reader = ColumnReader(train, features, label, transform, where=f"split {split!r}")
    if concept is not None and (concepts != 1 or preset is not None):
        raise ValueError(
            "concept names the clients' own concepts (for diagnostics), but concepts > 1 (or a preset) "
            "draws concepts as label maps: give one of them"
        )
    global_test = None
    if test is not None:
        tester = ColumnReader(test, features, label, transform, where=f"split {test_split!r}")
        global_test = tester.read(torch.arange(len(test)))
    labels = reader.labels()
    if labels.size == 0:
        raise ValueError(f"split {split!r} has no rows")
    sample = reader.read(torch.zeros(1, dtype=torch.long))[0]
    if global_test is not None and tuple(global_test[0].shape[1:]) != tuple(sample.shape[1:]):
        raise ValueError(
            f"split {test_split!r} has inputs of per-sample shape {tuple(global_test[0].shape[1:])} "
            f"but split {split!r} has {tuple(sample.shape[1:])}: they must match"
        )
    rows = PartitionerRows(train, partitioner, reader.columns)
    plan, num_classes = plan_scenario(
        labels,
        sample,
        None,  # each corrupted client's rows are checked for [0, 1] as they are read
        num_clients=None,
        concepts=concepts,
        dirichlet_alpha=None,
        corrupt_fraction=corrupt_fraction,
        concept_proportions=concept_proportions,
        test_fraction=test_fraction,
        global_test_fraction=global_test_fraction,
        min_client_size=1,
        num_classes=num_classes,
        image_shape=image_shape,
        seed=seed,
        global_labels=None if global_test is None else global_test[1],
        corruptions=corruptions,
        preset=preset,
        partition=rows,
    )
    columns = ", ".join(repr(c) for c in reader.columns)
    store = ClientStore(plan.train_sizes, plan.test_sizes, tuple(sample.shape[1:]), memory_map, columns)
    arguments = scenario_arguments_from(plan, reader.read, num_classes, global_test, store.place)
    if concept is not None:
        own = torch.from_numpy(client_concepts(concept, plan.parts, train, rows.natural_ids))
        arguments["metadata"] = replace(arguments["metadata"], concept=own)
    return arguments, HuggingFaceClients(plan.parts, rows.natural_ids, store)
