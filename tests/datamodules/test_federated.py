"""FederatedDataModule storage/validation, scenario construction and DigitsFederated; and beyond
the FedRC scenario: regression targets, clients from any partition, unseen clients, a separate
global test set, map-style datasets, mixture metadata."""

import dataclasses
import re

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import ClientMetadata, DigitsFederated, FederatedDataModule, partition
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors
from lightning_fedcluster.datamodules.federated import build_scenario, dataset_to_tensors
from lightning_fedcluster.datamodules.partition import held_out_count
from lightning_fedcluster.datamodules.shifts import label_map


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    return load_digits_tensors()


def pair(n: int, label: int = 0, features: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, features), torch.full((n,), label, dtype=torch.long)


def build(digits, **kwargs) -> FederatedDataModule:
    x, y = digits
    options = {"num_clients": 20, "concepts": 3, "image_shape": (1, 8, 8), "seed": 0}
    options.update(kwargs)
    return FederatedDataModule.from_tensors(x, y, **options)


def assert_same(a: FederatedDataModule, b: FederatedDataModule) -> None:
    for name in ("train", "test", "global"):
        for part in ("x", "y", "offsets"):
            assert torch.equal(getattr(a, f"{name}_{part}"), getattr(b, f"{name}_{part}")), name


# --- direct construction ---------------------------------------------------------------------


def test_concatenated_storage_and_views() -> None:
    train = [pair(3, 0), pair(5, 1), pair(2, 2)]
    test = [pair(1, 1), (torch.empty(0, 4), torch.empty(0, dtype=torch.long)), pair(2, 0)]
    held = [pair(4, 2), pair(4, 1)]
    dm = FederatedDataModule(train, test, held, batch_size=8)
    assert isinstance(dm, pl.LightningDataModule)
    assert dm.num_clients == 3 and dm.num_global_clients == 2
    assert dm.num_classes == 3 and dm.batch_size == 8
    assert dm.train_offsets.tolist() == [0, 3, 8, 10]
    # held-out rows [1, 0, 2]: floor(val_share * n) to validation, the rest to test
    assert dm.val_offsets.tolist() == [0, 0, 0, 1] and dm.test_offsets.tolist() == [0, 1, 1, 2]
    assert dm.global_offsets.tolist() == [0, 4, 8]
    assert dm.train_sizes.tolist() == [3, 5, 2] and dm.test_sizes.tolist() == [1, 0, 1]
    assert dm.train_sizes.dtype == torch.long and dm.train_offsets.dtype == torch.long
    assert dm.train_x.shape == (10, 4) and dm.train_x.dtype == torch.float32
    for i, (x, y) in enumerate(train):
        got_x, got_y = dm.train_split(i)
        assert torch.equal(got_x, x) and torch.equal(got_y, y)
        assert got_x.untyped_storage().data_ptr() == dm.train_x.untyped_storage().data_ptr()
    assert dm.test_split(1)[0].shape == (0, 4)
    assert torch.equal(dm.global_split(1)[1], held[1][1])
    with pytest.raises(IndexError, match="i must be"):
        dm.train_split(3)


def test_dtypes_are_normalised_and_images_kept() -> None:
    x = torch.rand(6, 1, 28, 28, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32)
    dm = FederatedDataModule([(x[:4], y[:4]), (x[4:], y[4:])], [(x[:1], y[:1]), (x[:0], y[:0])])
    assert dm.train_x.dtype == torch.float32 and dm.train_y.dtype == torch.long
    assert dm.train_x.shape == (6, 1, 28, 28)
    assert dm.num_global_clients == 0 and dm.global_x.shape == (0, 1, 28, 28)
    assert dm.num_classes == 6


def test_empty_test_split_may_be_given_as_flat_empty_tensor() -> None:
    empty = (torch.empty(0), torch.empty(0, dtype=torch.long))
    dm = FederatedDataModule([pair(3, 1)], [empty])
    assert dm.test_x.shape == (0, 4)


def test_default_and_custom_metadata() -> None:
    dm = FederatedDataModule([pair(2, 1), pair(2, 0)], [pair(1), pair(1)], [pair(2, 1)])
    assert dm.metadata.concept.tolist() == [0, 0]
    assert dm.metadata.feature_style == ["clean", "clean"]
    assert dm.metadata.global_concept.tolist() == [0]
    meta = ClientMetadata(torch.tensor([0, 2]), ["clean", "rotate:3"], torch.tensor([1]))
    dm = FederatedDataModule(
        [pair(2, 1), pair(2, 0)], [pair(1), pair(1)], [pair(2, 1)], metadata=meta
    )
    assert dm.metadata is meta
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.concept = torch.tensor([1, 1])  # type: ignore[misc]


VALIDATION_CASES = [
    ({"client_train": [], "client_test": []}, ValueError, "client_train is empty"),
    (
        {"client_train": [pair(2, 1)], "client_test": [pair(1), pair(1)]},
        ValueError,
        "client_test has 2 clients but client_train has 1",
    ),
    (
        {
            "client_train": [pair(2, 1)] * 3 + [pair(0)],
            "client_test": [pair(1)] * 4,
        },
        ValueError,
        re.escape(
            "client_train[3] is empty: every client needs at least one training sample; "
            "drop it or repartition"
        ),
    ),
    (
        {
            "client_train": [(torch.rand(3, 4), torch.zeros(2, dtype=torch.long))],
            "client_test": [pair(1)],
        },
        ValueError,
        re.escape("client_train[0] has 3 inputs but 2 labels"),
    ),
    (
        {"client_train": [pair(2, 1), pair(2, 0, features=5)], "client_test": [pair(1)] * 2},
        ValueError,
        re.escape("client_train[1] inputs have per-sample shape (5,)"),
    ),
    (
        {"client_train": [pair(2, 1)], "client_test": [pair(1, 7)], "num_classes": 3},
        ValueError,
        re.escape("client_test[0] has label 7 outside [0, num_classes=3)"),
    ),
    (
        {"client_train": [pair(2, 1), pair(2, -1)], "client_test": [pair(1)] * 2},
        ValueError,
        re.escape("client_train[1] has label -1 outside [0, num_classes="),
    ),
    (
        {
            "client_train": [pair(2, 1)],
            "client_test": [pair(1)],
            "global_test": [pair(2, 5)],
            "num_classes": 4,
        },
        ValueError,
        re.escape("global_test[0] has label 5"),
    ),
    (
        {"client_train": [pair(2, 1)], "client_test": [pair(1)], "batch_size": 0},
        ValueError,
        "batch_size",
    ),
    (
        {"client_train": [pair(2, 1)], "client_test": [pair(1)], "num_classes": 1},
        ValueError,
        "num_classes",
    ),
    (
        {"client_train": [pair(2, 0)], "client_test": [pair(1)]},
        ValueError,
        "num_classes was inferred as 1",
    ),
    (
        {
            "client_train": [pair(2, 1)],
            "client_test": [pair(1)],
            "metadata": ClientMetadata.default(2),
        },
        ValueError,
        "metadata.concept has 2 entries",
    ),
    (
        {"client_train": [(torch.rand(2, 4), torch.rand(2))], "client_test": [pair(1)]},
        TypeError,
        "labels",
    ),
    (
        {
            "client_train": [
                (torch.ones(2, 4, dtype=torch.long), torch.zeros(2, dtype=torch.long))
            ],
            "client_test": [pair(1)],
        },
        TypeError,
        r"client_train\[0\] inputs must be floating point",
    ),
    (
        {"client_train": pair(2, 1), "client_test": [pair(1)]},
        TypeError,
        r"client_train\[0\] must be an \(x, y\) pair",
    ),
    (
        {"client_train": [torch.rand(2, 4)], "client_test": [pair(1)]},
        TypeError,
        r"client_train\[0\]",
    ),
    (
        {"client_train": torch.rand(2, 4), "client_test": [pair(1)]},
        TypeError,
        "client_train must be a sequence",
    ),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), VALIDATION_CASES)
def test_constructor_validation(kwargs: dict, error: type[Exception], match: str) -> None:
    kwargs = dict(kwargs)
    args = (kwargs.pop("client_train"), kwargs.pop("client_test"))
    with pytest.raises(error, match=match):
        FederatedDataModule(*args, **kwargs)


# --- scenario construction -------------------------------------------------------------------


def test_scenario_sizes_and_types(digits) -> None:
    x, y = digits
    dm = build(digits)
    meta = dm.metadata
    assert dm.num_clients == 20 and dm.num_global_clients == 3 and dm.num_classes == 10
    # Stratified global hold-out, then every remaining sample in exactly one client split.
    held = sum(held_out_count(int(n), 0.2) for n in torch.bincount(y))
    assert dm.global_offsets.diff().tolist() == [held] * 3
    held_out = dm.val_sizes + dm.test_sizes
    assert int(dm.train_sizes.sum() + held_out.sum()) == x.shape[0] - held
    assert (dm.train_sizes + held_out).min() >= 2
    test_share = held_out.sum() / (dm.train_sizes.sum() + held_out.sum())
    assert 0.17 < float(test_share) < 0.23
    # The paper's mix: 10/5/5 clients, of which 4/1/1 corrupted.
    corrupted = torch.tensor([s != "clean" for s in meta.feature_style])
    assert torch.bincount(meta.concept, minlength=3).tolist() == [10, 5, 5]
    assert torch.bincount(meta.concept[corrupted], minlength=3).tolist() == [4, 1, 1]
    for style in meta.feature_style:
        if style != "clean":
            kind, severity = style.split(":")
            assert 1 <= int(severity) <= 5 and kind
    assert meta.global_concept.tolist() == [0, 1, 2]


def test_label_maps_hit_exactly_their_concepts(digits) -> None:
    # Same seed: the partition and train/test rows do not depend on concepts or corruption.
    plain = build(digits, concepts=1, corrupt_fraction=0)
    shifted = build(digits, concepts=3, corrupt_fraction=0)
    assert torch.equal(plain.train_x, shifted.train_x) and torch.equal(plain.test_x, shifted.test_x)
    changed = set()
    for i in range(shifted.num_clients):
        c = int(shifted.metadata.concept[i])
        table = label_map(c, 10)
        for split in ("train_split", "test_split"):
            _, y_plain = getattr(plain, split)(i)
            _, y_shift = getattr(shifted, split)(i)
            assert torch.equal(y_shift, table[y_plain])
            if not torch.equal(y_shift, y_plain):
                changed.add(i)
    assert changed == {i for i in range(20) if shifted.metadata.concept[i] != 0}


def test_labels_match_the_source_samples(digits) -> None:
    # Every client row is a row of x with its label mapped by the client's concept.
    x, y = digits
    dm = build(digits, corrupt_fraction=0)
    source = {tuple(row.tolist()): int(label) for row, label in zip(x, y, strict=True)}
    for i in range(dm.num_clients):
        table = label_map(int(dm.metadata.concept[i]), 10)
        xi, yi = dm.train_split(i)
        for row, label in zip(xi, yi, strict=True):
            assert int(label) == int(table[source[tuple(row.tolist())]])


def test_corruption_touches_exactly_the_corrupted_clients(digits) -> None:
    clean = build(digits, corrupt_fraction=0)
    mixed = build(digits)
    assert torch.equal(clean.metadata.concept, mixed.metadata.concept)
    assert torch.equal(clean.train_y, mixed.train_y) and torch.equal(
        clean.train_offsets, mixed.train_offsets
    )
    assert torch.equal(clean.global_x, mixed.global_x)
    for i, style in enumerate(mixed.metadata.feature_style):
        for split in ("train_split", "test_split"):
            x_clean, _ = getattr(clean, split)(i)
            x_mixed, _ = getattr(mixed, split)(i)
            if style == "clean" or x_clean.numel() == 0:
                assert torch.equal(x_clean, x_mixed), (i, style)
            else:
                assert (x_clean - x_mixed).abs().mean() > 1e-3, (i, style)
        assert x_mixed.min() >= 0 and x_mixed.max() <= 1


def test_global_clients_carry_concept_maps_on_clean_data(digits) -> None:
    x, y = digits
    dm = build(digits)
    rows = {tuple(row.tolist()): int(label) for row, label in zip(x, y, strict=True)}
    x0, y0 = dm.global_split(0)
    clean_labels = torch.tensor([rows[tuple(r.tolist())] for r in x0])  # clean: rows found
    assert torch.equal(y0, clean_labels)
    for g in range(3):
        xg, yg = dm.global_split(g)
        assert torch.equal(xg, x0)
        assert torch.equal(yg, label_map(g, 10)[clean_labels])


def test_same_seed_same_tensors_different_seed_different(digits) -> None:
    a, b, c = build(digits, seed=3), build(digits, seed=3), build(digits, seed=4)
    assert_same(a, b)
    assert a.metadata.feature_style == b.metadata.feature_style
    assert torch.equal(a.metadata.concept, b.metadata.concept)
    assert not torch.equal(a.train_offsets, c.train_offsets)
    assert not torch.equal(a.metadata.concept, c.metadata.concept)


def test_iid_scenario_has_equal_clients(digits) -> None:
    dm = build(digits, dirichlet_alpha=None, corrupt_fraction=0)
    sizes = dm.train_sizes + dm.test_sizes
    assert int(sizes.max() - sizes.min()) <= 1


def test_custom_proportions_and_fractions(digits) -> None:
    dm = build(
        digits,
        num_clients=10,
        concepts=2,
        concept_proportions=[0.3, 0.7],
        corrupt_fraction=[0.0, 0.5],
    )
    concept = dm.metadata.concept
    corrupted = torch.tensor([s != "clean" for s in dm.metadata.feature_style])
    assert torch.bincount(concept, minlength=2).tolist() == [3, 7]
    assert torch.bincount(concept[corrupted], minlength=2).tolist() == [
        0,
        3,
    ]  # 7 * 0.5 = 3.5: ties go to clean
    assert dm.num_global_clients == 2


def test_image_inputs_need_no_image_shape(digits) -> None:
    x, y = digits
    dm = FederatedDataModule.from_tensors(
        x.reshape(-1, 1, 8, 8), y, num_clients=10, concepts=3, seed=1
    )
    assert dm.train_x.shape[1:] == (1, 8, 8)
    assert (
        sum(s != "clean" for s in dm.metadata.feature_style) == 3
    )  # 5/3/2 clients; 5*0.4, 3*0.2, 2*0.2 -> 2+1+0


def test_tabular_inputs_without_corruption(digits) -> None:
    x, y = digits
    dm = FederatedDataModule.from_tensors(
        x * 3 - 1, y, num_clients=5, concepts=2, corrupt_fraction=0.0
    )
    assert dm.metadata.feature_style == ["clean"] * 5
    assert dm.num_global_clients == 2


def test_from_tensors_batch_size_and_no_global(digits) -> None:
    dm = build(digits, batch_size=7, global_test_fraction=0.0, corrupt_fraction=0)
    assert dm.batch_size == 7
    assert dm.num_global_clients == 0 and dm.metadata.global_concept.numel() == 0


SCENARIO_ERRORS = [
    ({"num_clients": 0}, "num_clients must be an integer >= 1"),
    ({"num_clients": 800}, "num_clients=800 needs at least"),
    ({"num_clients": 300, "min_client_size": 5}, "min_client_size"),
    ({"min_client_size": 0}, "min_client_size must be"),
    ({"concepts": 0}, "concepts must be an integer >= 1"),
    ({"concepts": 12}, "concepts=12 exceeds the 11 distinct label maps"),
    ({"dirichlet_alpha": 0.0}, "dirichlet_alpha must be a positive number"),
    ({"dirichlet_alpha": -1.0}, "dirichlet_alpha"),
    ({"dirichlet_alpha": 0.01, "num_clients": 200}, "dirichlet_alpha=0.01 left a client"),
    ({"test_fraction": 1.0}, r"test_fraction must be a number in \[0, 1\)"),
    ({"test_fraction": -0.1}, "test_fraction"),
    ({"global_test_fraction": 1.5}, "global_test_fraction"),
    ({"concept_proportions": [0.5, 0.5]}, "concept_proportions must be a sequence of 3"),
    ({"concept_proportions": [0.5, 0.3, 0.3]}, "concept_proportions must sum to 1"),
    ({"concept_proportions": [1.2, -0.1, -0.1]}, "concept_proportions must be non-negative"),
    ({"corrupt_fraction": 1.0}, r"corrupt_fraction must be a number in \[0, 1\)"),
    (
        {"corrupt_fraction": [0.1, 0.2]},
        "corrupt_fraction must be a number in .* or a sequence of 3",
    ),
    ({"image_shape": None}, "pass image_shape=.* or corrupt_fraction=0"),
    ({"image_shape": (1, 4, 4)}, r"image_shape=\(1, 4, 4\) has 16 values"),
    ({"image_shape": (1, 8)}, "image_shape must be"),
    ({"num_classes": 1}, "num_classes must be an integer >= 2"),
    ({"num_classes": 5}, r"y has label 9 outside \[0, num_classes=5\)"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
]


@pytest.mark.parametrize(("kwargs", "match"), SCENARIO_ERRORS)
def test_from_tensors_validation(digits, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build(digits, **kwargs)


def test_from_tensors_validates_tensors(digits) -> None:
    x, y = digits
    with pytest.raises(ValueError, match=r"x must be scaled to \[0, 1\] for corruptions"):
        FederatedDataModule.from_tensors(x * 16, y, num_clients=5, image_shape=(1, 8, 8))
    with pytest.raises(ValueError, match="concepts=3 exceeds the 2 distinct"):
        FederatedDataModule.from_tensors(x, y % 2, num_clients=5, concepts=3, corrupt_fraction=0)
    with pytest.raises(ValueError, match="y must be 1-D"):
        FederatedDataModule.from_tensors(x, y[:-1], num_clients=5)
    with pytest.raises(ValueError, match="y must hold class indices >= 0"):
        FederatedDataModule.from_tensors(x, y - 1, num_clients=5, corrupt_fraction=0)
    with pytest.raises(TypeError, match="x must be floating point"):
        FederatedDataModule.from_tensors((x * 16).long(), y, num_clients=5)
    with pytest.raises(TypeError, match="y must hold integer class indices"):
        FederatedDataModule.from_tensors(x, y.float(), num_clients=5)


def test_build_scenario_returns_constructor_arguments(digits) -> None:
    x, y = digits
    arguments = build_scenario(x, y, num_clients=4, corrupt_fraction=0)
    assert set(arguments) == {
        "client_train",
        "client_test",
        "global_test",
        "num_classes",
        "metadata",
    }
    assert len(arguments["client_train"]) == 4 and arguments["num_classes"] == 10


# --- DigitsFederated -------------------------------------------------------------------------


def test_digits_defaults() -> None:
    dm = DigitsFederated()
    assert dm.num_clients == 30 and dm.num_global_clients == 3 and dm.num_classes == 10
    assert dm.train_x.shape[1:] == (64,) and dm.train_x.dtype == torch.float32
    assert dm.train_x.min() >= 0 and dm.train_x.max() <= 1
    assert 44 < float((dm.train_sizes + dm.val_sizes + dm.test_sizes).float().mean()) < 52
    assert torch.bincount(dm.metadata.concept).tolist() == [15, 8, 7]
    assert sum(s != "clean" for s in dm.metadata.feature_style) == 6 + 2 + 1
    assert dm.metadata.global_concept.tolist() == [0, 1, 2]
    assert dm.hparams["num_clients"] == 30 and dm.hparams["concepts"] == 3
    _, y0 = dm.global_split(0)
    for g in (1, 2):
        xg, yg = dm.global_split(g)
        assert torch.equal(xg, dm.global_split(0)[0])
        assert torch.equal(yg, label_map(g, 10)[y0])


def test_digits_keyword_construction_matches_from_tensors(digits) -> None:
    config = {
        "num_clients": 8,
        "concepts": 2,
        "dirichlet_alpha": 0.5,
        "corrupt_fraction": 0.25,
        "seed": 5,
    }
    dm = DigitsFederated(**config, batch_size=16)
    x, y = digits
    ref = FederatedDataModule.from_tensors(x, y, image_shape=(1, 8, 8), num_classes=10, **config)
    assert_same(dm, ref)
    assert dm.batch_size == 16 and dm.metadata.feature_style == ref.metadata.feature_style
    assert (
        type(DigitsFederated.from_tensors(x, y, num_clients=3, corrupt_fraction=0))
        is FederatedDataModule
    )


def test_digits_validation_names_the_argument() -> None:
    with pytest.raises(ValueError, match="num_clients"):
        DigitsFederated(num_clients=0)
    with pytest.raises(ValueError, match="batch_size"):
        DigitsFederated(batch_size=0)


# --- beyond the FedRC scenario: regression targets, clients from any partition, unseen clients, --
# a separate global test set, map-style datasets, mixture metadata --------------------------------


def reg(n: int, d: int | None = None, features: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (n,) if d is None else (n, d)
    return torch.rand(n, features), torch.randn(shape)


def lab(n: int, label: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, 3), torch.full((n,), label, dtype=torch.long)


# --- regression ------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [None, 2])
def test_float_targets_make_a_regression_task(d: int | None) -> None:
    empty = (torch.empty(0, 3), torch.empty((0,) if d is None else (0, d)))
    dm = FederatedDataModule([reg(4, d), reg(3, d)], [reg(1, d), empty], [reg(5, d)])
    assert dm.task == "regression" and dm.num_classes is None
    assert dm.target_shape == (() if d is None else (d,))
    assert dm.output_size == (1 if d is None else d)
    assert dm.train_y.dtype == torch.float32 and dm.train_y.shape == ((7,) if d is None else (7, d))
    assert dm.test_y.shape[0] == 1 and dm.global_y.shape[0] == 5
    assert dm.metadata.concept.tolist() == [0, 0]
    no_global = FederatedDataModule([reg(4, d)], [reg(1, d)])
    assert no_global.global_y.dtype == torch.float32 and no_global.global_y.shape[1:] == dm.target_shape


def test_classification_reports_its_task() -> None:
    dm = FederatedDataModule([lab(3, 0), lab(2, 2)], [lab(1), lab(1)])
    assert dm.task == "classification" and dm.num_classes == 3 and dm.output_size == 3
    assert dm.target_shape == ()


REGRESSION_ERRORS = [
    ({"client_train": [reg(2)], "client_test": [lab(1)]}, TypeError,
     re.escape("client_test[0] targets must be floating point for a regression task")),
    ({"client_train": [reg(2)], "client_test": [reg(1)], "num_classes": 3}, TypeError,
     re.escape("client_train[0] labels must be integer class indices")),
    ({"client_train": [reg(2)], "client_test": [reg(1)], "task": "regression", "num_classes": 2},
     ValueError, "pass num_classes=None"),
    ({"client_train": [reg(2)], "client_test": [reg(1)], "task": "ranking"}, ValueError,
     "task must be"),
    ({"client_train": [reg(2, 2)], "client_test": [reg(1, 3)]}, ValueError,
     re.escape("client_test[0] targets have per-sample shape (3,)")),
    ({"client_train": [(torch.rand(2, 3), torch.rand(2, 2, 2))], "client_test": [reg(1)]},
     ValueError, re.escape("regression targets must be [N] or [N, D]")),
    ({"client_train": [lab(2)], "client_test": [lab(1)], "task": "regression"}, TypeError,
     "use y.float"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), REGRESSION_ERRORS)
def test_regression_validation(kwargs: dict, error: type[Exception], match: str) -> None:
    kwargs = dict(kwargs)
    args = (kwargs.pop("client_train"), kwargs.pop("client_test"))
    with pytest.raises(error, match=match):
        FederatedDataModule(*args, **kwargs)


# --- metadata mixture ------------------------------------------------------------------------


def test_metadata_mixture_is_checked() -> None:
    meta = ClientMetadata(torch.tensor([0, 1]), ["clean"] * 2, torch.tensor([0, 1]),
                          mixture=torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float64))
    assert meta.mixture.dtype == torch.float32
    for bad in (torch.tensor([[0.5, 0.4], [0.3, 0.7]]), torch.tensor([0.5, 0.5]),
                torch.tensor([[1.2, -0.2], [0.3, 0.7]]), torch.tensor([[1, 0], [0, 1]])):
        with pytest.raises(ValueError, match="metadata.mixture must be"):
            ClientMetadata(torch.tensor([0, 1]), ["clean"] * 2, torch.tensor([0]), mixture=bad)


# --- clients from any partition --------------------------------------------------------------


def test_from_partition_with_unseen_clients(digits) -> None:
    x, y = digits
    parts = partition.n_class_split(y.numpy(), 20, 2, np.random.default_rng(0))
    concept = np.arange(20) % 2
    dm = FederatedDataModule.from_partition(x, y, parts, concept=concept, unseen_fraction=0.2,
                                            test_fraction=0.25, seed=3, batch_size=8)
    assert dm.num_clients == 16 and dm.num_global_clients == 4 and dm.batch_size == 8
    seen, unseen = partition.holdout_clients(20, 0.2, np.random.default_rng(
        np.random.SeedSequence(3).spawn(2)[0]))
    assert dm.metadata.concept.tolist() == concept[seen].tolist()
    assert dm.metadata.global_concept.tolist() == concept[unseen].tolist()
    for g, i in enumerate(unseen):  # an unseen client keeps all its rows
        gx, gy = dm.global_split(g)
        assert torch.equal(gx, x[parts[i]]) and torch.equal(gy, y[parts[i]])
    for j, i in enumerate(seen):
        (tx, ty), (vx, vy), (sx, sy) = dm.train_split(j), dm.val_split(j), dm.test_split(j)
        assert tx.shape[0] + vx.shape[0] + sx.shape[0] == parts[i].size
        assert vx.shape[0] + sx.shape[0] == partition.held_out_count(parts[i].size, 0.25)
        assert set(torch.cat([ty, vy, sy]).tolist()) == set(y[parts[i]].tolist())
    again = FederatedDataModule.from_partition(x, y, parts, concept=concept, unseen_fraction=0.2,
                                               test_fraction=0.25, seed=3)
    assert torch.equal(again.train_x, dm.train_x) and torch.equal(again.global_y, dm.global_y)


def test_from_partition_regression_with_natural_ids() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0])
    ids = np.repeat(["a", "b", "c"], [10, 20, 30])
    mixture = np.array([[1.0, 0.0], [0.5, 0.5], [0.2, 0.8]])
    dm = FederatedDataModule.from_partition(x, y, partition.natural_split(ids), mixture=mixture,
                                            concept=[0, 0, 1])
    assert dm.task == "regression" and dm.num_clients == 3
    assert (dm.train_sizes + dm.val_sizes + dm.test_sizes).tolist() == [10, 20, 30]
    assert torch.allclose(dm.metadata.mixture, torch.tensor(mixture, dtype=torch.float32))


def test_from_partition_validation(digits) -> None:
    x, y = digits
    with pytest.raises(ValueError, match=r"parts\[1\] is empty"):
        FederatedDataModule.from_partition(x, y, [np.arange(5), np.array([], dtype=int)])
    with pytest.raises(ValueError, match=r"parts\[0\] must hold integer row indices"):
        FederatedDataModule.from_partition(x, y, [np.array([0, 5000])])
    with pytest.raises(ValueError, match="concept has 1 entries but there are 2 parts"):
        FederatedDataModule.from_partition(x, y, [np.arange(5), np.arange(5, 9)], concept=[0])
    with pytest.raises(ValueError, match="unseen_fraction must be a number in"):
        FederatedDataModule.from_partition(x, y, [np.arange(5)], unseen_fraction=1.5)


def test_dataset_to_tensors_reads_map_style_datasets() -> None:
    data = torch.utils.data.TensorDataset(torch.rand(5, 2, 2), torch.tensor([0, 1, 1, 0, 2]))
    x, y = dataset_to_tensors(data)
    assert x.shape == (5, 2, 2) and y.tolist() == [0, 1, 1, 0, 2] and y.dtype == torch.long
    x2, y2 = dataset_to_tensors(data, indices=[4, 0])
    assert y2.tolist() == [2, 0] and torch.equal(x2[0], data[4][0])
    with pytest.raises(TypeError, match="map-style dataset"):
        dataset_to_tensors(iter([1, 2]))


# --- separate global test set ----------------------------------------------------------------


def test_global_test_from_a_separate_set(digits) -> None:
    x, y = digits
    train_x, train_y, test_x, test_y = x[:1400], y[:1400], x[1400:], y[1400:]
    args = build_scenario(train_x, train_y, num_clients=10, concepts=3, image_shape=(1, 8, 8),
                          global_test=(test_x, test_y), seed=0)
    assert sum(tx.shape[0] + sx.shape[0] for (tx, _), (sx, _) in
               zip(args["client_train"], args["client_test"], strict=True)) == 1400
    assert len(args["global_test"]) == 3
    for c, (gx, gy) in enumerate(args["global_test"]):
        assert torch.equal(gx, test_x)  # clean inputs, the concept's label map
        assert torch.equal(gy, {0: test_y, 1: 9 - test_y, 2: (test_y + 1) % 10}[c])
    with pytest.raises(ValueError, match="global_test_fraction=0.2 was given together with global_test"):
        build_scenario(train_x, train_y, num_clients=10, global_test=(test_x, test_y),
                       global_test_fraction=0.2, corrupt_fraction=0)
    with pytest.raises(ValueError, match="global_test inputs have per-sample shape"):
        build_scenario(train_x, train_y, num_clients=10, global_test=(test_x[:, :10], test_y),
                       corrupt_fraction=0)
