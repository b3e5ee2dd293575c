"""scikit-learn's 8x8 digits as a federated scenario: the embedded default data set.

It ships with scikit-learn (no download), so examples, tests and the quick start run anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.scenario import build_scenario
from lightning_fedcluster.datamodules.validation import check_batch_size

__all__ = ["DigitsFederated", "load_digits_tensors"]


def load_digits_tensors() -> tuple[Tensor, Tensor]:
    """The 1797 digits as (x float32 [N, 64] in [0, 1], y int64 [N] in 0..9)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.from_numpy(data.data / 16.0).to(torch.float32)
    y = torch.from_numpy(data.target).to(torch.long)
    return x, y


class DigitsFederated(FederatedDataModule):
    """FedRC scenario on the digits: label skew, 8x8 corruptions and concept label maps.

    Keyword-only friendly so LightningCLI can build it from a config. With the defaults,
    30 clients share ~1437 samples (~48 each before their 80/20 train/held-out split; the
    held-out fifth is halved into validation and test by `val_share`) and there are 3 global
    test clients (one per concept) on the 360 held-out digits, each split into validation/test x
    adapt/score parts (`adapt_fraction`; see `FederatedDataModule`).

    Args:
        as_images: serve the inputs as 8×8 images [N, 1, 8, 8] for convolutional models
            (e.g. ``SmallCNN``) instead of flat [N, 64] rows; the scenario (partition, concepts,
            corruptions, splits) is the same.
    """

    def __init__(
        self,
        num_clients: int = 30,
        concepts: int = 3,
        dirichlet_alpha: float | None = 1.0,
        corrupt_fraction: float | Sequence[float] | None = None,
        test_fraction: float = 0.2,
        global_test_fraction: float = 0.2,
        batch_size: int = 32,
        seed: int = 0,
        val_share: float = 0.5,
        adapt_fraction: float = 0.4,
        as_images: bool = False,
    ) -> None:
        check_batch_size(batch_size)
        x, y = load_digits_tensors()
        if as_images:
            x = x.reshape(-1, 1, 8, 8)
        arguments = build_scenario(
            x,
            y,
            num_clients=num_clients,
            concepts=concepts,
            dirichlet_alpha=dirichlet_alpha,
            corrupt_fraction=corrupt_fraction,
            test_fraction=test_fraction,
            global_test_fraction=global_test_fraction,
            num_classes=10,
            image_shape=(1, 8, 8),
            seed=seed,
        )
        super().__init__(
            **arguments, batch_size=batch_size, val_share=val_share, adapt_fraction=adapt_fraction, seed=seed
        )
        self.save_hyperparameters()
