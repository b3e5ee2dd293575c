"""One round's server-side accumulators: the global snapshot the round started from, the float64
sums of weighted client updates, and the clients' reports (one flat ``RoundBuffer``), reduced
over processes in a single all-reduce and applied at the round's end. The report's segments are
declared once (``core_report`` and the rule's reported ``StateEntry``s: scope, shape, reduction);
the buffer, a Flower node's reply (``reply``) and the server's merge of it (``merge``) come from
those declarations.

Float64 sums make the result independent of the order clients arrive in, so 1 and N processes
give the same float32 weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.aggregation import accumulate_delta, apply_weighted_update
from lightning_fedcluster.algorithms.base import Algorithm, ClientReport
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.engine.client import ClientWork
from lightning_fedcluster.engine.copies import Snapshot
from lightning_fedcluster.engine.optimizer_state import store_state
from lightning_fedcluster.engine.reply_checks import ReplyLimits, client_problems
from lightning_fedcluster.engine.round_buffer import RoundBuffer
from lightning_fedcluster.engine.server_optimizer_state import ServerOptimizer, cluster_group

Reduce = Callable[[Tensor], Tensor]
ROSTER = ("reported", "rejected")  # per-client flags that a node's reply sends as lists of clients


class RoundState:
    """The round ``round_index`` with ``clients`` [n] (slot i = clients[i]: a client's row in the
    client store ``state``) of sizes ``sizes`` [n]."""

    def __init__(
        self,
        round_index: int,
        clients: Tensor,
        sizes: Tensor,
        snapshot: Snapshot,
        rule: Algorithm,
        state: ClientState,
        num_classes: int,
        vector_size: int,
        device: torch.device,
        optimizer_size: int | None = None,
        optimizer_in_store: bool = False,
        limits: ReplyLimits | None = None,
    ) -> None:
        self.round_index = round_index
        self.store = state  # the client store the round's clients read and report into
        self.clients = clients
        self.sizes = sizes
        self.global_clusters, self.global_shared = snapshot
        self.delta_sum = [[torch.zeros_like(t, dtype=torch.float64) for t in g] for g in self.global_clusters]
        self.delta_shared = [torch.zeros_like(t, dtype=torch.float64) for t in self.global_shared]
        self.sample_offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        n, k = len(clients), len(self.global_clusters)
        # Persistent optimizer state (optimizer_state="persist"): with ``optimizer_in_store`` (one
        # process: nothing to sum) each client's state goes straight into the store as it finishes;
        # otherwise one flat float32 vector per client in a buffer summed over processes.
        self.optimizer_store = state if optimizer_size is not None and optimizer_in_store else None
        buffered = optimizer_size is not None and self.optimizer_store is None
        # The report's segments, each declared once (scope, shape, reduction): the buffer, a Flower
        # node's reply and the server's merge are generated from them.
        self.fields = core_report(k, num_classes, buffered)
        self.rule_fields = {
            f"extra.{e.name}": e for e in rule.state_entries() if e.reported and e.name in state.extra
        }
        self.fields.update(self.rule_fields)
        samples = int(self.sample_offsets[-1])
        self.num_classes = num_classes
        shapes = {name: entry.full_shape(n, samples, k, num_classes) for name, entry in self.fields.items()}
        self.report = RoundBuffer(shapes, device)
        self.vectors = (
            RoundBuffer({"vectors": (n, vector_size)}, device, torch.float32) if vector_size else None
        )
        self.optimizer = (
            RoundBuffer({"vectors": (n, optimizer_size)}, device, torch.float32) if buffered else None
        )
        self.membership: Tensor | None = None  # [M, K] clients chosen per cluster (server selection)
        self.log_label_stats: Tensor | None = None  # log C_{y,k} as the round starts (label statistics)
        # The checks every client's work passes before it enters the sums (engine/reply_checks.py).
        self.limits = limits or ReplyLimits()
        self.active = state.active.clone()
        self.rejections: list[str] = []  # this process's refused replies, in words

    # -- client side ---------------------------------------------------------------------------
    def admit(
        self,
        work: ClientWork,
        updates: Sequence[tuple[str, Sequence[Tensor], Sequence[Tensor]]],
        omega: Tensor,
    ) -> bool:
        """Whether a client's work may enter the round's sums: its trained ``updates`` (label,
        trained tensors, the global tensors they update) and its ω pass the reply checks;
        otherwise it is counted as rejected, with the reasons."""
        problems = client_problems(work.client, updates, omega, self.active, self.limits)
        if problems:
            self.reject([work.slot], f"client {work.client}", problems)
        return not problems

    def admit_stacked(self, works: Sequence[ClientWork], mix: Tensor, thetas: Sequence[Tensor]) -> Tensor:
        """``admit`` for a chunk (``accumulate_stacked``'s arguments): the clients [C] that pass."""
        accepted = torch.ones(len(works), dtype=torch.bool)
        for c, work in enumerate(works):
            pairs = (mix[c] > 0).nonzero().tolist()
            updates = [
                (f"cluster {t}", [theta[c, s] for theta in thetas], self.global_clusters[t][: len(thetas)])
                for s, t in pairs
            ]
            accepted[c] = self.admit(work, updates, work.report.omega)
        return accepted

    def reject(self, slots: Sequence[int], sender: str, problems: Sequence[str]) -> None:
        """Count the clients in ``slots`` as rejected: ``sender``'s reply failed ``problems`` (the
        message names the round 1-based, as the progress lines do)."""
        for slot in slots:
            self.report["rejected"][slot] = 1.0
        self.rejections.append(
            f"round {self.round_index + 1}: the reply of {sender} is rejected and left out of the round: "
            + "; ".join(problems)
        )

    def accumulate(self, target: int, local: Sequence[Tensor], weight: float) -> None:
        """Cluster ``target`` += weight · (local − θ_target), for one trained copy ``local``."""
        accumulate_delta(self.delta_sum[target], local, self.global_clusters[target], weight)
        self.report["weights"][target] += weight

    def accumulate_stacked(self, mix: Tensor, thetas: Sequence[Tensor]) -> None:
        """The batched form: cluster t += Σ_(c,s) mix[c,s,t] · (θ_cs − θ_t), with ``thetas[i]``
        [C, K, ...] the chunk's trained copies of federated tensor i (a prefix of the tensors)."""
        self.report["weights"][:-1] += mix.sum((0, 1)).to(self.report.flat)
        for target in mix.sum((0, 1)).nonzero().flatten().tolist():
            weights = mix[:, :, target].to(thetas[0].device)
            for i, theta in enumerate(thetas):
                delta = (theta - self.global_clusters[target][i]).double()
                self.delta_sum[target][i].add_(torch.einsum("cs,cs...->...", weights, delta))

    def accumulate_shared(self, local: Sequence[Tensor], weight: float) -> None:
        """The shared layers += weight · (local − θ_shared) (every contributing client, weight N_i)."""
        accumulate_delta(self.delta_shared, local, self.global_shared, weight)
        self.report["weights"][-1] += weight

    def record(self, work: ClientWork, report: ClientReport) -> None:
        """What the client reports: ω, label sums, and the rule's reported entries by their scope
        (its own row or sample rows; per cluster or for the run: added to the round's sum)."""
        slot = work.slot
        self.report["omega"][slot] = report.omega
        self.report["label_sums"][slot] = report.label_sums
        self.report["reported"][slot] = 1.0
        start, stop = int(self.sample_offsets[slot]), int(self.sample_offsets[slot + 1])
        for name, entry in self.rule_fields.items():
            value = work.context.extra.get(entry.name)
            if value is None:
                continue
            segment = self.report[name]
            value = value.to(segment)
            if entry.scope == Scope.SAMPLE:
                segment[start:stop] = value
            elif entry.scope == Scope.CLIENT:
                segment[slot] = value
            else:
                segment.add_(value)

    def reply_shapes(self, accepted: int) -> dict[str, tuple[int, ...]]:
        """The segments a node's reply with ``accepted`` clients carries, and their shapes: every
        declared segment but the roster flags (the reply lists the clients instead, ``ROSTER``) and
        the per-sample ones (those stay with the clients); per-client ones for its accepted clients."""
        k = len(self.global_clusters)
        return {
            name: entry.full_shape(accepted, 0, k, self.num_classes)
            for name, entry in self.fields.items()
            if entry.scope != Scope.SAMPLE and name not in ROSTER
        }

    def reply(self, ids: Tensor) -> dict[str, Tensor]:
        """The report as a node sends it to the server (``ids``: the global ids of this round's
        slots): the clients whose work passed the reply checks (``clients``) and the others
        (``rejected``), then the segments of ``reply_shapes``, per-client rows of the accepted
        clients only."""
        reported = self.reported_slots()
        message = {"clients": ids[reported], "rejected": ids[~reported]}
        for name in self.reply_shapes(0):
            segment = self.report[name]
            message[name] = segment[reported] if self.fields[name].scope == Scope.CLIENT else segment
        return message

    def merge(self, reply: dict[str, Tensor], slots: dict[int, int]) -> None:
        """A node's ``reply`` (checked) into the round's report (``slots``: client -> slot of this
        round): its accepted clients' rows into their slots, marked reported; per-cluster and
        run-wide segments added; its rejected clients marked rejected; and the clients' vectors,
        when sent."""
        rows = torch.tensor([slots[int(c)] for c in reply["clients"].tolist()], dtype=torch.long)
        for name in self.reply_shapes(0):
            if self.fields[name].scope == Scope.CLIENT:
                self.report[name][rows] = reply[name].to(self.report.flat)
            else:
                self.report[name].add_(reply[name].to(self.report.flat))
        self.report["reported"][rows] = 1.0
        for client in reply["rejected"].tolist():
            self.report["rejected"][slots[int(client)]] = 1.0
        if "vectors" in reply:
            assert self.vectors is not None
            self.vectors["vectors"][rows] = reply["vectors"].to(self.vectors.flat)

    def record_optimizer(self, slot: int, vector: Tensor, started: Tensor) -> None:
        """The client's optimizer state after training (``optimizer_state="persist"``): into the
        store now (``optimizer_in_store``), else into the round's buffer."""
        if self.optimizer_store is not None:
            store_state(self.optimizer_store, int(self.clients[slot]), vector, started)
            return
        assert self.optimizer is not None
        self.optimizer["vectors"][slot] = vector
        self.report["optimizer_started"][slot] = started.to(self.report.flat)

    def add_metrics(self, sums: Tensor) -> None:
        self.report["metrics"].add_(sums)

    # -- server side ---------------------------------------------------------------------------
    def reduce(self, reduce_sum: Reduce) -> None:
        """Sum every process's updates and reports (one all-reduce, plus one for the vectors)."""
        flat = [t.flatten() for deltas in self.delta_sum for t in deltas]
        flat += [t.flatten() for t in self.delta_shared] + [self.report.flat]
        sizes = [t.numel() for t in flat]
        parts = list(torch.split(reduce_sum(torch.cat(flat)), sizes))
        self.report.replace(parts.pop())
        for deltas in [*self.delta_sum, self.delta_shared]:
            for i, t in enumerate(deltas):
                deltas[i] = parts.pop(0).view_as(t)
        for buffer in (self.vectors, self.optimizer):
            if buffer is not None:
                buffer.replace(reduce_sum(buffer.flat))

    def apply(self, server_lr: float, server_optimizer: ServerOptimizer | None = None) -> None:
        """θ_k ← θ_k + η_g Σ w Δ / Σ w, on the global snapshot (a cluster without weight keeps its
        model); with a server optimizer, θ_k ← θ_k + η_g · its direction for that average."""
        weights = self.report["weights"]
        groups = [
            (cluster_group(k), t, self.delta_sum[k], float(weights[k]))
            for k, t in enumerate(self.global_clusters)
        ]
        if self.global_shared:
            groups.append(("shared", self.global_shared, self.delta_shared, float(weights[-1])))
        for group, tensors, deltas, weight in groups:
            if server_optimizer is None:
                apply_weighted_update(tensors, deltas, weight, server_lr)
            else:
                server_optimizer.step(group, tensors, deltas, weight, server_lr)

    def reported_slots(self) -> Tensor:
        return (self.report["reported"] > 0).cpu()

    def rejected_count(self) -> int:
        """Clients of the round whose replies were rejected (over every process, once reduced)."""
        return int((self.report["rejected"] > 0).sum())


def core_report(num_clusters: int, num_classes: int, optimizer_started: bool) -> dict[str, StateEntry]:
    """The segments every round reports: per client its ω [K], label sums [C, K], whether it was
    reported or rejected (the roster: a node's reply lists the clients instead, ``ROSTER``) and
    (persistent optimizer state over several processes) its started flags [K]; summed over
    clients, the server weights [K + 1] (the last: shared layers) and the metric sums [3]."""
    k, client, scalar = num_clusters, Scope.CLIENT, Scope.SCALAR
    fields = {
        "omega": StateEntry("omega", client, (k,), reported=True),
        "label_sums": StateEntry("label_sums", client, (num_classes, k), reported=True),
        "reported": StateEntry("reported", client, reported=True),
        "rejected": StateEntry("rejected", client, reported=True),
        "weights": StateEntry("weights", scalar, (k + 1,), reported=True, reduction="sum"),
        "metrics": StateEntry("metrics", scalar, (3,), reported=True, reduction="sum"),
    }
    if optimizer_started:
        fields["optimizer_started"] = StateEntry("optimizer_started", client, (k,), reported=True)
    return fields
