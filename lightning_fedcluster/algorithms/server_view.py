"""What a rule's server hook sees: a read-only view of the server after a round's aggregation.

``ServerView`` holds the round's outcome (who reported what), the client store and the global
cluster models, each per cluster as its federated tensors or as one flat vector. Everything it
hands out is a copy, so a rule changes the server only through the actions it returns
(``algorithms/actions.py``): a merge rule compares two cluster models and returns a merge; a
split rule copies a model into a dead slot and moves some clients' weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState


@dataclass(frozen=True)
class RoundOutcome:
    """What the server knows after a round's aggregation: the clients that reported [n], their
    reported ω [n, K], their training sizes [n], every client's training size [M] and, when the
    rule asked for them (``round_vectors``), one flat float32 vector per client [n, P]."""

    round_index: int
    clients: Tensor
    omega: Tensor
    sizes: Tensor
    train_sizes: Tensor
    vectors: Tensor | None = None


class ClientStoreView:
    """The client store (``ClientState``) read-only: every tensor is handed out as a copy.
    ω [M, K], label sums [M, C, K], seen [M], active [K], extra {name: tensor}."""

    def __init__(self, state: ClientState) -> None:
        self._state = state

    @property
    def omega(self) -> Tensor:
        return self._state.omega.clone()

    @property
    def label_sums(self) -> Tensor:
        return self._state.label_sums.clone()

    @property
    def seen(self) -> Tensor:
        return self._state.seen.clone()

    @property
    def active(self) -> Tensor:
        return self._state.active.clone()

    @property
    def extra(self) -> dict[str, Tensor]:
        return {name: value.clone() for name, value in self._state.extra.items()}

    @property
    def num_clients(self) -> int:
        return self._state.num_clients

    @property
    def num_clusters(self) -> int:
        return self._state.num_clusters


class ServerView:
    """The server after a round's aggregation, as a rule's ``after_round`` sees it.

    ``outcome``: the round's ``RoundOutcome``. ``client_state``: the client store (a
    ``ClientStoreView``, with this round's reports recorded). ``active`` [K]: the alive clusters.
    ``cluster_tensors(k)``: cluster k's global model as its federated tensors (parameters and
    float buffers, shared layers excluded); ``cluster_vector(k)``: the same as one flat vector.
    ``num_rounds``: the run's rounds (``max_epochs``, or a Flower run's rounds; None: unbounded).
    """

    def __init__(
        self,
        outcome: RoundOutcome,
        client_state: ClientState | ClientStoreView,
        global_clusters: Sequence[Sequence[Tensor]],
        num_rounds: int | None = None,
    ) -> None:
        self.outcome = outcome
        self.num_rounds = num_rounds
        self.client_state = (
            client_state if isinstance(client_state, ClientStoreView) else ClientStoreView(client_state)
        )
        self._clusters = global_clusters

    @property
    def round_index(self) -> int:
        return self.outcome.round_index

    @property
    def num_clusters(self) -> int:
        return self.client_state.num_clusters

    @property
    def active(self) -> Tensor:
        return self.client_state.active

    def cluster_tensors(self, k: int) -> tuple[Tensor, ...]:
        """Cluster k's global model after this round's aggregation: copies of its federated tensors."""
        return tuple(t.detach().clone() for t in self._clusters[k])

    def cluster_vector(self, k: int, dtype: torch.dtype = torch.float64) -> Tensor:
        """Cluster k's global model as one flat vector (float64 by default, for distances that do
        not depend on summation order in float32), on the CPU."""
        return torch.cat([t.detach().reshape(-1).to("cpu", dtype) for t in self._clusters[k]])
