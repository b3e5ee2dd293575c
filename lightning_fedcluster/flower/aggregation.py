"""What the Flower server takes from its nodes: a node's summed updates and its clients' reports
into the round's sums, once the reply passes the server's checks (``engine/reply_checks.py``),
and (``collect_client_state``) a node's client store into the server's."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.engine.reply_checks import finite_problems, shape_problems, summed_problems
from lightning_fedcluster.engine.round import RoundState
from lightning_fedcluster.flower import records

Sections = dict[str, dict[str, Tensor]]


def reply_problems(round_state: RoundState, sections: Sections, sent: list[int]) -> list[str]:
    """Why a node's reply (unpacked) to a round that sent it clients ``sent`` cannot be merged: the
    sections and tensors the round declares, with their shapes and dtypes; the clients it reports
    (trained) and rejected on the node, which together are ``sent``; then the reply checks
    (``summed_problems``: finite, weighted, within ``max_update_norm``, ω on the simplex)."""
    if set(sections) != {"update", "report"}:
        return [f"sections {sorted(sections)}, expected ['report', 'update']"]
    report, update = sections["report"], sections["update"]
    ids = [report.get(key) for key in ("clients", "rejected")]
    if any(t is None or t.dtype != torch.long or t.dim() != 1 for t in ids):
        return ["its client lists ('clients', 'rejected') are not 1-D int64 tensors"]
    trained, rejected = (t.tolist() for t in ids)
    if sorted(trained + rejected) != sorted(sent):
        return [f"it reports clients {trained} and rejected {rejected}, but was sent {sent}"]
    n, k = len(trained), len(round_state.delta_sum)
    declared: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        name: (tuple(t.shape), torch.float64)
        for name, t in records.snapshot_tensors((round_state.delta_sum, round_state.delta_shared)).items()
    }
    problems = shape_problems(update, declared)
    # The report's segments as the round declares them (``RoundState.reply_shapes``).
    segments = round_state.reply_shapes(n)
    reported = {name: (shape, torch.float64) for name, shape in segments.items()}
    reported |= {"clients": ((n,), torch.long), "rejected": ((len(rejected),), torch.long)}
    if round_state.vectors is not None:
        reported["vectors"] = ((n, round_state.vectors.shapes["vectors"][1]), torch.float32)
    problems += shape_problems(report, reported)
    if problems:
        return problems
    with_update = ("omega", "weights")  # checked below, with the update (summed_problems)
    problems = finite_problems({name: report[name] for name in segments if name not in with_update})
    if "vectors" in report:
        problems += finite_problems({"vectors": report["vectors"]})
    deltas, shared = records.tensors_snapshot(update, k)
    return problems + summed_problems(
        deltas, shared, report["weights"], report["omega"], trained, round_state.active, round_state.limits
    )


def merge(round_state: RoundState, sections: Sections, slots: dict[int, int]) -> None:
    """A node's summed updates and its clients' reports (its reply, unpacked and checked by
    ``reply_problems``) into the round's sums; the clients its node rejected counted as rejected."""
    update = sections["update"]
    deltas, shared = records.tensors_snapshot(update, len(round_state.delta_sum))
    for k, tensors in enumerate(deltas):
        for i, t in enumerate(tensors):
            round_state.delta_sum[k][i].add_(t.to(round_state.delta_sum[k][i]))
    for i, t in enumerate(shared):
        round_state.delta_shared[i].add_(t.to(round_state.delta_shared[i]))
    round_state.merge(sections["report"], slots)


def merge_store(
    rule: Any,
    state: ClientState,
    stored: dict[str, Tensor],
    clients: Tensor,
    offsets: Tensor,
    owned: set[str],
) -> None:
    """A node's client store (its clients' rows; per-sample rows: their samples in order) into
    the full store ``state`` (``offsets``: every client's training rows), but for the entries the
    server's actions own (``owned``), whose rows on a node are only those of its trained clients."""
    rows = clients.tolist()
    if "omega" not in owned:
        state.omega[clients] = stored["omega"]
    if "label_sums" not in owned:
        state.label_sums[clients] = stored["label_sums"]
    state.seen[clients] = stored["seen"]
    sizes = offsets[1:] - offsets[:-1]
    local = torch.cat([torch.zeros(1, dtype=torch.long), sizes[clients].cumsum(0)])
    num_samples = int(offsets[-1])
    for entry in rule.state_entries():
        name = entry.name
        initial = entry.initial_value(
            state.num_clients, num_samples, state.num_clusters, state.label_sums.shape[1]
        )
        target = state.extra.setdefault(name, initial)
        state.entries.setdefault(name, entry)
        value = stored.get(f"extra.{name}")
        if value is None or name in owned:
            continue
        if entry.scope == Scope.SAMPLE:
            for r, client in enumerate(rows):
                target[int(offsets[client]) : int(offsets[client + 1])] = value[
                    int(local[r]) : int(local[r + 1])
                ]
        elif entry.scope == Scope.CLIENT:
            target[clients] = value
    if "personal.ids" in stored:  # FedSoft: the nodes' personal models, keyed by their rows
        for row, model in zip(stored["personal.ids"].tolist(), stored["personal.models"], strict=True):
            state.personal[rows[row]] = model.clone()
    if "optimizer.ids" in stored:
        for row, vector in zip(stored["optimizer.ids"].tolist(), stored["optimizer.vectors"], strict=True):
            state.optimizer[rows[row]] = vector.clone()
        state.optimizer_started[clients] = stored["optimizer.started"]
