"""Honest evaluation splits: validation apart from test, global adapt rows apart from score rows.

Every construction path (the constructor, from_tensors, from_partition and the subclasses) is
checked against the held-out rows it would have used as its test split before: the validation and
test rows of a client are disjoint and together are exactly those rows. Rows are matched by their
positions (`evaluation_rows`), so duplicate rows cannot fool the comparison; the content is
checked row by row at those positions, and as a multiset.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import (
    CSVFederated,
    DigitsFederated,
    FedEMSynthetic,
    FederatedDataModule,
    FedSoftSynthetic,
    build_clients,
    build_scenario,
    partition,
)
from lightning_fedcluster.datamodules.datasets import vision as vision_module
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors
from lightning_fedcluster.datamodules.datasets.fedem_synthetic import generate_mixture
from lightning_fedcluster.datamodules.datasets.fedsoft_synthetic import generate_fedsoft_data
from lightning_fedcluster.datamodules.evaluation_splits import adapt_count, val_count
from tests.datamodules.datasets.test_tabular import write_drift_csv

STAGES = ("val", "test")
GLOBAL_PARTS = ("global_adapt", "global_score")


# --- helpers ---------------------------------------------------------------------------------


def client_positions(dm: FederatedDataModule, stage: str, part: str, client: int) -> torch.Tensor:
    """Positions (within the client's rows) of one client's rows in an evaluation part."""
    _, _, offsets = dm.evaluation_split(stage, part)
    rows = dm.evaluation_rows(stage, part)
    return rows[int(offsets[client]) : int(offsets[client + 1])]


def client_part(dm: FederatedDataModule, stage: str, part: str, client: int):
    x, y, offsets = dm.evaluation_split(stage, part)
    start, stop = int(offsets[client]), int(offsets[client + 1])
    return x[start:stop], y[start:stop]


def multiset(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct (x, y) rows and how often each occurs: equal multisets give equal results."""
    targets = y.unsqueeze(1) if y.ndim == 1 else y
    rows = torch.cat([x.flatten(1).double(), targets.double()], dim=1)
    return torch.unique(rows, dim=0, return_counts=True)


def assert_partition(parts: list[torch.Tensor], n: int) -> None:
    """The position sets are pairwise disjoint and together are exactly 0..n-1."""
    joined = torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)
    assert joined.numel() == n, (joined.numel(), n)
    assert torch.equal(joined.sort().values, torch.arange(n))
    for p in parts:
        assert torch.equal(p, p.sort().values)  # original order kept within a part


def assert_local_splits(dm: FederatedDataModule, held: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Client i's validation and test rows are disjoint and together are exactly held[i]."""
    assert len(held) == dm.num_clients
    assert dm.val_offsets.shape == dm.test_offsets.shape == (dm.num_clients + 1,)
    assert torch.equal(dm.val_sizes, dm.val_offsets.diff())
    for i, (hx, hy) in enumerate(held):
        n = hy.shape[0]
        val_pos = client_positions(dm, "val", "local", i)
        test_pos = client_positions(dm, "test", "local", i)
        assert_partition([val_pos, test_pos], n)
        assert val_pos.numel() == val_count(n, dm.val_share) == math.floor(dm.val_share * n + 1e-9)
        (vx, vy), (tx, ty) = dm.val_split(i), dm.test_split(i)
        assert torch.equal(vx, hx[val_pos]) and torch.equal(vy, hy[val_pos])
        assert torch.equal(tx, hx[test_pos]) and torch.equal(ty, hy[test_pos])
        got = multiset(torch.cat([vx, tx]), torch.cat([vy, ty]))
        want = multiset(hx, hy)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def assert_global_splits(dm: FederatedDataModule) -> None:
    """Each global client's four parts are disjoint, cover it, have the documented sizes and hold
    its rows; global_x keeps the whole client."""
    for stage in STAGES:
        for part in GLOBAL_PARTS:
            x, y, offsets = dm.evaluation_split(stage, part)
            assert offsets.shape == (dm.num_global_clients + 1,) and x.shape[0] == y.shape[0] == offsets[-1]
            assert x.shape[1:] == dm.global_x.shape[1:]
    for g in range(dm.num_global_clients):
        gx, gy = dm.global_split(g)
        n = gy.shape[0]
        positions = {(s, p): client_positions(dm, s, p, g) for s in STAGES for p in GLOBAL_PARTS}
        assert_partition(list(positions.values()), n)
        n_val = val_count(n, dm.val_share)
        for stage, size in (("val", n_val), ("test", n - n_val)):
            adapt, score = positions[stage, "global_adapt"], positions[stage, "global_score"]
            assert adapt.numel() + score.numel() == size
            assert adapt.numel() == adapt_count(size, dm.adapt_fraction)
            assert not set(adapt.tolist()) & set(score.tolist())
            for part, pos in (("global_adapt", adapt), ("global_score", score)):
                px, py = client_part(dm, stage, part, g)
                assert torch.equal(px, gx[pos]) and torch.equal(py, gy[pos])


def assert_honest(dm: FederatedDataModule, held: list | None = None) -> None:
    if held is not None:
        assert_local_splits(dm, held)
    else:  # no reference at hand: the bookkeeping must still partition each client's rows
        for i in range(dm.num_clients):
            n = int(dm.val_sizes[i] + dm.test_sizes[i])
            assert_partition(
                [client_positions(dm, "val", "local", i), client_positions(dm, "test", "local", i)], n
            )
            assert int(dm.val_sizes[i]) == val_count(n, dm.val_share)
    assert_global_splits(dm)
    x, y, offsets = dm.evaluation_split("val", "local")
    assert x is dm.val_x and y is dm.val_y and offsets is dm.val_offsets
    x, y, offsets = dm.evaluation_split("test", "local")
    assert x is dm.test_x and y is dm.test_y and offsets is dm.test_offsets
    dm.check_finite()


def pair(n: int, seed: int, features: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, features, generator=g), torch.randint(0, 3, (n,), generator=g)


def ready_made(held_sizes=(0, 1, 2, 3, 7, 20), global_sizes=(1, 2, 5, 0, 40)):
    train = [pair(4, i) for i in range(len(held_sizes))]
    held = [pair(n, 100 + i) for i, n in enumerate(held_sizes)]
    global_test = [pair(n, 200 + g) for g, n in enumerate(global_sizes)]
    return train, held, global_test


@pytest.fixture(scope="module")
def digits_tensors():
    return load_digits_tensors()


# --- sizes and rounding ----------------------------------------------------------------------


def test_counts_follow_the_documented_rounding() -> None:
    # validation: floor(val_share * n), test keeps the rest (a lone held-out row is a test row)
    assert [val_count(n, 0.5) for n in range(7)] == [0, 0, 1, 1, 2, 2, 3]
    assert val_count(100, 0.29) == 29 and val_count(10, 0.7) == 7
    # adapt: round half up, clamped to [1, n - 1] for n >= 2; a lone row is scored
    assert [adapt_count(n, 0.4) for n in range(11)] == [0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4]
    assert adapt_count(1000, 0.4) == 400 and adapt_count(5, 0.9) == 4 and adapt_count(5, 0.01) == 1


def test_ready_made_splits_small_and_empty_clients() -> None:
    train, held, global_test = ready_made()
    dm = FederatedDataModule(train, held, global_test, num_classes=3, seed=5)
    assert_honest(dm, held)
    assert dm.val_sizes.tolist() == [0, 0, 1, 1, 3, 10]
    assert dm.test_sizes.tolist() == [0, 1, 1, 2, 4, 10]  # the client with one row: test
    # global sizes 1, 2, 5, 0, 40 -> validation 0, 1, 2, 0, 20 and test 1, 1, 3, 0, 20
    sizes = {(s, p): dm.evaluation_split(s, p)[2].diff().tolist() for s in STAGES for p in GLOBAL_PARTS}
    assert sizes["val", "global_adapt"] == [0, 0, 1, 0, 8]
    assert sizes["val", "global_score"] == [0, 1, 1, 0, 12]
    assert sizes["test", "global_adapt"] == [0, 0, 1, 0, 8]
    assert sizes["test", "global_score"] == [1, 1, 2, 0, 12]
    # training rows untouched; global_x keeps every global client whole
    for i, (x, y) in enumerate(train):
        assert torch.equal(dm.train_split(i)[0], x) and torch.equal(dm.train_split(i)[1], y)
    for g, (x, y) in enumerate(global_test):
        assert torch.equal(dm.global_split(g)[0], x) and torch.equal(dm.global_split(g)[1], y)


def test_custom_shares_and_no_global_clients() -> None:
    train, held, _ = ready_made()
    dm = FederatedDataModule(train, held, num_classes=3, val_share=0.3, adapt_fraction=0.6)
    assert dm.val_share == 0.3 and dm.adapt_fraction == 0.6 and dm.seed == 0
    assert dm.val_sizes.tolist() == [0, 0, 0, 0, 2, 6]
    assert_honest(dm, held)
    for stage in STAGES:
        for part in GLOBAL_PARTS:
            x, y, offsets = dm.evaluation_split(stage, part)
            assert x.shape == (0, 3) and y.shape == (0,) and offsets.tolist() == [0]


def test_global_parts_at_scale_follow_adapt_fraction() -> None:
    train, held, _ = ready_made()
    global_test = [pair(n, 300 + g) for g, n in enumerate((1000, 999, 10))]
    dm = FederatedDataModule(train, held, global_test, num_classes=3)
    assert_honest(dm, held)
    adapt = dm.evaluation_split("val", "global_adapt")[2].diff().tolist()
    score = dm.evaluation_split("val", "global_score")[2].diff().tolist()
    assert adapt == [200, 200, 2] and score == [300, 299, 3]  # 40 % / 60 % of 500, 499, 5
    adapt = dm.evaluation_split("test", "global_adapt")[2].diff().tolist()
    assert adapt == [200, 200, 2]


# --- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0, -0.1, 1.5, float("nan"), float("inf"), True, "0.5", None])
def test_bad_val_share_is_refused(value) -> None:
    train, held, global_test = ready_made()
    with pytest.raises(ValueError, match="val_share"):
        FederatedDataModule(train, held, global_test, num_classes=3, val_share=value)


def test_zero_val_share_says_validation_would_reuse_test_rows(digits_tensors) -> None:
    train, held, _ = ready_made()
    message = re.escape("val_share=0 leaves no validation rows, so validation would reuse the test rows")
    with pytest.raises(ValueError, match=message):
        FederatedDataModule(train, held, num_classes=3, val_share=0)
    x, y = digits_tensors
    with pytest.raises(ValueError, match=message):
        FederatedDataModule.from_tensors(x, y, num_clients=4, corrupt_fraction=0, val_share=0)
    with pytest.raises(ValueError, match=message):
        DigitsFederated(num_clients=4, val_share=0.0)


@pytest.mark.parametrize("value", [0, 1, -0.4, 1.4, float("nan"), False, "0.4", None])
def test_bad_adapt_fraction_is_refused(value, digits_tensors) -> None:
    train, held, global_test = ready_made()
    with pytest.raises(ValueError, match="adapt_fraction must be a number in \\(0, 1\\)"):
        FederatedDataModule(train, held, global_test, num_classes=3, adapt_fraction=value)
    x, y = digits_tensors
    parts = partition.iid_split(y.numel(), 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="adapt_fraction"):
        FederatedDataModule.from_partition(x, y, parts, adapt_fraction=value)


def test_bad_seed_stage_and_part() -> None:
    train, held, global_test = ready_made()
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        FederatedDataModule(train, held, num_classes=3, seed=-1)
    dm = FederatedDataModule(train, held, global_test, num_classes=3)
    with pytest.raises(ValueError, match="stage must be 'val' or 'test'"):
        dm.evaluation_split("validation", "local")
    with pytest.raises(ValueError, match="part must be 'local', 'global_adapt' or 'global_score'"):
        dm.evaluation_split("val", "global")
    with pytest.raises(ValueError, match="part must be"):
        dm.evaluation_rows("test", "adapt")
    with pytest.raises(IndexError, match="i must be"):
        dm.val_split(dm.num_clients)


# --- determinism -----------------------------------------------------------------------------


def all_positions(dm: FederatedDataModule) -> list[torch.Tensor]:
    return [dm.evaluation_rows(s, p) for s in STAGES for p in ("local", *GLOBAL_PARTS)]


def test_same_seed_same_splits_other_seed_other_splits() -> None:
    train, held, global_test = ready_made()
    a = FederatedDataModule(train, held, global_test, num_classes=3, seed=7)
    b = FederatedDataModule(train, held, global_test, num_classes=3, seed=7)
    c = FederatedDataModule(train, held, global_test, num_classes=3, seed=8)
    assert all(torch.equal(p, q) for p, q in zip(all_positions(a), all_positions(b), strict=True))
    assert torch.equal(a.val_x, b.val_x) and torch.equal(a.test_x, b.test_x)
    assert not all(torch.equal(p, q) for p, q in zip(all_positions(a), all_positions(c), strict=True))
    assert torch.equal(a.train_x, c.train_x)  # the seed of the splits never touches training
    # adding global clients leaves the participating clients' split as it was
    d = FederatedDataModule(train, held, num_classes=3, seed=7)
    assert torch.equal(d.evaluation_rows("val", "local"), a.evaluation_rows("val", "local"))


def test_from_tensors_val_share_changes_only_the_validation_test_cut(digits_tensors) -> None:
    x, y = digits_tensors
    options = dict(num_clients=6, concepts=3, image_shape=(1, 8, 8), seed=2)
    a = FederatedDataModule.from_tensors(x, y, **options)
    b = FederatedDataModule.from_tensors(x, y, **options, val_share=0.25, adapt_fraction=0.5)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.train_offsets, b.train_offsets)
    assert torch.equal(a.global_x, b.global_x) and torch.equal(a.global_y, b.global_y)
    assert torch.equal(a.val_sizes + a.test_sizes, b.val_sizes + b.test_sizes)
    assert (b.val_sizes <= a.val_sizes).all() and b.val_sizes.sum() < a.val_sizes.sum()
    again = FederatedDataModule.from_tensors(x, y, **options)
    assert all(torch.equal(p, q) for p, q in zip(all_positions(a), all_positions(again), strict=True))


# --- every construction path -----------------------------------------------------------------


def test_constructor_path() -> None:
    train, held, global_test = ready_made()
    assert_honest(FederatedDataModule(train, held, global_test, num_classes=3, seed=1), held)


def test_from_tensors_and_build_scenario_paths(digits_tensors) -> None:
    x, y = digits_tensors
    options = dict(num_clients=8, concepts=3, image_shape=(1, 8, 8), seed=4)
    dm = FederatedDataModule.from_tensors(x, y, **options)
    arguments = build_scenario(x.reshape(-1, 1, 8, 8), y, **options)  # from_tensors serves images
    assert_honest(dm, arguments["client_test"])
    assert dm.num_global_clients == 3
    # the constructor fed by build_scenario, with the same seed, gives the very same splits
    direct = FederatedDataModule(**arguments, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(all_positions(dm), all_positions(direct), strict=True))
    assert torch.equal(dm.val_x, direct.val_x) and torch.equal(dm.test_y, direct.test_y)
    separate = FederatedDataModule.from_tensors(
        x[:1500], y[:1500], num_clients=5, corrupt_fraction=0, global_test=(x[1500:], y[1500:]), seed=1
    )
    held = build_scenario(
        x[:1500], y[:1500], num_clients=5, corrupt_fraction=0, global_test=(x[1500:], y[1500:]), seed=1
    )["client_test"]
    assert_honest(separate, held)


def test_from_partition_and_build_clients_paths(digits_tensors) -> None:
    x, y = digits_tensors
    parts = partition.dirichlet_split(y.numpy(), 12, 0.5, np.random.default_rng(0), min_size=5)
    options = dict(test_fraction=0.3, unseen_fraction=0.25, seed=9)
    dm = FederatedDataModule.from_partition(x, y, parts, val_share=0.4, **options)
    arguments = build_clients(x, y, parts, **options)
    assert dm.val_share == 0.4 and dm.num_global_clients == 3
    assert_honest(dm, arguments["client_test"])
    for g, (gx, gy) in enumerate(arguments["global_test"]):  # unseen clients stay whole in global_x
        assert torch.equal(dm.global_split(g)[0], gx) and torch.equal(dm.global_split(g)[1], gy)


def test_digits_path_matches_the_old_held_out_rows(digits_tensors) -> None:
    """DigitsFederated's validation + test rows are exactly the held-out rows the scenario makes
    (the old test split), compared by position and by content; training rows are unchanged."""
    dm = DigitsFederated(num_clients=10, seed=3)
    x, y = digits_tensors
    arguments = build_scenario(
        x, y, num_clients=10, concepts=3, num_classes=10, image_shape=(1, 8, 8), seed=3
    )
    assert_honest(dm, arguments["client_test"])
    old = FederatedDataModule(**arguments, seed=3)
    assert torch.equal(dm.train_x, old.train_x) and torch.equal(dm.train_y, old.train_y)
    assert torch.equal(dm.train_x, torch.cat([tx for tx, _ in arguments["client_train"]]))
    assert dm.hparams["val_share"] == 0.5 and dm.hparams["adapt_fraction"] == 0.4
    custom = DigitsFederated(num_clients=10, seed=3, val_share=0.2, adapt_fraction=0.5)
    assert custom.val_share == 0.2 and custom.adapt_fraction == 0.5
    assert_honest(custom, arguments["client_test"])


def test_csv_path_keeps_every_held_out_row(tmp_path) -> None:
    path = write_drift_csv(tmp_path / "drift.csv", n=600)
    options = dict(label_column="class", time_column="date", num_segments=2, num_clients=6, seed=1)
    dm = CSVFederated(str(path), **options)
    other = CSVFederated(str(path), **options, val_share=0.3, adapt_fraction=0.5)
    assert_honest(dm)
    assert_honest(other)

    def row_ids(x):  # the "row" column: each CSV row's own number
        return set((x * dm.feature_std + dm.feature_mean)[:, 2].round().long().tolist())

    for i in range(dm.num_clients):
        val, test = row_ids(dm.val_split(i)[0]), row_ids(dm.test_split(i)[0])
        assert not val & test
        assert val | test == row_ids(other.val_split(i)[0]) | row_ids(other.test_split(i)[0])
        assert row_ids(dm.train_split(i)[0]) == row_ids(other.train_split(i)[0])
    assert dm.num_global_clients == 2


def test_fedem_synthetic_path_and_its_latent_components() -> None:
    options = dict(num_clients=12, dim=5, min_samples=10, max_samples=60, global_test_size=9, seed=2)
    dm = FedEMSynthetic(**options)
    mixture = generate_mixture(12, dim=5, min_samples=10, max_samples=60, seed=2)
    held, held_z = [], []
    for t in range(12):
        start, stop = int(mixture.offsets[t]), int(mixture.offsets[t + 1])
        cut = stop - min(round(0.2 * (stop - start)), stop - start - 1)
        held.append((mixture.x[cut:stop], mixture.y[cut:stop]))
        held_z.append(mixture.z[cut:stop])
    assert_honest(dm, held)
    assert dm.val_z.shape == dm.val_y.shape and dm.test_z.shape == dm.test_y.shape
    for t in range(12):
        v0, v1 = int(dm.val_offsets[t]), int(dm.val_offsets[t + 1])
        s0, s1 = int(dm.test_offsets[t]), int(dm.test_offsets[t + 1])
        assert torch.equal(dm.val_z[v0:v1], held_z[t][client_positions(dm, "val", "local", t)])
        assert torch.equal(dm.test_z[s0:s1], held_z[t][client_positions(dm, "test", "local", t)])
    assert dm.num_global_clients == 3  # 9 rows each: validation 4 (2 adapt), test 5 (2 adapt)
    assert dm.evaluation_split("val", "global_adapt")[2].diff().tolist() == [2, 2, 2]
    assert dm.evaluation_split("test", "global_score")[2].diff().tolist() == [3, 3, 3]


def test_fedsoft_synthetic_path() -> None:
    dm = FedSoftSynthetic(num_clients=6, global_test_size=20, seed=1, val_share=0.5, adapt_fraction=0.4)
    data = generate_fedsoft_data(num_clients=6, global_test_size=20, seed=1)
    held = build_clients(data["x"], data["y"], data["parts"], seed=1)["client_test"]
    assert dm.task == "regression"
    assert_honest(dm, held)
    assert dm.evaluation_split("val", "global_adapt")[2].diff().tolist() == [4, 4]  # 40 % of 10


@pytest.mark.parametrize(
    ("cls", "shape", "classes"),
    [
        (vision_module.FashionMNISTFederated, (1, 28, 28), 10),
        (vision_module.CIFAR10Federated, (3, 32, 32), 10),
        (vision_module.CIFAR100Federated, (3, 32, 32), 100),
    ],
    ids=["fashion_mnist", "cifar10", "cifar100"],
)
def test_vision_paths(cls, shape, classes, monkeypatch) -> None:
    """The vision datamodules (their files replaced by random images: no torchvision needed)."""

    def fake_tensors(name, root="data", *, train=True, download=False):
        g = torch.Generator().manual_seed(int(train))
        n = 400 if train else 60
        return torch.rand(n, *shape, generator=g), torch.arange(n) % classes

    monkeypatch.setattr(vision_module, "load_vision_tensors", fake_tensors)
    options = dict(num_clients=8, corrupt_fraction=0.0, seed=0)
    dm = cls(**options, val_share=0.4, adapt_fraction=0.3)
    x, y = fake_tensors("", train=True)
    tx, ty = fake_tensors("", train=False)
    held = build_scenario(
        x,
        y,
        num_clients=8,
        concepts=3,
        corrupt_fraction=0.0,
        num_classes=classes,
        seed=0,
        global_test=(tx, ty),
    )["client_test"]
    assert dm.val_share == 0.4 and dm.adapt_fraction == 0.3 and dm.num_global_clients == 3
    assert_honest(dm, held)
    assert dm.evaluation_split("val", "global_adapt")[2].diff().tolist() == [7, 7, 7]  # 30 % of 24


# --- input checks cover the new splits -------------------------------------------------------


def test_non_finite_rows_in_the_new_splits_are_caught() -> None:
    train, held, global_test = ready_made()
    dm = FederatedDataModule(train, held, global_test, num_classes=3)
    client = 5
    dm.val_x[int(dm.val_offsets[client]) + 2, 0] = float("nan")  # e.g. a bad in-place normalisation
    with pytest.raises(ValueError, match=re.escape(f"client_val[{client}] has 1 of 10 rows with NaN or Inf")):
        dm.setup("validate")
    dm = FederatedDataModule(train, held, global_test, num_classes=3)
    dm.test_x[int(dm.test_offsets[4]), 1] = float("inf")
    with pytest.raises(ValueError, match=re.escape("client_test[4] has 1 of 4 rows with NaN or Inf")):
        dm.check_finite()
    # a global client's adapt rows are gathered from global_x, whose check covers them
    dm = FederatedDataModule(train, held, global_test, num_classes=3)
    g = 4
    row = int(dm.global_offsets[g]) + int(client_positions(dm, "test", "global_adapt", g)[0])
    dm.global_x[row, 2] = float("nan")
    assert dm.evaluation_split("test", "global_adapt")[0].isnan().any()
    with pytest.raises(ValueError, match=re.escape(f"global_test[{g}] has 1 of 40 rows with NaN or Inf")):
        dm.setup("test")


def test_non_finite_held_out_rows_are_named_as_given() -> None:
    train, held, global_test = ready_made()
    x, y = held[5]
    x = x.clone()
    x[13, 0] = float("nan")
    held[5] = (x, y)
    message = re.escape("client_test[5] has 1 of 20 rows with NaN or Inf in its inputs x (first at row 13)")
    with pytest.raises(ValueError, match=message):
        FederatedDataModule(train, held, global_test, num_classes=3)
