"""build_scenario: the FedRC scenario (label skew, corruptions, concept label maps) from labelled
tensors, its argument checks, and `preset="authors"`: the FedRC authors' client mix
(create_c/make_fmnist_c.py, make_cifar_c.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import FederatedDataModule, build_scenario, shifts
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors
from lightning_fedcluster.datamodules.partition import held_out_count
from lightning_fedcluster.datamodules.shifts import FASHION_MNIST_C, label_map
from tests.datamodules.partition.test_counts import type_counts


def build(digits, **kwargs) -> FederatedDataModule:
    x, y = digits
    options = {"num_clients": 20, "concepts": 3, "image_shape": (1, 8, 8), "seed": 0}
    options.update(kwargs)
    return FederatedDataModule.from_tensors(x, y, **options)


def assert_same(a: FederatedDataModule, b: FederatedDataModule) -> None:
    for name in ("train", "test", "global"):
        for part in ("x", "y", "offsets"):
            assert torch.equal(getattr(a, f"{name}_{part}"), getattr(b, f"{name}_{part}")), name


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
            assert int(label) == int(table[source[tuple(row.flatten().tolist())]])


def test_corruption_touches_exactly_the_corrupted_clients(digits) -> None:
    clean = build(digits, corrupt_fraction=0)
    mixed = build(digits)
    assert torch.equal(clean.metadata.concept, mixed.metadata.concept)
    assert torch.equal(clean.train_y, mixed.train_y) and torch.equal(clean.train_offsets, mixed.train_offsets)
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
    clean_labels = torch.tensor([rows[tuple(r.flatten().tolist())] for r in x0])  # clean: rows found
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
    dm = FederatedDataModule.from_tensors(x.reshape(-1, 1, 8, 8), y, num_clients=10, concepts=3, seed=1)
    assert dm.train_x.shape[1:] == (1, 8, 8)
    assert (
        sum(s != "clean" for s in dm.metadata.feature_style) == 3
    )  # 5/3/2 clients; 5*0.4, 3*0.2, 2*0.2 -> 2+1+0


def test_tabular_inputs_without_corruption(digits) -> None:
    x, y = digits
    dm = FederatedDataModule.from_tensors(x * 3 - 1, y, num_clients=5, concepts=2, corrupt_fraction=0.0)
    assert dm.metadata.feature_style == ["clean"] * 5
    assert dm.num_global_clients == 2


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


def test_global_test_from_a_separate_set(digits) -> None:
    x, y = digits
    train_x, train_y, test_x, test_y = x[:1400], y[:1400], x[1400:], y[1400:]
    args = build_scenario(
        train_x,
        train_y,
        num_clients=10,
        concepts=3,
        image_shape=(1, 8, 8),
        global_test=(test_x, test_y),
        seed=0,
    )
    assert (
        sum(
            tx.shape[0] + sx.shape[0]
            for (tx, _), (sx, _) in zip(args["client_train"], args["client_test"], strict=True)
        )
        == 1400
    )
    assert len(args["global_test"]) == 3
    for c, (gx, gy) in enumerate(args["global_test"]):
        assert torch.equal(gx, test_x)  # clean inputs, the concept's label map
        assert torch.equal(gy, {0: test_y, 1: 9 - test_y, 2: (test_y + 1) % 10}[c])
    with pytest.raises(ValueError, match="global_test_fraction=0.2 was given together with global_test"):
        build_scenario(
            train_x,
            train_y,
            num_clients=10,
            global_test=(test_x, test_y),
            global_test_fraction=0.2,
            corrupt_fraction=0,
        )
    with pytest.raises(ValueError, match="global_test inputs have per-sample shape"):
        build_scenario(
            train_x, train_y, num_clients=10, global_test=(test_x[:, :10], test_y), corrupt_fraction=0
        )


def test_scenario_draws_from_the_given_family() -> None:
    x, y = load_digits_tensors()
    plain = FederatedDataModule.from_tensors(
        x, y, num_clients=12, image_shape=(1, 8, 8), seed=1, corrupt_fraction=0
    )
    dm = FederatedDataModule.from_tensors(
        x, y, num_clients=12, image_shape=(1, 8, 8), seed=1, corrupt_fraction=0.5, corruptions=FASHION_MNIST_C
    )
    styles = dm.metadata.feature_style
    corrupted = [i for i, s in enumerate(styles) if s != "clean"]
    assert len(corrupted) == 6
    assert all(styles[i].split(":")[0] in FASHION_MNIST_C for i in corrupted)
    for i in range(12):
        same = torch.equal(dm.train_split(i)[0], plain.train_split(i)[0])
        assert same == (i not in corrupted)
        assert torch.equal(dm.train_split(i)[1], plain.train_split(i)[1])
    with pytest.raises(ValueError, match="corruptions has unknown kinds"):
        FederatedDataModule.from_tensors(x, y, num_clients=4, image_shape=(1, 8, 8), corruptions=["fogg"])
    with pytest.raises(ValueError, match="corruptions must be a non-empty list"):
        FederatedDataModule.from_tensors(x, y, num_clients=4, image_shape=(1, 8, 8), corruptions=[])


def test_authors_scenario_on_digits(digits: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = digits
    dm = FederatedDataModule.from_tensors(
        x, y, num_clients=25, concepts=3, image_shape=(1, 8, 8), preset="authors", test_fraction=0.1, seed=0
    )
    meta = dm.metadata
    styles = meta.feature_style
    corrupted = np.array([s != "clean" for s in styles])
    assert type_counts(meta.concept.numpy(), corrupted) == [6, 5, 5, 5, 2, 2]
    assert all(s.split(":")[0] in shifts.AUTHORS_FASHION_MNIST_C for s in styles if s != "clean")
    pool = 1797 - dm.global_offsets[-1].item() // 3  # the 20 % hold-out feeds three global clients
    sizes = dm.train_sizes + dm.val_sizes + dm.test_sizes
    assert sizes.tolist() == [pool // 25] * 25  # every client the same size, as the authors'
    assert (dm.val_sizes + dm.test_sizes).tolist() == [round(0.1 * (pool // 25))] * 25
    # Concept c relabels y with label_map(c): concept 1 is 9 - y, concept 2 is (y + 1) mod 10.
    plain = FederatedDataModule.from_tensors(
        x,
        y,
        num_clients=25,
        concepts=3,
        image_shape=(1, 8, 8),
        preset="authors",
        test_fraction=0.1,
        seed=0,
        corruptions=["identity"],
    )
    for i in range(25):
        table = shifts.label_map(int(meta.concept[i]), 10)
        xi, yi = plain.train_split(i)
        rows = [int(torch.nonzero((x == row).all(dim=1))[0]) for row in xi[:5].flatten(1)]
        assert torch.equal(yi[:5], table[y[rows]])
        same = torch.equal(dm.train_split(i)[0], xi)
        assert same or corrupted[i]


def test_authors_preset_rejects_what_it_fixes(digits: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = digits
    common = dict(num_clients=20, image_shape=(1, 8, 8), preset="authors")
    with pytest.raises(ValueError, match="pass concepts=3"):
        build_scenario(x, y, concepts=2, **common)
    with pytest.raises(ValueError, match="concept_proportions must be left unset"):
        build_scenario(x, y, concepts=3, concept_proportions=[0.5, 0.25, 0.25], **common)
    with pytest.raises(ValueError, match="corrupt_fraction must be left unset"):
        build_scenario(x, y, concepts=3, corrupt_fraction=0.2, **common)
    with pytest.raises(ValueError, match="not None"):
        build_scenario(x, y, concepts=3, dirichlet_alpha=None, **common)
    with pytest.raises(ValueError, match="preset must be None or 'authors'"):
        build_scenario(x, y, concepts=3, num_clients=20, preset="paper")


def test_labels_that_are_not_class_indices_get_the_fix(digits) -> None:
    x, y = digits
    names = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])
    with pytest.raises(TypeError, match=r"y holds <U5 labels \(strings or objects\), but labels must be "
                       r"integer-encoded class indices 0..C-1: classes, codes = numpy.unique"):  # fmt: skip
        FederatedDataModule.from_tensors(x, names[y.numpy()], num_clients=4)
    with pytest.raises(TypeError, match=r"got \(Tensor, ndarray\) \(numpy arrays: torch.from_numpy"):
        FederatedDataModule.from_tensors(x, y.numpy(), num_clients=4)
    # Regression targets: y.long() would truncate them; regression is another path.
    with pytest.raises(TypeError, match=r"non-integer torch.float32 values: regression targets\? .*would "
                       r"truncate them.*from_partition.*FedEMStrategy"):  # fmt: skip
        FederatedDataModule.from_tensors(x, y.float() + 0.5, num_clients=4, corrupt_fraction=0)
    with pytest.raises(
        TypeError, match=r"y must hold integer class indices, got torch.float32; use y.long\(\)"
    ):
        FederatedDataModule.from_tensors(x, y.float(), num_clients=4, corrupt_fraction=0)


def test_a_given_partition_replaces_the_label_skew_with_the_shifts_on_top(digits) -> None:
    x, y = digits
    parts = [np.arange(k, 1797, 5) for k in range(5)]
    dm = FederatedDataModule.from_tensors(
        x, y, partition=parts, concepts=2, test_fraction=0.0, corrupt_fraction=0.0, seed=2
    )
    assert dm.num_clients == 5 and dm.num_global_clients == 0  # a list: no row held out
    for i, rows in enumerate(parts):
        table = label_map(int(dm.metadata.concept[i]), 10)
        xi, yi = dm.train_split(i)
        assert torch.equal(xi, x[rows]) and torch.equal(yi, table[y[rows]])
    with pytest.raises(ValueError, match=r"partition is a list of row ids, but global_test_fraction=0.2"):
        FederatedDataModule.from_tensors(x, y, partition=parts, global_test_fraction=0.2, corrupt_fraction=0)
    with pytest.raises(ValueError, match=r"num_clients=4 but the partition has 5 clients"):
        FederatedDataModule.from_tensors(x, y, partition=parts, num_clients=4, corrupt_fraction=0)
    with pytest.raises(ValueError, match=r"the partition leaves client 1 empty"):
        FederatedDataModule.from_tensors(x, y, partition=[parts[0], np.arange(0)], corrupt_fraction=0)
    halves = lambda pool: [pool[::2], pool[1::2]]  # noqa: E731
    pooled = FederatedDataModule.from_tensors(x, y, partition=halves, corrupt_fraction=0, seed=2)
    assert pooled.num_clients == 2 and pooled.num_global_clients == 1  # the pool after a 0.2 hold-out
