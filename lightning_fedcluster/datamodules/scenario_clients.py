"""The clients of a FedRC scenario once its draws are made: which rows each holds (``parts``), its
concept, its corruption, its train/test rows (``ClientPlan``), and the tensors they give
(``scenario_arguments_from``). The draws need the labels only; the inputs are read per client
through ``read``, so a scenario built from tensors and one built from a table read row by row
(``datamodules/datasets/hugging_face.py``) run the same steps and give the same tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_fedcluster.datamodules import partition
from lightning_fedcluster.datamodules.metadata import ClientMetadata
from lightning_fedcluster.datamodules.shifts import corrupt
from lightning_fedcluster.datamodules.validation import Split

__all__ = ["ClientPlan", "Placement", "Reader", "check_parts", "plan_clients", "scenario_arguments_from"]

Reader = Callable[[Tensor], Split]
"""Rows (a LongTensor of row ids) to their (x float32, y int64) tensors."""
Placement = Callable[[int, Split, Split], tuple[Split, Split]]
"""Where client i's (train, test) tensors are kept; the default keeps them as they are."""


@dataclass
class ClientPlan:
    """Every draw of a scenario's clients: ``parts[i]`` are client i's row ids, ``styles[i]`` its
    corruption (kind, severity, noise seed; drawn for every client), ``splits[i]`` the positions
    within ``parts[i]`` of its train and test rows, ``held`` the rows of the global clients."""

    parts: list[np.ndarray]
    held: np.ndarray
    concept: np.ndarray
    corrupted: np.ndarray
    styles: list[tuple[str, int, int]]
    splits: list[tuple[np.ndarray, np.ndarray]]
    maps: list[Tensor]
    image_shape: tuple[int, ...]

    @property
    def train_sizes(self) -> list[int]:
        return [train.size for train, _ in self.splits]

    @property
    def test_sizes(self) -> list[int]:
        return [test.size for _, test in self.splits]


def check_parts(parts: Sequence[Any], pool: np.ndarray, num_rows: int) -> list[np.ndarray]:
    """A given partition as int64 row-id arrays: one non-empty array per client, every row in
    ``pool`` (the rows not held out for the global clients)."""
    if isinstance(parts, (Tensor, str)) or not isinstance(parts, Sequence) or len(parts) == 0:
        raise ValueError("partition must be a non-empty list with one array of row ids per client")
    in_pool = np.zeros(num_rows, dtype=bool)
    in_pool[pool] = True
    checked = []
    for i, part in enumerate(parts):
        rows = np.asarray(part).reshape(-1)
        if rows.size == 0:
            raise ValueError(
                f"the partition leaves client {i} empty: every client needs at least one row; use "
                "fewer partitions or a partitioner that keeps each one non-empty (e.g. a minimum "
                "partition size)"
            )
        if not np.issubdtype(rows.dtype, np.integer) or rows.min() < 0 or rows.max() >= num_rows:
            raise ValueError(f"partition[{i}] (client {i}) must hold integer row ids in [0, {num_rows})")
        if not in_pool[rows].all():
            raise ValueError(
                f"partition[{i}] (client {i}) holds rows held out for the global test clients: "
                "partition the client pool only (pass global_test_fraction=0 or a global_test set "
                "to give every row to the clients)"
            )
        checked.append(rows.astype(np.int64))
    return checked


def plan_clients(
    parts: list[np.ndarray],
    held: np.ndarray,
    concept: np.ndarray,
    corrupted: np.ndarray,
    maps: list[Tensor],
    image_shape: tuple[int, ...],
    kinds: Sequence[str],
    test_fraction: float,
    style_rng: np.random.Generator,
    test_rng: np.random.Generator,
) -> ClientPlan:
    """The per-client draws: a corruption for every client (so one client's type never shifts
    another's randomness) from ``style_rng`` and a train/test split from ``test_rng``."""
    styles = []
    for _ in parts:
        kind = kinds[int(style_rng.integers(len(kinds)))]
        styles.append((kind, int(style_rng.integers(1, 6)), int(style_rng.integers(2**62))))
    splits = [partition.train_test_split(part.size, test_fraction, test_rng) for part in parts]
    return ClientPlan(parts, held, concept, corrupted, styles, splits, maps, image_shape)


def keep(i: int, train: Split, test: Split) -> tuple[Split, Split]:
    return train, test


BLOCK_ROWS = 65536
"""Rows read in one call: consecutive clients are read together up to this many rows (a read from
a memory-mapped Arrow table costs about as much for 800 rows as for 64,000), then split."""


def read_in_blocks(parts: list[np.ndarray], read: Reader, block_rows: int | None = None) -> Iterator[Split]:
    """Each client's (x, y), in client order, from reads of consecutive clients' rows together
    (a client larger than ``block_rows`` alone); the same rows as one read per client."""
    block_rows = BLOCK_ROWS if block_rows is None else block_rows
    start = 0
    while start < len(parts):
        stop, rows = start + 1, parts[start].size
        while stop < len(parts) and rows + parts[stop].size <= block_rows:
            rows += parts[stop].size
            stop += 1
        x, y = read(torch.from_numpy(np.concatenate(parts[start:stop])))
        sizes = [part.size for part in parts[start:stop]]
        yield from zip(x.split(sizes), y.split(sizes), strict=True)
        start = stop


def scenario_arguments_from(
    plan: ClientPlan,
    read: Reader,
    num_classes: int,
    global_test: Split | None = None,
    place: Placement = keep,
) -> dict[str, Any]:
    """`FederatedDataModule` arguments: each client's rows read, relabelled by its concept's map,
    corrupted when it is, split into train and test and handed to ``place``; one global client
    per concept on ``global_test`` (given) or on the held-out rows."""
    client_train: list[Split] = []
    client_test: list[Split] = []
    styles: list[str] = []
    for i, (xi, yi) in enumerate(read_in_blocks(plan.parts, read)):
        yi = plan.maps[plan.concept[i]][yi]
        if plan.corrupted[i]:
            kind, severity, noise_seed = plan.styles[i]
            if xi.numel() and (xi.min() < 0 or xi.max() > 1):
                raise ValueError(
                    f"client {i} is corrupted but its inputs lie in [{float(xi.min()):.3g}, "
                    f"{float(xi.max()):.3g}]: corruptions need inputs scaled to [0, 1]; rescale them "
                    "or pass corrupt_fraction=0"
                )
            generator = torch.Generator().manual_seed(noise_seed)
            xi = corrupt(xi.reshape(-1, *plan.image_shape), kind, severity, generator).reshape(xi.shape)
            styles.append(f"{kind}:{severity}")
        else:
            styles.append("clean")
        train_rows, test_rows = (torch.from_numpy(r) for r in plan.splits[i])
        train, test = place(i, (xi[train_rows], yi[train_rows]), (xi[test_rows], yi[test_rows]))
        client_train.append(train)
        client_test.append(test)
    global_splits: list[Split] = []
    if global_test is not None:
        global_splits = [(global_test[0], table[global_test[1]]) for table in plan.maps]
    elif plan.held.size:
        held_x, held_y = read(torch.from_numpy(plan.held))
        global_splits = [(held_x, table[held_y]) for table in plan.maps]
    metadata = ClientMetadata(
        concept=torch.from_numpy(plan.concept),
        feature_style=styles,
        global_concept=torch.arange(len(global_splits), dtype=torch.long),
    )
    return {
        "client_train": client_train,
        "client_test": client_test,
        "global_test": global_splits,
        "num_classes": num_classes,
        "metadata": metadata,
    }
