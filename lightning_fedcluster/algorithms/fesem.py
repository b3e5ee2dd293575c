"""FeSEM (Xie, Long et al., "Multi-center federated learning") and WeCFL (Ma, Long et al. 2022):
K-means over client models; baselines in FedRC's Section 5. Plain tensors.

A client trains the model of the cluster it was assigned to, then joins the centre nearest
(squared L2) to its locally trained model; the centres become the weighted means of their
members' models, weight 1 (FeSEM) or N_i (WeCFL). One rule,
[`FeSEM`][lightning_fedcluster.algorithms.fesem.FeSEM], with the option
``weighted``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.actions import (
    Note,
    Reassign,
    ServerAction,
    SetCentre,
    SetState,
)
from lightning_fedcluster.algorithms.assignment import assignment_report
from lightning_fedcluster.algorithms.base import (
    ClientContext,
    ClientReport,
    Contribution,
    HardAssignment,
    LocalPlan,
    RoundVectors,
    argmin_active,
    one_hot,
    with_omega,
)
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.protocols import ModelDistances
from lightning_fedcluster.algorithms.seeds import FESEM_CENTRES, FESEM_INITIAL_ASSIGNMENT, derive_seed
from lightning_fedcluster.algorithms.server_view import ClientStoreView, ServerView
from lightning_fedcluster.arguments import check_seed


def initial_assignment(seed: int, client: int, active: Tensor) -> int:
    """A seeded uniform draw among the active clusters: K-means' random initial assignment."""
    alive = active.nonzero().flatten()
    generator = torch.Generator().manual_seed(derive_seed(seed, client, FESEM_INITIAL_ASSIGNMENT))
    return int(alive[torch.randint(len(alive), (1,), generator=generator)])


@dataclass(frozen=True)
class FeSEMConfig:
    """FeSEM's and WeCFL's options, ``FeSEM.Config``.

    Args:
        weighted: weigh members by their data size N_i (WeCFL) instead of 1 (FeSEM).
        seed: seeds the K-means initialisation (a strategy passes its ``seed``).
        representation_layers: parameter-name prefixes forming the client representation
            (default None: all parameters of the locally trained model).
    """

    weighted: bool = False
    seed: int = 0
    representation_layers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.weighted, bool):
            raise ValueError(f"weighted must be True or False, got {self.weighted!r}")
        check_seed(self.seed)
        layers = self.representation_layers
        if layers is not None:
            if isinstance(layers, str) or not all(isinstance(name, str) for name in layers):
                raise ValueError(
                    f"representation_layers must be a list of parameter-name prefixes, got {layers!r}"
                )
            object.__setattr__(self, "representation_layers", tuple(layers))


class FeSEM(HardAssignment, ModelDistances):
    """FeSEM (``weighted=False``, every member counts 1) and WeCFL (``weighted=True``, members
    weighted by N_i).

    Initialisation is K-means': in the first round every client trains the same model (cluster
    0's), then the server takes K of those local models, drawn with ``seed``, as the centres and
    assigns every client to the nearest. (Independently initialised centres would be so far
    apart in parameter space that no client ever changes cluster.) A client that joins later
    starts in a seeded random cluster and moves to the nearest centre after its local training.
    Options in [`FeSEMConfig`][lightning_fedcluster.algorithms.fesem.FeSEMConfig] (``FeSEM.Config``).
    """

    Config = FeSEMConfig
    config: FeSEMConfig

    def representation_mask(self, parameter_names: list[str]) -> list[bool]:
        """All parameters, or those whose name starts with one of ``representation_layers``."""
        layers = self.config.representation_layers
        if not layers:
            return [True] * len(parameter_names)
        mask = [name.startswith(layers) for name in parameter_names]
        if not any(mask):
            raise ValueError(
                f"representation_layers={layers} matches no parameter: use prefixes of {parameter_names}"
            )
        return mask

    def state_entries(self) -> tuple[StateEntry, ...]:
        """Whether the K-means centres exist yet (the server sets it after the first round)."""
        return (StateEntry("centres_ready", Scope.SCALAR),)

    def round_vectors(self, state: ClientState | ClientStoreView | None) -> RoundVectors | None:
        """The round's locally trained models, until the centres are initialised from them."""
        ready = state is None or bool(state.extra.get("centres_ready", torch.tensor(1.0)))
        return None if ready else "model"

    def after_round(self, server: ServerView) -> list[ServerAction]:
        """K-means initialisation from the round's local models (the first round): the picked
        models become the centres and every client joins the nearest."""
        state, outcome = server.client_state, server.outcome
        if outcome.vectors is None or self.round_vectors(state) is None:
            return []
        centres, assignment = self.initial_centres(outcome.vectors, outcome.round_index, state.active)
        picked = [int(outcome.clients[row]) for row in centres.values()]
        return [
            *(SetCentre(k, outcome.vectors[row]) for k, row in centres.items()),
            Reassign(outcome.clients, torch.nn.functional.one_hot(assignment, self.num_clusters).double()),
            SetState("centres_ready", torch.tensor(1.0)),
            Note(f"round {outcome.round_index + 1}: centres initialised from the models of clients {picked}"),
        ]

    def initial_centres(
        self, vectors: Tensor, round_index: int, active: Tensor
    ) -> tuple[dict[int, int], Tensor]:
        """K distinct local models, drawn with the seed, become the centres; every model joins the
        nearest (squared L2). Returns ({cluster: row of vectors}, cluster of every row)."""
        clusters = active.nonzero().flatten().tolist()
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, round_index, FESEM_CENTRES))
        rows = torch.randperm(vectors.shape[0], generator=generator)[: len(clusters)].tolist()
        centres = dict(zip(clusters, rows, strict=False))
        chosen = vectors[list(centres.values())].to(torch.float64)
        distances = torch.cdist(vectors.to(torch.float64), chosen).square()
        assignment = torch.tensor(list(centres))[distances.argmin(1)]
        return centres, assignment

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        if not bool(context.extra.get("centres_ready", torch.tensor(1.0))):
            k = 0  # before the centres exist everybody trains the same model
        elif context.seen and bool(context.active[int(torch.argmax(context.omega))]):
            k = int(torch.argmax(context.omega))
        else:
            k = initial_assignment(self.config.seed, context.client, context.active)
        return assignment_report(k, losses, labels, context.num_classes)

    def local_plan(self, report: ClientReport, context: ClientContext) -> LocalPlan:
        return LocalPlan(clusters=(int(torch.argmax(report.omega)),))

    def reassign(self, report: ClientReport, distances: Tensor, context: ClientContext) -> ClientReport:
        """Join the nearest active centre (``distances`` [K]: ‖g_i − G_k‖²); before the centres are
        initialised, the server assigns instead."""
        if not bool(context.extra.get("centres_ready", torch.tensor(1.0))):
            return report
        k = argmin_active(distances.to(torch.float64), context.active)
        return with_omega(report, one_hot(k, report.omega.shape[0], report.omega))

    def contributions(
        self, report: ClientReport, plan: LocalPlan, context: ClientContext
    ) -> list[Contribution]:
        weight = float(context.num_samples) if self.config.weighted else 1.0
        return [Contribution(plan.clusters[0], int(torch.argmax(report.omega)), weight)]
