"""FedRC (Guo, Tang, Lin, ICML 2024) as a rule object the engine calls: plain tensors only.

The engine runs the client loop; this object says, for one client, how much each cluster
explains its data (E-step), how samples are weighted in the local loss, how the client's
update is weighted on the server, and how the server refreshes C_{y,k}. With
``use_label_stats=False`` it is FedEM (C ≡ 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.mixture import (
    LABEL_STATS_FLOOR,
    hard_weights,
    iterate_mixture,
    label_statistics,
    label_sums,
    mixture_from_responsibilities,
    responsibilities,
)


@dataclass(frozen=True)
class ClientReport:
    """One client's E-step: γ [N, K] (stays on the client), and what it reports: ω [K], S [C, K]."""

    gamma: Tensor
    omega: Tensor
    label_sums: Tensor


@dataclass(frozen=True)
class FedRC:
    """FedRC's rules. ``hard_prediction`` predicts with argmax ω only (the paper's TeHC)."""

    num_clusters: int
    use_label_stats: bool = True
    hard_prediction: bool = False
    label_stats_floor: float = LABEL_STATS_FLOOR

    def e_step(
        self, losses: Tensor, labels: Tensor, omega: Tensor, log_label_stats: Tensor | None, num_classes: int
    ) -> ClientReport:
        """γ and ω from the previous ω (the client's prior) and the current C. ``losses`` [N, K]."""
        losses = losses.to(torch.float64)
        log_gamma = responsibilities(losses, labels, omega.to(losses).log(), log_label_stats)
        gamma = log_gamma.exp()
        return ClientReport(
            gamma=gamma,
            omega=mixture_from_responsibilities(log_gamma).exp(),
            label_sums=label_sums(gamma, labels, num_classes),
        )

    def sample_weights(self, report: ClientReport) -> Tensor:
        """Weight of each sample in each cluster's local loss (eq. 5): γ. [N, K]."""
        return report.gamma

    def aggregation_weights(self, num_samples: int, report: ClientReport) -> Tensor:
        """Server weight of the client's update to each cluster: N_i (γ already scaled gradients)."""
        return torch.full((self.num_clusters,), float(num_samples), dtype=torch.float64)

    def log_label_stats(self, state: ClientState) -> Tensor | None:
        """log C_{y,k} from the latest label sums of every client seen so far (None for FedEM)."""
        if not self.use_label_stats:
            return None
        # No client seen yet: all-zero sums give the uniform C, as the paper initialises it.
        return label_statistics(state.label_sums[state.seen], self.label_stats_floor).log()

    def prediction_weights(self, omega: Tensor) -> Tensor:
        """Mixture weights used to predict for a client with mixture ω."""
        return hard_weights(omega) if self.hard_prediction else omega

    def unseen_client_mixture(self, losses: Tensor, labels: Tensor, log_label_stats: Tensor | None) -> Tensor:
        """ω of a client that never trained, from its labelled data: the E-step iterated to a fixed point."""
        return iterate_mixture(losses.to(torch.float64), labels, log_label_stats)
