"""The round schedule: which clients take part in round t and how many local steps each runs.
A pure function of (seed, round), so every process and every resumed run agrees without
communication."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.seeds import CLIENT_SAMPLING, derive_seed


@dataclass(frozen=True)
class RoundSchedule:
    """``steps_per_client`` [M]: local SGD steps of each client when it takes part.

    ``selector``: when the server chooses the round's clients from its state (FedSoft), a function
    round → sorted client ids, of at most ``clients_per_round`` clients; else a seeded uniform sample.
    Which process trains which of the round's clients is the executors' (``engine/executors/local.py``).
    """

    num_clients: int
    clients_per_round: int
    steps_per_client: Tensor
    seed: int = 0
    selector: Callable[[int], Tensor] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.clients_per_round <= self.num_clients:
            raise ValueError(
                f"clients_per_round={self.clients_per_round} must be between 1 and the number of clients "
                f"({self.num_clients}): lower clients_per_round or give the datamodule more clients"
            )

    def clients(self, round_index: int) -> Tensor:
        """Sorted ids of the round's clients: a seeded sample without replacement."""
        if self.selector is not None:
            chosen = self.selector(round_index)
            if len(chosen) > self.clients_per_round:
                raise RuntimeError(
                    f"the client selector chose {len(chosen)} clients, more than its bound "
                    f"{self.clients_per_round}"
                )
            return chosen
        if self.clients_per_round == self.num_clients:
            return torch.arange(self.num_clients)
        generator = torch.Generator().manual_seed(derive_seed(self.seed, round_index, CLIENT_SAMPLING))
        chosen = torch.randperm(self.num_clients, generator=generator)[: self.clients_per_round]
        return chosen.sort().values


def local_steps_per_client(
    train_sizes: Tensor,
    batch_size: int,
    local_steps: int | None,
    local_epochs: int | None,
    drop_last: bool = False,
) -> Tensor:
    """Local steps for each client: a fixed count, or ``local_epochs`` passes over its data in
    minibatches of ``batch_size``: ⌈N/B⌉ batches per pass, or ⌊N/B⌋ with ``drop_last``."""
    if local_steps is not None:
        return torch.full_like(train_sizes, local_steps)
    assert local_epochs is not None
    if drop_last:
        small = (train_sizes < batch_size).nonzero().flatten()
        if len(small):
            client = int(small[0])
            raise ValueError(
                f"drop_last=True drops every batch of client {client} ({int(train_sizes[client])} samples < "
                f"batch_size={batch_size}), so it would never train: lower the datamodule's batch_size or "
                "set drop_last=False"
            )
        return local_epochs * torch.div(train_sizes, batch_size, rounding_mode="floor")
    return local_epochs * torch.div(train_sizes + batch_size - 1, batch_size, rounding_mode="floor")


def batches_per_epoch(num_samples: int, batch_size: int, drop_last: bool) -> int:
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


def epoch_batch(step: int, num_samples: int, batch_size: int, drop_last: bool) -> tuple[int, int, int]:
    """Local step ``step`` of a client that passes over its data in epochs of shuffled
    minibatches, as a DataLoader with ``shuffle=True`` gives: (epoch, start, stop) within that
    epoch's permutation; the last batch of an epoch is partial unless ``drop_last``."""
    epoch, index = divmod(step, batches_per_epoch(num_samples, batch_size, drop_last))
    start = index * batch_size
    return epoch, start, min(start + batch_size, num_samples)


def step_rows(order: Tensor, step: int, batch_size: int, by_epochs: bool, drop_last: bool) -> Tensor:
    """The rows of local step ``step`` from ``order``, the permutation of the step's epoch
    (``by_epochs``: ``epoch_batch``'s slice, the last one partial unless ``drop_last``) or of the
    round (batches of min(B, N) rows cycling through it)."""
    n = order.shape[0]
    if not by_epochs:
        size = min(batch_size, n)
        return order[(step * size + torch.arange(size, device=order.device)) % n]
    _, start, stop = epoch_batch(step, n, batch_size, drop_last)
    return order[start:stop]


def schedule_for(
    rule: Any,
    datamodule: Any,
    clients_per_round: int | None,
    local_steps: int | None,
    local_epochs: int | None,
    drop_last: bool,
    seed: int,
    client_state: Callable[[], Any],
) -> RoundSchedule:
    """A run's RoundSchedule: each client's local steps from its data size, and the clients per
    round, sampled uniformly by ``seed`` or chosen by a rule that selects from the client store
    (FedSoft's v sampling reads ``client_state()`` when the round comes)."""
    steps = local_steps_per_client(
        datamodule.train_sizes, datamodule.batch_size, local_steps, local_epochs, drop_last
    )
    per_round = datamodule.num_clients if clients_per_round is None else clients_per_round
    selector = None
    if rule.capabilities.server_selection:
        per_round = rule.max_clients_per_round(datamodule.num_clients)

        def selector(round_index: int) -> Tensor:
            membership = rule.round_membership(round_index, client_state(), datamodule.train_sizes, seed)
            return membership.any(1).nonzero().flatten()

    return RoundSchedule(datamodule.num_clients, per_round, steps, seed, selector=selector)
