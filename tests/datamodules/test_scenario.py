"""preset="authors": the FedRC authors' client mix (create_c/make_fmnist_c.py, make_cifar_c.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import FederatedDataModule, build_scenario, partition, shifts
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors

# The authors' type codes: 0 concept 0 clean, 1 concept 0 corrupted, 2 / 3 concept 1 / 2 clean,
# 4 / 5 concept 1 / 2 corrupted.
CODE = {(0, False): 0, (0, True): 1, (1, False): 2, (2, False): 3, (1, True): 4, (2, True): 5}


def type_counts(concept: np.ndarray, corrupted: np.ndarray) -> list[int]:
    codes = [CODE[(int(c), bool(k))] for c, k in zip(concept, corrupted, strict=True)]
    return np.bincount(codes, minlength=6).tolist()


@pytest.mark.parametrize(
    ("clients", "expected"),
    [
        (300, [60, 60, 60, 60, 30, 30]),  # concepts 120 / 90 / 90, corrupted 60 / 30 / 30
        (25, [6, 5, 5, 5, 2, 2]),  # int(0.2 * 25) = 5, int(0.1 * 25) = 2, the rest clean
        (4, [4, 0, 0, 0, 0, 0]),
    ],
)
def test_authors_client_types_have_exact_counts(clients: int, expected: list[int]) -> None:
    concept, corrupted = partition.authors_client_types(clients, np.random.default_rng(0))
    assert type_counts(concept, corrupted) == expected
    again = partition.authors_client_types(clients, np.random.default_rng(0))
    assert np.array_equal(concept, again[0]) and np.array_equal(corrupted, again[1])


def test_authors_client_types_shuffle_clients() -> None:
    a = partition.authors_client_types(300, np.random.default_rng(0))[0]
    b = partition.authors_client_types(300, np.random.default_rng(1))[0]
    assert not np.array_equal(a, b) and np.array_equal(np.sort(a), np.sort(b))
    with pytest.raises(ValueError, match="num_clients must be a positive integer"):
        partition.authors_client_types(0, np.random.default_rng(0))


class RecordingGenerator:
    """A numpy Generator that records the concentration of every Dirichlet draw."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.alphas: list[np.ndarray] = []

    def dirichlet(self, alpha: np.ndarray) -> np.ndarray:
        self.alphas.append(np.array(alpha, dtype=float))
        return self.rng.dirichlet(alpha)

    def __getattr__(self, name: str):  # everything else goes to the real generator
        return getattr(self.rng, name)


def test_prior_dirichlet_draws_dir_alpha_times_the_remaining_class_prior() -> None:
    labels = np.repeat(np.arange(4), [500, 300, 150, 50])  # p = 0.5 / 0.3 / 0.15 / 0.05
    rng = RecordingGenerator(0)
    parts = partition.prior_dirichlet_split(labels, 10, 2.5, rng)  # type: ignore[arg-type]
    assert len(rng.alphas) == 10
    np.testing.assert_allclose(rng.alphas[0], 2.5 * np.array([0.5, 0.3, 0.15, 0.05]))
    left = np.bincount(labels, minlength=4)
    for alpha, part in zip(rng.alphas, parts, strict=True):
        alive = left > 0
        np.testing.assert_allclose(alpha, 2.5 * left[alive] / left.sum())  # the rows still unassigned
        left = left - np.bincount(labels[part], minlength=4)
    assert {len(p) for p in parts} == {100}  # 1000 // 10 each
    everything = np.concatenate(parts)
    assert np.unique(everything).size == everything.size == 1000  # without replacement


def test_prior_dirichlet_shares_follow_the_prior_with_total_mass_alpha() -> None:
    # A large pool so the prior barely moves: mean share ~ p, share variance ~ p (1 - p) / (alpha + 1).
    p = np.array([0.6, 0.3, 0.1])
    labels = np.repeat(np.arange(3), (p * 400_000).astype(int))
    for alpha in (1.0, 8.0):
        parts = partition.prior_dirichlet_split(labels, 400, alpha, np.random.default_rng(3), size=200)
        shares = np.stack([np.bincount(labels[part], minlength=3) / 200 for part in parts])
        np.testing.assert_allclose(shares.mean(0), p, atol=0.04)
        estimate = np.mean(p * (1 - p) / shares.var(0)) - 1  # ignores the small sampling noise
        assert 0.7 * alpha < estimate < 1.3 * alpha, (alpha, estimate)


def test_prior_dirichlet_fills_clients_when_classes_run_out() -> None:
    labels = np.repeat(np.arange(3), [90, 6, 4])
    parts = partition.prior_dirichlet_split(labels, 10, 0.05, np.random.default_rng(0))
    assert [len(p) for p in parts] == [10] * 10 and np.unique(np.concatenate(parts)).size == 100
    again = partition.prior_dirichlet_split(labels, 10, 0.05, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))  # same seed, same split
    with pytest.raises(ValueError, match="concentration must be a positive number"):
        partition.prior_dirichlet_split(labels, 10, 0.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rows are needed"):
        partition.prior_dirichlet_split(labels, 10, 1.0, np.random.default_rng(0), size=11)


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    return load_digits_tensors()


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
        rows = [int(torch.nonzero((x == row).all(dim=1))[0]) for row in xi[:5]]
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


def test_severity_free_kinds() -> None:
    images = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(shifts.corrupt(images, "identity", 4, generator), images)
    striped = shifts.corrupt(images, "stripe", 1, generator)
    assert torch.allclose(striped[..., :7], 1 - images[..., :7])  # the authors' columns 0..6
    assert torch.allclose(striped[..., 21:], 1 - images[..., 21:])  # and 21..27
    assert torch.equal(striped[..., 7:21], images[..., 7:21])
    assert torch.equal(shifts.corrupt(images, "stripe", 5, generator), striped)


def fake_vision(channels: int, side: int, n_train: int = 600, n_test: int = 100):
    """Stands in for `load_vision_tensors` (torchvision is optional): class-balanced images."""

    def load(name: str, root: object = "data", *, train: bool = True, download: bool = False):
        n = n_train if train else n_test
        y = torch.arange(n) % 10
        x = (
            torch.rand(n, channels, side, side, generator=torch.Generator().manual_seed(n)) * 0.5
            + y.view(-1, 1, 1, 1) / 20
        )
        return x, y

    return load


def test_fashion_mnist_preset_uses_the_whole_training_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_fedcluster.datamodules import FashionMNISTFederated
    from lightning_fedcluster.datamodules.datasets import vision

    monkeypatch.setattr(vision, "load_vision_tensors", fake_vision(1, 28))
    dm = FashionMNISTFederated(num_clients=30, preset="authors", seed=0)
    sizes = dm.train_sizes + dm.val_sizes + dm.test_sizes
    assert sizes.tolist() == [20] * 30  # 600 // 30, as their 60000 // 300
    assert (dm.val_sizes + dm.test_sizes).tolist() == [2] * 30  # test_fraction 0.1 under the preset
    styles = dm.metadata.feature_style
    corrupted = np.array([s != "clean" for s in styles])
    assert type_counts(dm.metadata.concept.numpy(), corrupted) == [6, 6, 6, 6, 3, 3]
    assert all(s.split(":")[0] in shifts.AUTHORS_FASHION_MNIST_C for s in styles if s != "clean")
    assert dm.num_global_clients == 3 and dm.hparams["preset"] == "authors"
    assert dm.adapt_fraction == 0.9  # their loader fits global clients on 90 %, scores 10 %
    adapt = dm.evaluation_split("test", "global_adapt")[1].numel()
    score = dm.evaluation_split("test", "global_score")[1].numel()
    assert adapt == 9 * score
    paper = FashionMNISTFederated(num_clients=30, seed=0)  # the paper's mix and splits
    assert (paper.val_sizes + paper.test_sizes).sum() > (dm.val_sizes + dm.test_sizes).sum()
    with pytest.raises(ValueError, match="corrupt_fraction must be left unset"):
        FashionMNISTFederated(num_clients=30, preset="authors", corrupt_fraction=0.3)


def test_cifar10_preset_triples_the_training_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_fedcluster.datamodules import CIFAR10Federated, scenario
    from lightning_fedcluster.datamodules.datasets import vision

    monkeypatch.setattr(vision, "load_vision_tensors", fake_vision(3, 32, n_train=200))
    kinds: list[str] = []
    monkeypatch.setattr(scenario, "corrupt", lambda images, kind, severity, g: kinds.append(kind) or images)
    dm = CIFAR10Federated(num_clients=20, preset="authors", seed=0)
    assert (dm.train_sizes + dm.val_sizes + dm.test_sizes).tolist() == [30] * 20  # 3 * 200 // 20
    assert len(kinds) == 4 + 2 * 2 and set(kinds) <= set(shifts.AUTHORS_CIFAR10_C)  # int(.2M) + 2 int(.1M)
    one_copy = CIFAR10Federated(num_clients=20, preset="authors", copies=1, seed=0)
    assert (one_copy.train_sizes + one_copy.val_sizes + one_copy.test_sizes).tolist() == [10] * 20


def test_authors_pools_are_their_lists_less_the_kinds_not_implemented() -> None:
    fmnist = [
        "identity",
        "shot_noise",
        "impulse_noise",
        "glass_blur",
        "motion_blur",
        "shear",
        "scale",
        "rotate",
        "brightness",
        "translate",
        "stripe",
        "spatter",
        "dotted_line",
        "zigzag",
        "canny_edges",
    ]
    cifar = ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
             "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
             "jpeg_compression", "speckle_noise", "gaussian_blur", "spatter", "saturate"]  # fmt: skip
    assert shifts.AUTHORS_FASHION_MNIST_C == tuple(k for k in fmnist if k in shifts.ALL_CORRUPTIONS)
    assert len(shifts.AUTHORS_FASHION_MNIST_C) == 11
    assert set(shifts.AUTHORS_CIFAR10_C) == {k for k in cifar if k in shifts.ALL_CORRUPTIONS}
    assert len(shifts.AUTHORS_CIFAR10_C) == 16
