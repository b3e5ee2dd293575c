"""The ω weighting of the copies (an option of FedRC/FedEM, ``omega_weighting_from``; ours, not the
papers').

In the authors' FedRC each trained copy enters its cluster's server sum with weight N_i, and each
sample's γ already scales its gradient, so a cluster serving a third of the data moves at about a
third of FedAvg's rate. From round ``start`` on, client i's copy of cluster k weighs N_i · ω_ik
instead, so that a cluster moves at about the rate of FedAvg over its own clients (uniform ω gives
the authors' weights). Over ``ramp`` rounds the weight goes from the one to the other in equal
steps, N_i · ((1 − α) + α · ω_ik) with α = h / (ramp + 1) in the weighting's round h, and α stops at
``strength``. The weights are read from the client's final report (after a hold sets γ to ω), as
the server will sum them (How clusters form, "The configuration we recommend": with the
strategy's ``gradient_clip_val``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from lightning_fedcluster.algorithms.discovery.protocol import ClientTurn, Component


@dataclass(frozen=True)
class OmegaWeighting(Component):
    """``start``: rounds before the weighting (it acts from round index ``start`` on); ``ramp``:
    its first rounds, in which α rises in equal steps; ``strength``: the α it ends at, in (0, 1]."""

    start: int
    ramp: int = 0
    strength: float = 1.0

    def __post_init__(self) -> None:
        for name, rounds in (("omega_weighting_from", self.start), ("omega_weighting_ramp", self.ramp)):
            if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
                raise ValueError(f"{name} must be a number of rounds >= 0, got {rounds!r}")
        strength = self.strength
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not 0 < strength <= 1:
            raise ValueError(
                f"omega_weighting_strength must be a number in (0, 1] (1: N_i · ω_ik), got {strength!r}"
            )

    def alpha(self, round_index: int) -> float:
        """α in round ``round_index`` (0 before ``start``)."""
        if round_index < self.start:
            return 0.0
        return min(1.0, (round_index - self.start + 1) / (self.ramp + 1)) * self.strength

    def client(self, turn: ClientTurn) -> ClientTurn:
        """From ``start`` on: copy k's multiplier (1 − α) + α · ω_k of the turn's report."""
        if turn.context.round_index < self.start:
            return turn
        alpha = self.alpha(turn.context.round_index)
        weights = [1.0 - alpha + alpha * w for w in turn.report.omega.tolist()]
        return replace(turn, copy_weights=torch.tensor(weights, dtype=torch.float64))
