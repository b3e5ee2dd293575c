"""The optional parts of an algorithm's contract: small protocols whose hooks belong together.

A rule takes part in one by deriving from it, e.g. ``class FedSoft(Algorithm, Estimation,
ServerSelection, PersonalModels)``; Python then refuses to build a rule that lacks one of the
protocol's abstract hooks, so a group is never half written. The engine learns which protocols a
rule implements in one place, ``Capabilities.of`` (``rule.capabilities``), and calls a protocol's
hooks only on the rules that implement it.

- ``Estimation``: an estimation pass over every client before some rounds (FedSoft).
- ``ServerSelection``: the server picks each round's clients from the client store (FedSoft).
- ``PersonalModels``: every client keeps a personal model between rounds (FedSoft, D-FedEM);
  ``PersonalMixing``: the server mixes those models after a round (D-FedEM's gossip).
- ``ModelDistances``: after local training a client is reassigned by the distances of its model
  to the global ones (FeSEM, WeCFL).
- ``LabelStatistics``: clients use the server's label statistics C_{y,k} (FedRC).
- ``ClientOutputs``: the E-step reads the K models' outputs on the client's rows (FedRC's concept
  grouping computes a client signature from them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

if TYPE_CHECKING:
    from lightning_fedcluster.algorithms.actions import ServerAction
    from lightning_fedcluster.algorithms.client_state import ClientState
    from lightning_fedcluster.algorithms.client_turn import ClientContext, ClientReport
    from lightning_fedcluster.algorithms.server_view import ClientStoreView


class Estimation(ABC):
    """Before some rounds, every client scores its training data under the K global models
    (``estimate``) and the server turns the estimates into actions (``after_estimation``)."""

    @abstractmethod
    def needs_estimation(self, round_index: int, state: ClientState | None) -> bool:
        """Whether every client must estimate before this round (None: no store yet)."""

    @abstractmethod
    def estimate(self, losses: Tensor, active: Tensor) -> Tensor:
        """One client's estimate [K] from its per-sample losses [N, K]."""

    @abstractmethod
    def after_estimation(
        self, state: ClientStoreView, estimates: Tensor, round_index: int
    ) -> list[ServerAction]:
        """What the pass changes, from every client's estimate [M, K], as server actions."""


class ServerSelection(ABC):
    """The server chooses each round's clients per cluster from the client store."""

    @abstractmethod
    def round_membership(self, round_index: int, state: ClientState, sizes: Tensor, seed: int) -> Tensor:
        """[M, K] bool: which clients train for which cluster this round."""

    @abstractmethod
    def max_clients_per_round(self, num_clients: int) -> int:
        """Upper bound of the clients ``round_membership`` picks per round."""


class PersonalModels:
    """Every client keeps a personal model between rounds, in ``personal_copies`` working copies
    (0: all K) kept in the client store (on the nodes, on Flower); the server receives it after
    each round. A client without one starts from cluster ``initial_personal_cluster``'s model
    (with ``personal_copies == 0``: every copy from its own cluster)."""

    personal_copies: int = 1

    def initial_personal_cluster(self, context: ClientContext) -> int:
        return 0


class PersonalMixing(PersonalModels, ABC):
    """Personal models that the server mixes after every round, without a server model
    (D-FedEM's gossip)."""

    @abstractmethod
    def mix_personal(self, personal: dict[int, Tensor], round_index: int) -> None:
        """Mix the stored personal models {client: flat model} in place."""


class ModelDistances(ABC):
    """After local training, a client's report is revised from ‖g − G_k‖² [K], the distances of
    its trained model's representation (``representation_mask``) to every global model."""

    @abstractmethod
    def reassign(self, report: ClientReport, distances: Tensor, context: ClientContext) -> ClientReport:
        """The client's report after training (e.g. the nearest centre's one-hot ω)."""

    def representation_mask(self, parameter_names: list[str]) -> list[bool]:
        """Which parameters form the representation (all by default); raises a ValueError for
        options that match no parameter (checked before training)."""
        return [True] * len(parameter_names)


class LabelStatistics(ABC):
    """Clients divide their likelihoods by the server's label statistics C_{y,k}, computed from
    the label sums in the client store (FedRC). ``uses_label_stats``: whether this instance does
    (FedEM is FedRC without them)."""

    uses_label_stats: bool = True

    @abstractmethod
    def log_label_stats(self, state: ClientState | ClientStoreView) -> Tensor | None:
        """log C_{y,k} [C, K] (None: C is constant and drops out)."""


class ClientOutputs:
    """The E-step reads the K global models' outputs on the client's training rows
    (``ClientContext.outputs``, [K, N, C] class probabilities), which every executor has from
    the E-step's pass anyway. ``uses_client_outputs``: whether this instance does (FedRC only with
    concept grouping)."""

    uses_client_outputs: bool = True


@dataclass(frozen=True)
class Capabilities:
    """Which optional protocols a rule implements, read in one place (``Capabilities.of``):
    what the engine, the executors and the Flower apps need to know of a rule."""

    label_stats: bool = False
    estimation: bool = False
    server_selection: bool = False
    personal_models: bool = False
    personal_copies: int = 1
    personal_mixing: bool = False
    model_distances: bool = False
    client_outputs: bool = False

    @classmethod
    def of(cls, rule: Any) -> Capabilities:
        personal = isinstance(rule, PersonalModels)
        return cls(
            label_stats=isinstance(rule, LabelStatistics) and bool(rule.uses_label_stats),
            estimation=isinstance(rule, Estimation),
            server_selection=isinstance(rule, ServerSelection),
            personal_models=personal,
            personal_copies=rule.personal_copies if personal else 1,
            personal_mixing=isinstance(rule, PersonalMixing),
            model_distances=isinstance(rule, ModelDistances),
            client_outputs=isinstance(rule, ClientOutputs) and bool(rule.uses_client_outputs),
        )


def label_statistics(rule: Any, state: ClientState | ClientStoreView) -> Tensor | None:
    """The log C_{y,k} that clients use this round: the rule's, for a rule with label statistics
    that uses them; None otherwise."""
    return rule.log_label_stats(state) if Capabilities.of(rule).label_stats else None
