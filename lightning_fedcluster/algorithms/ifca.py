"""IFCA (Ghosh, Chung, Yin, Ramchandran, NeurIPS 2020, Algorithm 1; a baseline in FedRC's
Section 5). Plain tensors.

A client joins the cluster whose model has the lowest mean loss on its data and trains only that
model; server weight N_i. A cluster with no member this round keeps its model (the engine skips
zero-weight clusters; the FedRC authors' code zeroes them). Discovery components
(``algorithms/discovery``, e.g. merging and retirement, to find K from an upper bound) run after
its assignment, as they do after FedRC's E-step; their scores are the clients' mean −loss per
cluster (no label statistics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.algorithms.assignment import assignment_report
from lightning_fedcluster.algorithms.base import (
    ClientContext,
    ClientReport,
    Contribution,
    HardAssignment,
    LocalPlan,
    argmin_active,
)
from lightning_fedcluster.algorithms.client_state import StateEntry
from lightning_fedcluster.algorithms.discovery.protocol import Component
from lightning_fedcluster.algorithms.discovery.runner import RunsComponents, turn_contributions, turn_plan


class IFCA(RunsComponents, HardAssignment):
    """IFCA: argmin of the mean loss; only the chosen model trains; weight N_i. ``components``:
    discovery mechanisms to run, in their order (none: the paper's IFCA)."""

    def __init__(
        self,
        num_clusters: int,
        config: Any = None,
        *,
        components: Sequence[Component] = (),
        **options: Any,
    ) -> None:
        super().__init__(num_clusters, config, **options)
        self.use_components(components)

    def state_entries(self) -> tuple[StateEntry, ...]:
        return self.component_entries()

    def e_step(
        self, losses: Tensor, labels: Tensor, context: ClientContext, log_label_stats: Tensor | None
    ) -> ClientReport:
        k = argmin_active(losses.to(torch.float64).mean(0), context.active)
        report = assignment_report(k, losses, labels, context.num_classes)
        return self.run_components(report, losses, labels, None, context)

    def local_plan(self, report: ClientReport, context: ClientContext) -> LocalPlan:
        chosen = turn_plan(report)
        return LocalPlan(clusters=(int(torch.argmax(report.omega)),)) if chosen is None else chosen

    def contributions(
        self, report: ClientReport, plan: LocalPlan, context: ClientContext
    ) -> list[Contribution]:
        weighed = turn_contributions(report, plan, context)
        return super().contributions(report, plan, context) if weighed is None else weighed
