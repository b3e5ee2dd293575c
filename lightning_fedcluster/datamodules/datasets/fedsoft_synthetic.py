"""The FedSoft paper's synthetic soft-clustering benchmark (Ruan & Joe-Wong, AAAI 2022, Sec. 5).

S linear-regression sources y = <x, θ_s> + ε with θ_s ~ N(0, σ0² I_d), x ~ N(0, I_d), ε ~ N(0, 1)
(d = 10, σ0 = 10 in the paper). Each client holds n_k ~ Uniform{100, ..., 200} samples, a
mixture of the sources given by one of the paper's partition patterns (`partition.mixture_weights`:
"10:90", "30:70", "linear", "random"). The global test clients are hold-out sets sampled from each
source alone (the paper evaluates every cluster model on them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_fedcluster.arguments import number_arg
from lightning_fedcluster.datamodules import partition
from lightning_fedcluster.datamodules.clients import build_clients
from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.validation import check_batch_size, int_arg

__all__ = ["FedSoftSynthetic", "generate_fedsoft_data"]


def generate_fedsoft_data(
    *,
    num_clients: int = 100,
    num_sources: int = 2,
    pattern: str = "10:90",
    dim: int = 10,
    sigma0: float = 10.0,
    noise_std: float = 1.0,
    min_samples: int = 100,
    max_samples: int = 200,
    global_test_size: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Draw the benchmark. Returns a dict with x float32 [N, d], y float32 [N], source int64 [N]
    (which θ generated each row), parts (client i's rows, contiguous), mixture [M, S] (the
    pattern's weights), counts [M, S] (rows per source and client), theta [S, d], and global_test:
    one (x, y) pair per source with `global_test_size` rows."""
    num_clients = int_arg("num_clients", num_clients, 1)
    num_sources = int_arg("num_sources", num_sources, 1)
    dim = int_arg("dim", dim, 1)
    min_samples = int_arg("min_samples", min_samples, 1)
    max_samples = int_arg("max_samples", max_samples, min_samples)
    global_test_size = int_arg("global_test_size", global_test_size, 0)
    seed = int_arg("seed", seed, 0)
    for name, value in (("sigma0", sigma0), ("noise_std", noise_std)):
        number_arg(name, value)
    theta_rng, mix_rng, size_rng, data_rng, test_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)
    )
    theta = theta_rng.normal(0.0, sigma0, size=(num_sources, dim))
    mixture = partition.mixture_weights(pattern, num_clients, num_sources, mix_rng)
    sizes = size_rng.integers(min_samples, max_samples + 1, size=num_clients)
    counts = partition.mixture_counts(mixture, sizes)
    source = np.concatenate([data_rng.permutation(np.repeat(np.arange(num_sources), row)) for row in counts])
    x = data_rng.normal(size=(source.size, dim))
    y = np.einsum("nd,nd->n", x, theta[source]) + data_rng.normal(0.0, noise_std, size=source.size)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(num_clients)]
    global_test = []
    for s in range(num_sources):
        gx = test_rng.normal(size=(global_test_size, dim))
        gy = gx @ theta[s] + test_rng.normal(0.0, noise_std, size=global_test_size)
        global_test.append((torch.from_numpy(gx).float(), torch.from_numpy(gy).float()))
    return {
        "x": torch.from_numpy(x).float(),
        "y": torch.from_numpy(y).float(),
        "source": torch.from_numpy(source),
        "parts": parts,
        "mixture": torch.from_numpy(mixture).float(),
        "counts": torch.from_numpy(counts),
        "theta": torch.from_numpy(theta).float(),
        "global_test": global_test,
    }


class FedSoftSynthetic(FederatedDataModule):
    """FedSoft's synthetic linear regression as a federated regression task.

    Defaults are the paper's (100 clients, two sources, d = 10, σ0 = 10, 100..200 samples per
    client, batch size 10). Metadata: `mixture` is every client's true source mixture, `concept`
    its dominant source, `global_concept[s] = s`. `theta` holds the true parameters [S, d].

    Args:
        pattern: "10:90", "30:70", "linear" (two sources) or "random" (any number).
        test_fraction: each client's held-out share (the paper scores personal models on the
            clients' own data); `val_share` of it is validation, the rest test.
        global_test_size: rows of each source's hold-out global test client.
        val_share, adapt_fraction: the evaluation splits, as in `FederatedDataModule`.
    """

    def __init__(
        self,
        num_clients: int = 100,
        num_sources: int = 2,
        pattern: str = "10:90",
        dim: int = 10,
        sigma0: float = 10.0,
        noise_std: float = 1.0,
        min_samples: int = 100,
        max_samples: int = 200,
        test_fraction: float = 0.2,
        global_test_size: int = 1000,
        batch_size: int = 10,
        seed: int = 0,
        val_share: float = 0.5,
        adapt_fraction: float = 0.4,
    ) -> None:
        check_batch_size(batch_size)
        data = generate_fedsoft_data(
            num_clients=num_clients,
            num_sources=num_sources,
            pattern=pattern,
            dim=dim,
            sigma0=sigma0,
            noise_std=noise_std,
            min_samples=min_samples,
            max_samples=max_samples,
            global_test_size=global_test_size,
            seed=seed,
        )
        mixture: Tensor = data["mixture"]
        arguments = build_clients(
            data["x"],
            data["y"],
            data["parts"],
            test_fraction=test_fraction,
            concept=mixture.argmax(dim=1),
            mixture=mixture,
            global_test=data["global_test"] if global_test_size else (),
            global_concept=list(range(num_sources)) if global_test_size else None,
            seed=seed,
        )
        super().__init__(
            **arguments,
            batch_size=batch_size,
            task="regression",
            val_share=val_share,
            adapt_fraction=adapt_fraction,
            seed=seed,
        )
        self.theta: Tensor = data["theta"]
        self.save_hyperparameters()
