"""The FedEM paper's synthetic mixture task (Marfoq et al., NeurIPS 2021, App. I.1.5).

Generative model, per client t of T (paper's steps 1-6):
  π_t ~ Dirichlet(α·1_M);  θ_m ~ U([-1, 1]^d);  n_t = min(min_samples + ⌊m_t⌋, max_samples) with
  m_t ~ LogNormal(μ=4, σ=2);  for every sample: x ~ U([-1, 1]^d), z ~ Categorical(π_t),
  ε ~ N(0, noise_std²), y ~ Bernoulli(sigmoid(⟨x, θ_z⟩ + ε)).
Every sample's label comes from its own latent component z. (The authors' released generator
writes each component's labels into the same leading slice of the array, so later components
overwrite earlier ones and the remaining samples keep label 0; it also rounds the sigmoid
instead of sampling. Neither is done here; ``label_rule="threshold"`` gives the rounding as an
option.) The paper writes ε ~ N(0, I_d); since ⟨x, θ⟩ is a scalar, ε is a scalar here, with the
authors' default scale 0.1.

Each client's n_t samples are split into train and held-out rows (``test_fraction``, the
paper's local test share); the datamodule then splits the held-out rows into validation
(``val_share``) and test. The ground-truth concept of a client is its dominant component
argmax_m π_t,m.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lightning_fedcluster.arguments import check_positive_int, number_arg
from lightning_fedcluster.datamodules.federated import FederatedDataModule
from lightning_fedcluster.datamodules.metadata import ClientMetadata
from lightning_fedcluster.datamodules.validation import check_batch_size

__all__ = ["FedEMSynthetic", "SyntheticMixture", "generate_mixture", "sample_client_sizes"]

LABEL_RULES = ("bernoulli", "threshold")


def sample_client_sizes(
    rng: np.random.Generator,
    num_clients: int,
    *,
    mean: float = 4.0,
    sigma: float = 2.0,
    min_samples: int = 50,
    max_samples: int = 1000,
) -> np.ndarray:
    """n_t = min(min_samples + ⌊LogNormal(mean, sigma)⌋, max_samples) for every client (int64 [T])."""
    draws = np.floor(rng.lognormal(mean, sigma, size=num_clients))
    return np.minimum(min_samples + draws, max_samples).astype(np.int64)


@dataclass(frozen=True)
class SyntheticMixture:
    """One draw of the generative model: ground truth plus every client's samples.

    ``x`` [N, d] float32, ``y`` [N] int64, ``z`` [N] int64 (latent component of each sample),
    ``offsets`` [T + 1] (client t owns rows offsets[t]:offsets[t+1]), ``theta`` [M, d],
    ``mixture_weights`` π [T, M] (float64).
    """

    x: Tensor
    y: Tensor
    z: Tensor
    offsets: Tensor
    theta: Tensor
    mixture_weights: Tensor


def _labels(
    x: np.ndarray,
    z: np.ndarray,
    theta: np.ndarray,
    noise_std: float,
    label_rule: str,
    rng: np.random.Generator,
) -> np.ndarray:
    """y from each sample's own component: Bernoulli(sigmoid(⟨x, θ_z⟩ + ε)) (or its rounding)."""
    logits = np.einsum("nd,nd->n", x, theta[z]) + rng.normal(0.0, noise_std, size=z.shape[0])
    if label_rule == "threshold":
        return (logits > 0).astype(np.int64)
    probability = 1.0 / (1.0 + np.exp(-logits))
    return (rng.random(z.shape[0]) < probability).astype(np.int64)


def _draw_clients(
    sizes: np.ndarray,
    weights: np.ndarray,
    theta: np.ndarray,
    noise_std: float,
    label_rule: str,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples (x, y, z) of clients with ``sizes`` and mixture ``weights``, concatenated in order."""
    owner = np.repeat(np.arange(sizes.size), sizes)
    x = rng.uniform(-1.0, 1.0, size=(owner.size, theta.shape[1]))
    # Categorical(π_t) by inverse CDF: vectorised over all samples of all clients.
    cdf = np.cumsum(weights, axis=1)
    cdf[:, -1] = 1.0
    z = (rng.random(owner.size)[:, None] >= cdf[owner]).sum(axis=1).astype(np.int64)
    y = _labels(x, z, theta, noise_std, label_rule, rng)
    return x, y, z


def generate_mixture(
    num_clients: int = 300,
    *,
    dim: int = 150,
    num_components: int = 3,
    alpha: float = 0.4,
    noise_std: float = 0.1,
    min_samples: int = 50,
    max_samples: int = 1000,
    label_rule: str = "bernoulli",
    seed: int = 0,
) -> SyntheticMixture:
    """Draw the FedEM synthetic task (see the module docstring). Each step has its own random
    stream of ``numpy.random.SeedSequence(seed)``, so e.g. changing ``noise_std`` keeps π, θ,
    the sizes and the inputs."""
    for name, value in (("num_clients", num_clients), ("dim", dim), ("num_components", num_components)):
        check_positive_int(name, value)
    number_arg("alpha", alpha, 0.0, strict=True)
    number_arg("noise_std", noise_std)
    if not 1 <= min_samples <= max_samples:
        raise ValueError(f"need 1 <= min_samples <= max_samples, got {min_samples}, {max_samples}")
    if label_rule not in LABEL_RULES:
        raise ValueError(f"label_rule must be one of {LABEL_RULES}, got {label_rule!r}")
    mix_rng, theta_rng, size_rng, data_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    weights = mix_rng.dirichlet(np.full(num_components, float(alpha)), size=num_clients)
    theta = theta_rng.uniform(-1.0, 1.0, size=(num_components, dim))
    sizes = sample_client_sizes(size_rng, num_clients, min_samples=min_samples, max_samples=max_samples)
    x, y, z = _draw_clients(sizes, weights, theta, noise_std, label_rule, data_rng)
    return SyntheticMixture(
        x=torch.from_numpy(x).to(torch.float32),
        y=torch.from_numpy(y),
        z=torch.from_numpy(z),
        offsets=torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)])),
        theta=torch.from_numpy(theta),
        mixture_weights=torch.from_numpy(weights),
    )


class FedEMSynthetic(FederatedDataModule):
    """FederatedDataModule of the FedEM synthetic task: binary labels, ``dim`` features,
    ``num_components`` linear components, Dirichlet(``alpha``) mixtures, log-normal sizes.

    Client t's first n_t − round(test_fraction·n_t) samples are its training split, the rest
    its held-out rows (samples are i.i.d. within a client), split at random into validation
    (``val_share``) and test. With ``global_test_size`` > 0 there is one non-participating
    global test client per component, whose data all come from that component (π = e_m), split
    into validation/test x adapt/score parts (``adapt_fraction``; see `FederatedDataModule`).
    Ground truth is kept for diagnostics only: ``theta`` [M, d], ``mixture_weights`` π [T, M],
    ``train_z`` / ``val_z`` / ``test_z`` (latent component of every train/validation/test row);
    ``metadata.concept`` is argmax_m π_t,m.
    """

    def __init__(
        self,
        num_clients: int = 300,
        dim: int = 150,
        num_components: int = 3,
        alpha: float = 0.4,
        noise_std: float = 0.1,
        min_samples: int = 50,
        max_samples: int = 1000,
        test_fraction: float = 0.2,
        global_test_size: int = 0,
        label_rule: str = "bernoulli",
        batch_size: int = 128,
        seed: int = 0,
        val_share: float = 0.5,
        adapt_fraction: float = 0.4,
    ) -> None:
        check_batch_size(batch_size)
        if not (isinstance(test_fraction, (int, float)) and 0 <= test_fraction < 1):
            raise ValueError(f"test_fraction must be a number in [0, 1), got {test_fraction!r}")
        bad_size = isinstance(global_test_size, bool) or not isinstance(global_test_size, int)
        if bad_size or global_test_size < 0:
            raise ValueError(f"global_test_size must be an integer >= 0, got {global_test_size!r}")
        mixture = generate_mixture(
            num_clients,
            dim=dim,
            num_components=num_components,
            alpha=alpha,
            noise_std=noise_std,
            min_samples=min_samples,
            max_samples=max_samples,
            label_rule=label_rule,
            seed=seed,
        )
        train, test, train_z, test_z = [], [], [], []
        for t in range(num_clients):
            start, stop = int(mixture.offsets[t]), int(mixture.offsets[t + 1])
            n_test = min(int(round(test_fraction * (stop - start))), stop - start - 1)
            cut = stop - n_test
            train.append((mixture.x[start:cut], mixture.y[start:cut]))
            test.append((mixture.x[cut:stop], mixture.y[cut:stop]))
            train_z.append(mixture.z[start:cut])
            test_z.append(mixture.z[cut:stop])
        global_test = []
        if global_test_size:
            # A separate stream: adding global clients never changes the participating clients.
            rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(5)[4])
            pure = np.eye(num_components)
            sizes = np.full(num_components, global_test_size, dtype=np.int64)
            gx, gy, _ = _draw_clients(sizes, pure, mixture.theta.numpy(), noise_std, label_rule, rng)
            gx_t, gy_t = torch.from_numpy(gx).to(torch.float32), torch.from_numpy(gy)
            global_test = [
                (
                    gx_t[m * global_test_size : (m + 1) * global_test_size],
                    gy_t[m * global_test_size : (m + 1) * global_test_size],
                )
                for m in range(num_components)
            ]
        metadata = ClientMetadata(
            concept=mixture.mixture_weights.argmax(dim=1),
            feature_style=["clean"] * num_clients,
            global_concept=torch.arange(len(global_test), dtype=torch.long),
        )
        super().__init__(
            train,
            test,
            global_test,
            num_classes=2,
            batch_size=batch_size,
            metadata=metadata,
            val_share=val_share,
            adapt_fraction=adapt_fraction,
            seed=seed,
        )
        # Ground truth only (the inputs are not kept twice): θ [M, d], π [T, M], z per row.
        self.theta = mixture.theta
        self.mixture_weights = mixture.mixture_weights
        self.train_z = torch.cat(train_z)
        held_z = torch.cat(test_z)
        held_start = torch.tensor([0] + [z.numel() for z in test_z]).cumsum(0)
        self.val_z = self._held_out_z(held_z, held_start, "val")
        self.test_z = self._held_out_z(held_z, held_start, "test")
        self.save_hyperparameters()

    def _held_out_z(self, held_z: Tensor, held_start: Tensor, stage: str) -> Tensor:
        """The latent components of one stage's local rows, from those of all held-out rows."""
        _, _, offsets = self.evaluation_split(stage, "local")
        owner = torch.repeat_interleave(torch.arange(self.num_clients), offsets.diff())
        return held_z[held_start[owner] + self.evaluation_rows(stage, "local")]
