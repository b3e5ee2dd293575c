"""The client contract every executor shares (FedJAX's ``for_each_client`` in spirit).

For a set of clients of one round (one client on the loop executor, a chunk on the vectorised
one, one node on Flower) the engine:

1. ``client_context``: what the rule may know about each client (ids, size, prior ω, state);
2. ``prepare``: the batched E-step over the K global models' per-sample losses and each
   client's local plan: which copies it trains, with which sample weights, proximal anchors and
   minibatch order (``ClientWork``);
3. trains locally (the only step that differs between executors);
4. ``contributions``/``contribution_matrix``: into which cluster each trained copy's update
   goes and with what weight; ``RoundState`` sums them and records each client's report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from lightning_fedcluster.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientReport,
    ClientRule,
    Contribution,
    LocalPlan,
)
from lightning_fedcluster.algorithms.client_state import ClientState, Scope
from lightning_fedcluster.algorithms.fedprox import FedProx
from lightning_fedcluster.algorithms.mixture import mixture_probabilities
from lightning_fedcluster.algorithms.seeds import CLIENT_RNG, MINIBATCH_ORDER, derive_seed
from lightning_fedcluster.engine.task import Task


@dataclass
class ClientWork:
    """One client's turn in a round: its rows ``start:stop`` of the executor's data, the rule's
    context, E-step report and plan, the plan's sample weights [N, len(plan.clusters)] (float32,
    None for 1), its minibatch permutation, and the plan's copies that actually train."""

    client: int
    slot: int
    start: int
    stop: int
    context: ClientContext
    report: ClientReport
    plan: LocalPlan
    sample_weights: Tensor | None
    order: Tensor
    trained: tuple[int, ...]


def non_finite_error(round_index: int, client: int, where: str) -> FloatingPointError:
    return FloatingPointError(
        f"non-finite loss in round {round_index + 1} at client {client} {where}: lower the learning "
        f"rate or check client {client}'s data for NaN/inf"
    )


def client_context(
    rule: Algorithm,
    state: ClientState,
    client: int,
    round_index: int,
    *,
    num_samples: int,
    num_classes: int,
    sample_rows: tuple[int, int],
    seed: int,
    membership: Tensor | None = None,
    device: torch.device | str = "cpu",
    row: int | None = None,
) -> ClientContext:
    """The rule's view of ``client``: its ω, the alive clusters, and the rule's declared entries
    by their scope: the client's row, its training samples' rows ``sample_rows``, or the whole
    per-cluster or run-wide value. ``row``: the client's row in ``state`` when the store holds
    only some clients (a Flower node's own); ``client`` by default."""
    row = client if row is None else row
    extra = {}
    for entry in rule.state_entries():
        value = state.extra.get(entry.name)
        if value is None:
            continue
        if entry.scope == Scope.SAMPLE:
            extra[entry.name] = value[sample_rows[0] : sample_rows[1]].to(device)
        elif entry.scope == Scope.CLIENT:
            extra[entry.name] = value[row].to(device)
        else:
            extra[entry.name] = value.to(device)
    return ClientContext(
        client=client,
        round_index=round_index,
        num_samples=num_samples,
        num_classes=num_classes,
        omega=state.omega[row].to(device),
        active=state.active.to(device),
        seen=bool(state.seen[row]),
        seed_parts=(seed, round_index, client, CLIENT_RNG),
        extra=extra,
        membership=None if membership is None else membership[client],
    )


def trained_copies(plan: LocalPlan, weights: Tensor | None) -> tuple[int, ...]:
    """The plan's copies that train: a soft cluster with zero total weight on this client does not."""
    if weights is None:
        return plan.clusters
    totals = weights.sum(0).tolist()
    return tuple(k for s, k in enumerate(plan.clusters) if totals[s] > 0)


def minibatch_order(seed: int, round_index: int, client: int, num_samples: int, epoch: int = 0) -> Tensor:
    """The client's sample permutation this round (and local epoch): the same on every executor
    and process."""
    parts = (seed, round_index, client, MINIBATCH_ORDER) + ((epoch,) if epoch else ())
    generator = torch.Generator().manual_seed(derive_seed(*parts))
    return torch.randperm(num_samples, generator=generator)


def needs_loss_pass(rule: Algorithm, model: nn.Module) -> bool:
    """Whether a client's turn starts with the no-grad pass of the K global models over its
    training rows (the E-step pass). Every rule's E-step reads those per-sample losses except one
    model's assignment (FedAvg, FedProx: ``FedProx.e_step`` assigns every row to the one model
    whatever the losses, and a rule that reads the outputs says so with ``ClientOutputs``); there
    the pass would only measure the training metrics, which come from the local steps' forward
    passes instead (``step_metric_sums``). A model with its own ``per_sample_loss`` keeps the pass:
    its steps' outputs are not seen."""
    kind = type(rule)
    return not (
        rule.num_clusters == 1
        and kind.e_step is FedProx.e_step
        and kind.e_step_many is ClientRule.e_step_many
        and not rule.capabilities.client_outputs
        and not callable(getattr(model, "per_sample_loss", None))
    )


def passless_losses(rows: int, device: torch.device | str) -> Tensor:
    """[rows, 1] zeros: the losses ``prepare`` hands a rule that reads none (``needs_loss_pass``);
    its report is the same as with the pass's."""
    return torch.zeros(rows, 1, device=device)


def prepare(
    rule: Algorithm,
    losses: Tensor,
    labels: Tensor,
    offsets: Tensor,
    contexts: list[ClientContext],
    slots: list[int],
    log_label_stats: Tensor | None,
    seed: int,
    outputs: Tensor | None = None,
    orders: Sequence[Tensor] | None = None,
) -> list[ClientWork]:
    """E-step and local plan of the clients owning rows offsets[c]:offsets[c+1] of ``losses``
    [N, K] (the K global models' per-sample losses) and ``labels``; ``outputs`` [K, N, C] (the
    models' class probabilities) reach the contexts of a rule with ``ClientOutputs``. ``orders``:
    the clients' round permutations (``minibatch_order``) where the caller already drew them."""
    finite = torch.isfinite(losses).all(1)
    if not bool(finite.all()):
        row = int((~finite).nonzero()[0])
        c = int(torch.searchsorted(offsets, row, right=True)) - 1
        raise non_finite_error(contexts[c].round_index, contexts[c].client, "in its E-step pass")
    if outputs is not None and rule.capabilities.client_outputs:
        bounds = zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        contexts = [replace(c, outputs=outputs[:, a:b]) for c, (a, b) in zip(contexts, bounds, strict=True)]
    reports = rule.e_step_many(losses, labels, offsets, contexts, log_label_stats)
    works = []
    for c, (context, report, slot) in enumerate(zip(contexts, reports, slots, strict=True)):
        start, stop = int(offsets[c]), int(offsets[c + 1])
        plan = rule.local_plan(report, context)
        weights = None if plan.sample_weights is None else plan.sample_weights.to(torch.float32)
        if orders is not None:
            order = orders[c]
        else:
            order = minibatch_order(seed, context.round_index, context.client, stop - start)
        works.append(
            ClientWork(
                context.client, slot, start, stop, context, report, plan, weights, order,
                trained_copies(plan, weights),
            )
        )  # fmt: skip
    return works


def prediction_weights_per_row(rule: Algorithm, works: list[ClientWork], device: torch.device) -> Tensor:
    """[N, K]: each row's mixture weights for the training metrics (its client's prediction ω)."""
    rows = [rule.prediction_weights(w.report.omega).to(device).expand(w.stop - w.start, -1) for w in works]
    return torch.cat(rows).to(torch.float64)


def train_metric_sums(outputs: Tensor, y: Tensor, weights: Tensor, task: Task) -> Tensor:
    """[3] float64: summed NLL (or squared error), summed correct predictions (or squared error)
    and the sample count, of the mixture prediction with per-row ``weights`` [N, K] (or [K])."""
    mixture = mixture_probabilities(outputs.double(), weights)
    values = task.loss_and_score(mixture, y)
    count = torch.tensor(float(y.shape[0]), dtype=torch.float64, device=outputs.device)
    return torch.stack([*values, count])


def step_metric_sums(logits: Tensor, y: Tensor, valid: Tensor | None, task: Task) -> Tensor:
    """[R, 3] float64: ``train_metric_sums`` of one model's raw outputs on R local steps' rows
    (logits [R, B, ...], labels [R, B, ...]; ``valid`` [R, B] masks padding rows): the training
    metrics of a turn without the E-step pass, summed over its local steps as Lightning's
    epoch-level training loss is."""
    rows, batch = logits.shape[:2]
    outputs = task.outputs(logits.reshape(rows * batch, *logits.shape[2:])).reshape(rows, batch, -1).double()
    loss, score = task.row_loss_and_score(outputs, y)
    count = torch.ones_like(loss)
    if valid is not None:
        loss, score, count = (torch.where(valid, v, torch.zeros_like(v)) for v in (loss, score, count))
    return torch.stack([loss.sum(1), score.sum(1), count.sum(1)], dim=1)


def contributions(rule: Algorithm, work: ClientWork, report: ClientReport) -> list[Contribution]:
    """The rule's contributions of this client that carry an update: from a copy it trained,
    with positive weight."""
    trained = set(work.trained)
    return [
        c for c in rule.contributions(report, work.plan, work.context) if c.source in trained and c.weight > 0
    ]


def contribution_matrix(rule: Algorithm, works: list[ClientWork], num_clusters: int) -> Tensor:
    """[C, K, K] float64: weight of client c's copy s in cluster t (the batched form)."""
    mix = torch.zeros(len(works), num_clusters, num_clusters, dtype=torch.float64)
    for c, work in enumerate(works):
        for contribution in contributions(rule, work, work.report):
            mix[c, contribution.source, contribution.target] += contribution.weight
    return mix
