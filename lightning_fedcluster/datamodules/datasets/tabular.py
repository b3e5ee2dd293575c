"""`CSVFederated`: any CSV table as a federated data set, with optional time-drift concepts.

Built for the FedRC paper's real concept-drift data (App. I.1: Electricity, Airline): the rows
are ordered by a time column and cut into consecutive segments, each one concept; one global
test client per segment with a class-balanced hold-out; the remaining rows are split among the
clients by Dirichlet label skew (or by a client-id column). Features are standardised with the
mean and standard deviation of the clients' training rows only.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_fedcluster.datamodules import partition
from lightning_fedcluster.datamodules.clients import build_clients
from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.validation import check_batch_size, fraction_arg, int_arg
from lightning_fedcluster.engine.task import Task

__all__ = ["CSVFederated", "read_csv"]

_MISSING = {"", "?", "na", "nan", "null", "none"}


def read_csv(path: str | Path) -> dict[str, np.ndarray]:
    """The columns of a CSV file with a header row, as arrays of strings keyed by column name."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path={str(path)!r} is not a file: pass the CSV file's location")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise ValueError(f"{path} needs a header row and at least one data row")
    header = [name.strip() for name in rows[0]]
    if len(set(header)) != len(header):
        raise ValueError(f"{path} has repeated column names in its header: {header}")
    body = rows[1:]
    for number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"{path} line {number} has {len(row)} fields but the header has {len(header)}")
    table = np.array(body, dtype=object).reshape(len(body), len(header))
    return {name: np.char.strip(table[:, j].astype(str)) for j, name in enumerate(header)}


def _numeric(name: str, values: np.ndarray) -> np.ndarray:
    """A column as float64; missing or non-numeric entries raise with the row number."""
    out = np.empty(values.size, dtype=np.float64)
    for i, value in enumerate(values):
        try:
            if value.lower() in _MISSING:
                raise ValueError
            out[i] = float(value)
        except ValueError:
            raise ValueError(
                f"column {name!r} has a missing or non-numeric value {str(value)!r} in data row {i + 1}; "
                "fill or drop such rows first, or leave the column out of feature_columns"
            ) from None
    if not np.isfinite(out).all():
        raise ValueError(f"column {name!r} has non-finite values; fill or drop them first")
    return out


def _sort_key(values: np.ndarray) -> np.ndarray:
    """Numeric values when every entry parses as a number, else the strings themselves."""
    try:
        return np.array([float(v) for v in values])
    except ValueError:
        return values


class CSVFederated(FederatedDataModule):
    """A CSV table as federated clients.

    Args:
        path: CSV file with a header row.
        label_column: the target column. Classification: any values (e.g. UP/DOWN), mapped to
            0..C-1 in sorted order (kept in `classes`). Regression: numbers.
        feature_columns: input columns (numeric); default: every other column except the
            client and time columns.
        task: "classification" or "regression".
        client_column: natural partition, one client per distinct value (num_clients and
            dirichlet_alpha are then unused); default: Dirichlet label skew.
        time_column: orders the rows (numbers, or strings that sort in time order such as ISO
            dates); the ordered rows are cut into `num_segments` consecutive, equal-size
            segments, segment s being concept s. Without it the file's row order is the time
            order (as in the standard Electricity file).
        num_segments: concepts along the time column (1 = no drift).
        drift_rows: instead of equal segments, the positions in time order where a new concept
            starts, e.g. [26640] for Electricity's drift as Tahmasbi et al. (2021) place it
            (batch 20 of 34 batches of 1332 rows); works with or without a time_column.
        num_clients: clients of the Dirichlet split, shared among segments in proportion to
            their size (each client's rows come from one segment unless `mix_segments`).
        dirichlet_alpha: label skew (None: IID; must be None for regression). Every client first
            receives `min_client_size` random rows, then the rest follows the Dirichlet draw.
        mix_segments: split the pooled rows of all segments at once (clients may then mix
            concepts; a client's concept is its majority segment).
        global_test_fraction: rows of every segment held out for its global test client,
            class-balanced for classification (the paper's "balanced label distribution").
        unseen_fraction: share of whole clients held out as extra, unseen global clients.
        test_fraction: each client's held-out share; `val_share` of it is validation, the rest
            test.
        standardize: scale features by the clients' training rows' mean and std.
        val_share, adapt_fraction: the evaluation splits (validation/test of the held-out rows,
            validation/test x adapt/score of the global clients), as in `FederatedDataModule`.
    """

    def __init__(
        self,
        path: str,
        label_column: str,
        feature_columns: Sequence[str] | None = None,
        task: Task | str = Task.CLASSIFICATION,
        client_column: str | None = None,
        time_column: str | None = None,
        num_segments: int = 1,
        drift_rows: Sequence[int] | None = None,
        num_clients: int = 30,
        dirichlet_alpha: float | None = 0.1,
        mix_segments: bool = False,
        global_test_fraction: float = 0.2,
        unseen_fraction: float = 0.0,
        test_fraction: float = 0.2,
        min_client_size: int = 2,
        standardize: bool = True,
        batch_size: int = 128,
        seed: int = 0,
        val_share: float = 0.5,
        adapt_fraction: float = 0.4,
    ) -> None:
        check_batch_size(batch_size)
        arguments, info = _build_csv(
            path=path,
            label_column=label_column,
            feature_columns=feature_columns,
            task=task,
            client_column=client_column,
            time_column=time_column,
            num_segments=num_segments,
            drift_rows=drift_rows,
            num_clients=num_clients,
            dirichlet_alpha=dirichlet_alpha,
            mix_segments=mix_segments,
            global_test_fraction=global_test_fraction,
            unseen_fraction=unseen_fraction,
            test_fraction=test_fraction,
            min_client_size=min_client_size,
            standardize=standardize,
            seed=seed,
        )
        super().__init__(
            **arguments,
            batch_size=batch_size,
            task=task,
            val_share=val_share,
            adapt_fraction=adapt_fraction,
            seed=seed,
        )
        self.classes: list[str] | None = info["classes"]
        self.feature_columns: list[str] = info["feature_columns"]
        self.feature_mean: torch.Tensor = info["mean"]
        self.feature_std: torch.Tensor = info["std"]
        self.save_hyperparameters()


def _build_csv(
    *,
    path: str,
    label_column: str,
    feature_columns: Sequence[str] | None,
    task: Task | str,
    client_column: str | None,
    time_column: str | None,
    num_segments: int,
    drift_rows: Sequence[int] | None,
    num_clients: int,
    dirichlet_alpha: float | None,
    mix_segments: bool,
    global_test_fraction: float,
    unseen_fraction: float,
    test_fraction: float,
    min_client_size: int,
    standardize: bool,
    seed: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    task = Task.of(task)  # the user's string becomes a Task here
    num_segments = int_arg("num_segments", num_segments, 1)
    num_clients = int_arg("num_clients", num_clients, 1)
    min_client_size = int_arg("min_client_size", min_client_size, 1)
    seed = int_arg("seed", seed, 0)
    global_test_fraction = fraction_arg("global_test_fraction", global_test_fraction)
    if dirichlet_alpha is not None:
        if task is Task.REGRESSION:
            raise ValueError(
                "dirichlet_alpha is a label skew and needs class labels: pass dirichlet_alpha=None "
                "(IID) for a regression task"
            )
        if isinstance(dirichlet_alpha, bool) or not dirichlet_alpha > 0 or not math.isfinite(dirichlet_alpha):
            raise ValueError(f"dirichlet_alpha must be a positive number or None, got {dirichlet_alpha!r}")
    if num_segments > 1 and time_column is None:
        raise ValueError(f"num_segments={num_segments} needs a time_column to order the rows by")
    if drift_rows is not None:
        if num_segments != 1:
            raise ValueError("give either num_segments (equal segments) or drift_rows (where concepts start)")
        if isinstance(drift_rows, (str, bytes)) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in drift_rows
        ):
            raise ValueError(f"drift_rows must be a list of row positions (integers), got {drift_rows!r}")
        num_segments = len(drift_rows) + 1

    columns = read_csv(path)
    for role, name in (
        ("label_column", label_column),
        ("client_column", client_column),
        ("time_column", time_column),
    ):
        if name is not None and name not in columns:
            raise ValueError(f"{role}={name!r} is not a column of {path}; columns: {list(columns)}")
    special = {label_column, client_column, time_column}
    if feature_columns is None:
        feature_columns = [name for name in columns if name not in special]
    else:
        feature_columns = list(feature_columns)
        unknown = [name for name in feature_columns if name not in columns]
        if unknown:
            raise ValueError(f"feature_columns {unknown} are not columns of {path}; columns: {list(columns)}")
        clash = [name for name in feature_columns if name in special]
        if clash:
            raise ValueError(f"feature_columns {clash} are also the label, client or time column")
    if not feature_columns:
        raise ValueError("no feature columns left: pass feature_columns")
    x = np.stack([_numeric(name, columns[name]) for name in feature_columns], axis=1)
    n = x.shape[0]

    classes: list[str] | None = None
    if task is Task.CLASSIFICATION:
        raw = columns[label_column]
        values = np.unique(raw)
        if values.size < 2:
            raise ValueError(f"label_column={label_column!r} has a single value {values.tolist()}")
        keys = _sort_key(values)
        values = values[np.argsort(keys, kind="stable")]
        classes = values.tolist()
        y_np = _encode(raw, values)
        y = torch.from_numpy(y_np)
    else:
        y_np = _numeric(label_column, columns[label_column])
        y = torch.from_numpy(y_np).to(torch.float32)

    segment = _segments(n, columns[time_column] if time_column else None, num_segments, drift_rows)

    hold_seq, part_seq, client_seq = np.random.SeedSequence(seed).spawn(3)
    hold_rng, part_rng = np.random.default_rng(hold_seq), np.random.default_rng(part_seq)
    client_seed = int(client_seq.generate_state(1)[0])
    held_parts: list[np.ndarray] = []
    held_concepts: list[int] = []
    for s in range(num_segments):
        rows = np.flatnonzero(segment == s)
        n_held = partition.held_out_count(rows.size, global_test_fraction)
        if n_held == 0:
            continue
        held_concepts.append(s)
        if classes is None:
            held_parts.append(np.sort(hold_rng.choice(rows, size=n_held, replace=False)))
            continue
        per_class = n_held // len(classes)
        counts = np.bincount(y_np[rows], minlength=len(classes))
        if per_class == 0 or counts.min() <= per_class:
            raise ValueError(
                f"segment {s} cannot give a class-balanced global test set of {per_class} rows per "
                f"class (its class counts are {counts.tolist()}): lower global_test_fraction or "
                "num_segments"
            )
        held_parts.append(
            np.sort(
                np.concatenate(
                    [
                        hold_rng.choice(rows[y_np[rows] == c], size=per_class, replace=False)
                        for c in range(len(classes))
                    ]
                )
            )
        )
    held_all = np.concatenate(held_parts + [np.empty(0, dtype=np.int64)])
    pool = np.setdiff1d(np.arange(n), held_all)

    def split(rows: np.ndarray, count: int) -> list[np.ndarray]:
        if count * min_client_size > rows.size:
            raise ValueError(
                f"{count} clients need at least {count * min_client_size} rows but only {rows.size} "
                "are left; use fewer clients (num_clients), a smaller min_client_size or a smaller "
                "global_test_fraction"
            )
        if dirichlet_alpha is None:
            return [rows[p] for p in partition.iid_split(rows.size, count, part_rng)]
        parts = partition.dirichlet_split(
            y_np[rows], count, float(dirichlet_alpha), part_rng, min_size=min_client_size, reserve=True
        )
        return [rows[p] for p in parts]

    if client_column is not None:
        ids = columns[client_column][pool]
        parts = [pool[p] for p in partition.natural_split(ids)]
    elif mix_segments or num_segments == 1:
        parts = split(pool, num_clients)
    else:
        sizes = np.array([(segment[pool] == s).sum() for s in range(num_segments)])
        shares = partition.largest_remainder(sizes, num_clients)
        if shares.min() < 1:
            raise ValueError(
                f"num_clients={num_clients} gives segment {int(shares.argmin())} no client: use "
                f"num_clients >= num_segments={num_segments} (or mix_segments=True)"
            )
        parts = []
        for s in range(num_segments):
            parts.extend(split(pool[segment[pool] == s], int(shares[s])))
    concept = np.array(
        [np.bincount(segment[p], minlength=num_segments).argmax() for p in parts], dtype=np.int64
    )
    x_t = torch.from_numpy(x).to(torch.float32)
    arguments = build_clients(
        x_t,
        y,
        parts,
        test_fraction=test_fraction,
        concept=concept,
        unseen_fraction=unseen_fraction,
        global_test=[(x_t[torch.from_numpy(h)], y[torch.from_numpy(h)]) for h in held_parts],
        global_concept=held_concepts,
        num_classes=None if classes is None else len(classes),
        seed=client_seed,
    )
    mean = torch.zeros(x.shape[1])
    std = torch.ones(x.shape[1])
    if standardize:
        train_x = torch.cat([xi for xi, _ in arguments["client_train"]])
        mean = train_x.mean(dim=0)
        std = train_x.std(dim=0, unbiased=False)
        constant = [feature_columns[j] for j in torch.nonzero(std < 1e-12).flatten().tolist()]
        if constant:
            warnings.warn(
                f"feature columns {constant} are constant on the clients' training rows; they are "
                "centred but not scaled",
                stacklevel=3,
            )
        std = torch.where(std < 1e-12, torch.ones_like(std), std)
        for key in ("client_train", "client_test", "global_test"):
            arguments[key] = [((xi - mean) / std, yi) for xi, yi in arguments[key]]
    info = {"classes": classes, "feature_columns": feature_columns, "mean": mean, "std": std}
    return arguments, info


def _segments(
    n: int, time: np.ndarray | None, num_segments: int, drift_rows: Sequence[int] | None
) -> np.ndarray:
    """Each row's concept: consecutive chunks of the time order (the file order without a time
    column), cut into equal sizes or where `drift_rows` says a new concept starts."""
    order = np.arange(n) if time is None else np.argsort(_sort_key(time), kind="stable")
    if drift_rows is None:
        if num_segments > n:
            raise ValueError(f"num_segments={num_segments} exceeds the {n} rows")
        chunks = np.array_split(order, num_segments)
    else:
        bounds = list(drift_rows)
        if bounds != sorted(set(bounds)) or not all(0 < r < n for r in bounds):
            raise ValueError(
                f"drift_rows must increase strictly and lie in (0, {n}) (the table's rows), got {bounds}"
            )
        chunks = np.split(order, bounds)
    segment = np.empty(n, dtype=np.int64)
    for s, rows in enumerate(chunks):
        segment[rows] = s
    return segment


def _encode(raw: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of every raw label in `values` (the classes in their chosen order)."""
    index = {value: i for i, value in enumerate(values.tolist())}
    return np.array([index[v] for v in raw.tolist()], dtype=np.int64)
