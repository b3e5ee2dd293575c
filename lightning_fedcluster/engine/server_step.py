"""The server's pieces of a round (``engine/federation.py`` runs them in order): store what the
clients reported, what the rule's server step sees of the round, and the round's training
metrics (the estimation pass is the executors': ``engine/executors/local.py``). No algorithm is
named here."""

from __future__ import annotations

from torch import Tensor

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.algorithms.server_view import RoundOutcome
from lightning_fedcluster.engine.optimizer_state import store_state
from lightning_fedcluster.engine.round import RoundState
from lightning_fedcluster.engine.task import Task


def record_round(rule: Algorithm, state: ClientState, round_state: RoundState, train_offsets: Tensor) -> None:
    """Store the reduced reports of the round's clients in the client store: ω, label sums and
    participation, then the rule's reported entries by their declared scope and reduction (a
    client's row, its samples' rows, or the round's sum or mean over its reporting clients)."""
    buffer = round_state.report
    reported = round_state.reported_slots()
    clients = round_state.clients[reported]
    state.record(clients, buffer["omega"].cpu()[reported], buffer["label_sums"].cpu()[reported])
    slots = reported.nonzero().flatten().tolist()
    for name, entry in round_state.rule_fields.items():
        values, target = buffer[name].cpu(), state.extra[entry.name]
        if entry.scope == Scope.SAMPLE:
            for slot in slots:
                client = int(round_state.clients[slot])
                start, stop = (int(v) for v in round_state.sample_offsets[slot : slot + 2])
                rows = slice(int(train_offsets[client]), int(train_offsets[client + 1]))
                target[rows] = values[start:stop].to(target.dtype)
        elif entry.scope == Scope.CLIENT:
            target[clients] = values[reported].to(target.dtype)
        elif slots:  # per cluster or for the run: the reporting clients' sum or mean
            total = values / len(slots) if entry.reduction == "mean" else values
            target.copy_(total.to(target.dtype))
    if round_state.optimizer is not None:  # the summed buffer (else already in the store)
        states = round_state.optimizer["vectors"].cpu()
        started = round_state.report["optimizer_started"].cpu() > 0
        for slot in slots:
            store_state(state, int(round_state.clients[slot]), states[slot], started[slot])
    capabilities = rule.capabilities
    if capabilities.personal_models and round_state.vectors is not None:
        vectors = round_state.vectors["vectors"].cpu()
        for slot in slots:
            state.personal[int(round_state.clients[slot])] = vectors[slot].clone()
        if capabilities.personal_mixing:
            rule.mix_personal(state.personal, round_state.round_index)


def round_outcome(round_state: RoundState, train_sizes: Tensor) -> RoundOutcome:
    reported = round_state.reported_slots()
    vectors = None if round_state.vectors is None else round_state.vectors["vectors"].cpu()[reported]
    return RoundOutcome(
        round_index=round_state.round_index,
        clients=round_state.clients[reported],
        omega=round_state.report["omega"].cpu()[reported],
        sizes=round_state.sizes[reported],
        train_sizes=train_sizes,
        vectors=vectors,
    )


def round_metrics(round_state: RoundState, state: ClientState, task: Task) -> dict[str, float]:
    """The Lightning engine's per-round metrics (same names): mixture loss and accuracy (or MSE)
    of the round's clients before training, clients that reported, alive clusters."""
    nll, second, count = (float(v) for v in round_state.report["metrics"])
    count = max(count, 1.0)
    second_name = task.round_metrics[1]
    return {
        "train/loss": nll / count,
        second_name: second / count,
        "train/clients": float(round_state.reported_slots().sum()),
        "clusters/active": float(state.active.sum()),
    }
