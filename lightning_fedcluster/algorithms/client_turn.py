"""What a client's turn in a round is made of, as the client rule sees it: the ``ClientContext``
it is given, the ``ClientReport`` of its E-step, the ``LocalPlan`` it trains and the
``Contribution`` of each trained copy to the server's sums. Plain tensors; the hooks that
produce them are in ``base.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.seeds import derive_seed


@dataclass(frozen=True)
class ClientReport:
    """One client's E-step: γ [N, K] (stays on the client) and what it reports to the server:
    ω [K] (mixture or one-hot assignment) and label sums S [C, K] (empty for regression)."""

    gamma: Tensor
    omega: Tensor
    label_sums: Tensor


@dataclass(frozen=True)
class LocalPlan:
    """What a client trains this round.

    ``clusters``: the cluster copies it trains, each starting from its global model.
    ``sample_weights``: [N, len(clusters)] weight of each sample in each copy's loss, or None for 1.
    ``proximal``: per trained copy, (anchor cluster, coefficient c) pairs adding (c/2)‖w − θ_anchor‖².
    ``from_personal``: the (single) trained copy starts from the client's personal model (FedSoft).
    """

    clusters: tuple[int, ...]
    sample_weights: Tensor | None = None
    proximal: tuple[tuple[tuple[int, float], ...], ...] = ()
    from_personal: bool = False


@dataclass(frozen=True)
class Contribution:
    """The update of trained copy ``source`` enters cluster ``target`` with server weight ``weight``:
    Δ = θ_local(source) − θ_target."""

    source: int
    target: int
    weight: float


@dataclass(frozen=True)
class ClientContext:
    """What a rule may know about the client besides its losses: ids, size, prior state, RNG."""

    client: int
    round_index: int
    num_samples: int
    num_classes: int
    omega: Tensor  # the client's ω from its last participation (1/K initially)
    active: Tensor  # [K] bool: clusters still alive
    seen: bool = False  # whether the client took part before
    generator: torch.Generator | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)  # algorithm-specific per-client state
    seed_parts: tuple[int, ...] = ()  # seeds ``generator`` on first use when it is not given
    membership: Tensor | None = None  # [K] bool: clusters that chose this client (server selection)
    # [K, N, C] the K global models' outputs (class probabilities) on the client's training rows,
    # given to the E-step only for a rule with the ``ClientOutputs`` protocol.
    outputs: Tensor | None = None

    def rng(self) -> torch.Generator | None:
        """The client's seeded generator, created on first use (seeding costs more than most rules)."""
        if self.generator is None and self.seed_parts:
            seeded = torch.Generator().manual_seed(derive_seed(*self.seed_parts))
            object.__setattr__(self, "generator", seeded)  # frozen dataclass: cache it once
        return self.generator
