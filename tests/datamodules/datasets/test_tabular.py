"""CSVFederated on small CSV files written by the tests."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules.datasets.tabular import CSVFederated, read_csv
from lightning_fedcluster.engine.task import Task


def write_drift_csv(path: Path, n: int = 1200, seed: int = 0, client_ids: int = 0) -> Path:
    """Electricity-like table: label UP when f1 > 0 in the first half of time, reversed after."""
    rng = np.random.default_rng(seed)
    time = rng.permutation(n) / n  # rows stored out of time order on purpose
    f1, f2 = rng.normal(size=n) * 3 + 5, rng.uniform(0, 10, size=n)
    up = (f1 > 5) ^ (time >= 0.5)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", "f1", "f2", "row"] + (["user"] if client_ids else []) + ["class"])
        for i in range(n):
            extra = [f"u{i % client_ids}"] if client_ids else []
            writer.writerow(
                [f"{time[i]:.6f}", f"{f1[i]:.5f}", f"{f2[i]:.5f}", i] + extra + ["UP" if up[i] else "DOWN"]
            )
    return path


@pytest.fixture(scope="module")
def drift_csv(tmp_path_factory) -> Path:
    return write_drift_csv(tmp_path_factory.mktemp("csv") / "drift.csv")


def original_rows(dm: CSVFederated, x: torch.Tensor) -> np.ndarray:
    """Recover the 'row' feature (column 2) from standardised inputs."""
    raw = x * dm.feature_std + dm.feature_mean
    return raw[:, 2].round().long().numpy()


def test_time_segments_are_concepts(drift_csv: Path) -> None:
    dm = CSVFederated(
        str(drift_csv),
        label_column="class",
        time_column="date",
        num_segments=2,
        num_clients=10,
        dirichlet_alpha=0.5,
        seed=0,
    )
    columns = read_csv(drift_csv)
    time = columns["date"].astype(float)
    assert dm.classes == ["DOWN", "UP"] and dm.num_classes == 2 and dm.task == "classification"
    assert dm.feature_columns == ["f1", "f2", "row"]
    assert dm.num_clients == 10 and torch.bincount(dm.metadata.concept).tolist() == [5, 5]
    assert dm.metadata.global_concept.tolist() == [0, 1]
    for g in range(2):  # class-balanced hold-out from the right time segment
        gx, gy = dm.global_split(g)
        assert torch.bincount(gy).tolist() == [60, 60]  # 20% of 600 rows, half per class
        seg_time = time[original_rows(dm, gx)]
        assert ((seg_time >= 0.5) == bool(g)).all()
    for i in range(10):  # every client lives in its own segment
        rows = original_rows(dm, torch.cat([dm.train_split(i)[0], dm.val_split(i)[0], dm.test_split(i)[0]]))
        assert ((time[rows] >= 0.5) == bool(dm.metadata.concept[i])).all()
    total = int(dm.train_sizes.sum() + dm.val_sizes.sum() + dm.test_sizes.sum() + dm.global_offsets[-1])
    assert total == 1200  # nothing dropped


def test_standardisation_uses_training_rows_only(drift_csv: Path) -> None:
    dm = CSVFederated(
        str(drift_csv),
        label_column="class",
        num_clients=6,
        dirichlet_alpha=None,
        feature_columns=["f1", "f2"],
        seed=1,
    )
    assert torch.allclose(dm.train_x.mean(dim=0), torch.zeros(2), atol=1e-5)
    assert torch.allclose(dm.train_x.std(dim=0, unbiased=False), torch.ones(2), atol=1e-4)
    assert not torch.allclose(dm.test_x.mean(dim=0), torch.zeros(2), atol=1e-5)
    raw = dm.train_x * dm.feature_std + dm.feature_mean
    assert torch.allclose(dm.feature_mean, raw.mean(dim=0), atol=1e-4)
    plain = CSVFederated(
        str(drift_csv),
        label_column="class",
        num_clients=6,
        dirichlet_alpha=None,
        feature_columns=["f1", "f2"],
        standardize=False,
        seed=1,
    )
    assert torch.allclose(plain.train_x, raw, atol=1e-4)


def test_dirichlet_skew_and_determinism(drift_csv: Path) -> None:
    kwargs = dict(label_column="class", num_clients=20, dirichlet_alpha=0.1, seed=4)
    dm = CSVFederated(str(drift_csv), **kwargs)
    shares = torch.stack(
        [
            torch.bincount(torch.cat([dm.train_split(i)[1], dm.test_split(i)[1]]), minlength=2).float()
            for i in range(20)
        ]
    )
    shares = shares / shares.sum(dim=1, keepdim=True)
    assert float(shares.max(dim=1).values.mean()) > 0.8  # alpha = 0.1: nearly one class each
    assert int((dm.train_sizes + dm.test_sizes).min()) >= 2
    again = CSVFederated(str(drift_csv), **kwargs)
    assert torch.equal(dm.train_x, again.train_x) and torch.equal(dm.train_offsets, again.train_offsets)


def test_natural_partition_and_unseen_clients(tmp_path: Path) -> None:
    path = write_drift_csv(tmp_path / "users.csv", n=400, client_ids=8)
    dm = CSVFederated(
        str(path),
        label_column="class",
        client_column="user",
        global_test_fraction=0,
        unseen_fraction=0.25,
        feature_columns=["f1", "f2"],
        seed=0,
    )
    assert dm.num_clients == 6 and dm.num_global_clients == 2
    assert (dm.train_sizes + dm.val_sizes + dm.test_sizes).tolist() == [50] * 6
    assert [dm.global_split(g)[0].shape[0] for g in range(2)] == [50, 50]


def test_regression_task(tmp_path: Path) -> None:
    path = tmp_path / "reg.csv"
    rng = np.random.default_rng(0)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "target"])
        for _ in range(200):
            a, b = rng.normal(size=2)
            writer.writerow([a, b, 2 * a - b + 0.1 * rng.normal()])
    dm = CSVFederated(
        str(path), label_column="target", task="regression", dirichlet_alpha=None, num_clients=5, seed=0
    )
    assert dm.task is Task.REGRESSION and dm.num_classes is None and dm.classes is None
    assert dm.train_y.dtype == torch.float32 and dm.target_shape == ()
    assert dm.num_global_clients == 1 and dm.global_split(0)[1].shape == (40,)
    with pytest.raises(ValueError, match="dirichlet_alpha=None"):
        CSVFederated(str(path), label_column="target", task="regression", num_clients=5)


def test_bad_input_names_the_argument(tmp_path: Path, drift_csv: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,UP\n?,DOWN\n3,UP\n")
    with pytest.raises(ValueError, match=r"column 'x' has a missing or non-numeric value '\?' in data row 2"):
        CSVFederated(str(bad), label_column="y", num_clients=1, global_test_fraction=0)
    with pytest.raises(ValueError, match="label_column='label' is not a column"):
        CSVFederated(str(drift_csv), label_column="label")
    with pytest.raises(ValueError, match=r"feature_columns \['f9'\] are not columns"):
        CSVFederated(str(drift_csv), label_column="class", feature_columns=["f9"])
    with pytest.raises(ValueError, match="num_segments=2 needs a time_column"):
        CSVFederated(str(drift_csv), label_column="class", num_segments=2)
    with pytest.raises(ValueError, match="use fewer clients"):
        CSVFederated(str(drift_csv), label_column="class", num_clients=600)
    with pytest.raises(FileNotFoundError, match="path="):
        CSVFederated(str(tmp_path / "none.csv"), label_column="class")


def test_drift_rows_cut_the_file_order_into_concepts(tmp_path: Path) -> None:
    # Electricity's layout: no time column, the file's row order is time; columns as elec.csv.
    rng = np.random.default_rng(0)
    n, drift = 600, 360
    values = rng.uniform(0, 1, size=(n, 6))
    up = (values[:, 1] > 0.5) ^ (np.arange(n) >= drift)
    path = tmp_path / "elec.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["period", "nswprice", "nswdemand", "vicprice", "vicdemand", "transfer", "class"])
        writer.writerows([*(f"{v:.6f}" for v in row), int(u)] for row, u in zip(values, up, strict=True))
    dm = CSVFederated(
        str(path),
        label_column="class",
        drift_rows=[drift],
        num_clients=12,
        dirichlet_alpha=0.1,
        mix_segments=True,
        standardize=False,
        seed=0,
    )
    assert dm.feature_columns == ["period", "nswprice", "nswdemand", "vicprice", "vicdemand", "transfer"]
    assert dm.num_global_clients == 2 and dm.metadata.global_concept.tolist() == [0, 1]

    def source_rows(x: torch.Tensor) -> set[int]:
        return {int(np.flatnonzero((np.abs(values - row.numpy()) < 1e-5).all(axis=1))[0]) for row in x}

    for g, rows in enumerate((np.arange(drift), np.arange(drift, n))):
        gx, gy = dm.global_split(g)
        assert torch.bincount(gy).tolist() == [round(0.2 * rows.size) // 2] * 2  # class-balanced
        assert source_rows(gx) <= set(rows.tolist())  # from its own side of the drift
    # With a time column the cut is in time order, not file order.
    columns = read_csv(path)
    shuffled = tmp_path / "shuffled.csv"
    order = rng.permutation(n)
    with open(shuffled, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", *columns])
        writer.writerows([i, *(columns[c][i] for c in columns)] for i in order)
    timed = CSVFederated(
        str(shuffled),
        label_column="class",
        time_column="date",
        drift_rows=[drift],
        num_clients=12,
        dirichlet_alpha=0.1,
        mix_segments=True,
        standardize=False,
        seed=0,
    )
    assert source_rows(timed.global_split(0)[0]) <= set(range(drift))
    assert source_rows(timed.global_split(1)[0]) <= set(range(drift, n))


def test_drift_rows_are_checked(drift_csv: Path) -> None:
    kwargs = dict(label_column="class", num_clients=4, dirichlet_alpha=None)
    with pytest.raises(ValueError, match="either num_segments"):
        CSVFederated(str(drift_csv), time_column="date", num_segments=2, drift_rows=[600], **kwargs)
    with pytest.raises(ValueError, match=r"drift_rows must increase strictly and lie in \(0, 1200\)"):
        CSVFederated(str(drift_csv), drift_rows=[26640], **kwargs)
    with pytest.raises(ValueError, match="drift_rows must be a list of row positions"):
        CSVFederated(str(drift_csv), drift_rows="600", **kwargs)  # type: ignore[arg-type]
