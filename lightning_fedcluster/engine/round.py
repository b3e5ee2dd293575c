"""One round's server-side accumulators: the global snapshot the round started from, the float64
sums of weighted client updates, and the clients' reports (one flat ``RoundBuffer``), reduced
over processes in a single all-reduce and applied at the round's end.

Float64 sums make the result independent of the order clients arrive in, so 1 and N processes
give the same float32 weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.aggregation import accumulate_delta, apply_weighted_update
from lightning_fedcluster.algorithms.base import Algorithm, ClientReport
from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.engine.client import ClientWork
from lightning_fedcluster.engine.copies import Snapshot
from lightning_fedcluster.engine.optimizer_state import store_state
from lightning_fedcluster.engine.reply_checks import ReplyLimits, client_problems
from lightning_fedcluster.engine.round_buffer import RoundBuffer
from lightning_fedcluster.engine.server_optimizer import ServerOptimizer, cluster_group

Reduce = Callable[[Tensor], Tensor]


class RoundState:
    """The round ``round_index`` with ``clients`` [n] (slot i = clients[i]) of sizes ``sizes`` [n]."""

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
        self.clients = clients
        self.sizes = sizes
        self.global_clusters, self.global_shared = snapshot
        self.delta_sum = [[torch.zeros_like(t, dtype=torch.float64) for t in g] for g in self.global_clusters]
        self.delta_shared = [torch.zeros_like(t, dtype=torch.float64) for t in self.global_shared]
        self.sample_offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        n, k = len(clients), len(self.global_clusters)
        shapes: dict[str, tuple[int, ...]] = {
            "omega": (n, k),
            "label_sums": (n, num_classes, k),
            "reported": (n,),
            "rejected": (n,),
            "weights": (k + 1,),
            "metrics": (3,),
        }
        # Persistent optimizer state (optimizer_state="persist"): with ``optimizer_in_store`` (one
        # process: nothing to sum) each client's state goes straight into the store as it finishes;
        # otherwise one flat float32 vector per client in a buffer summed over processes.
        self.optimizer_store = state if optimizer_size is not None and optimizer_in_store else None
        buffered = optimizer_size is not None and self.optimizer_store is None
        if buffered:
            shapes["optimizer_started"] = (n, k)
        entries = [e for e in rule.state_entries() if e.reported and e.name in state.extra]
        self.reported_state = [e.name for e in entries]
        self.per_sample = {e.name for e in entries if e.scope == Scope.SAMPLE}
        for name in self.reported_state:
            rows = int(self.sample_offsets[-1]) if name in self.per_sample else n
            shapes[f"extra.{name}"] = (rows, *state.extra[name].shape[1:])
        self.report = RoundBuffer(shapes, device)
        self.vectors = (
            RoundBuffer({"vectors": (n, vector_size)}, device, torch.float32) if vector_size else None
        )
        self.optimizer = (
            RoundBuffer({"vectors": (n, optimizer_size)}, device, torch.float32) if buffered else None
        )
        self.membership: Tensor | None = None  # [M, K] clients chosen per cluster (server selection)
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
        """What the client reports: ω, label sums, and the algorithm state it updated."""
        slot = work.slot
        self.report["omega"][slot] = report.omega
        self.report["label_sums"][slot] = report.label_sums
        self.report["reported"][slot] = 1.0
        start, stop = int(self.sample_offsets[slot]), int(self.sample_offsets[slot + 1])
        for name in self.reported_state:
            if name not in work.context.extra:
                continue
            value = work.context.extra[name].to(torch.float64)
            if name in self.per_sample:
                self.report[f"extra.{name}"][start:stop] = value
            else:
                self.report[f"extra.{name}"][slot] = value

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
