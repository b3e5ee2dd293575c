"""Evaluation: local accuracy (or MSE) of the participating clients on their validation or test
rows, and global accuracy of the unseen clients, whose mixture weights the algorithm's rule
fits on their adapt rows and which are scored on their other rows (never the same ones).
Validation and test use disjoint rows (``FederatedDataModule.evaluation_split``).

Clients are scored in chunks: the test rows of consecutive clients form one contiguous block,
forwarded once through each of the K models in batches of ``eval_batch_size``, and mixed with
each row's client weights, so scoring N clients costs about one forward pass over their rows.
Personal models (FedSoft, D-FedEM) and FedRC-FT fine-tuning change the models per client and
are scored client by client.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.mixture import mixture_probabilities
from lightning_fedcluster.datamodules.loaders import EvaluationChunk
from lightning_fedcluster.engine import client_vectors
from lightning_fedcluster.engine.copies import ClusterCopies, Snapshot, attached_trainer
from lightning_fedcluster.engine.executors.loop import finetune
from lightning_fedcluster.engine.host import TrainingHost
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.metrics.clustering import concept_ari
from lightning_fedcluster.metrics.undefined import NOT_FINITE, warn_nan_metrics


def score(prediction: Tensor, y: Tensor, task: Task) -> Tensor:
    """Correct predictions (classification) or summed per-sample squared error (regression)."""
    return task.score(prediction, y)


def mixture_prediction(module: TrainingHost, x: Tensor, omega: Tensor, owner: Tensor | None = None) -> Tensor:
    """p(y|x) = Σ_k w_k p_k(y|x) (or the weighted regression prediction) of the cluster models,
    with w the rule's prediction weights of ω. ``omega`` is one client's [K], or [C, K] for C
    clients with ``owner`` [N] naming each row's client (an index into ``omega``)."""
    _, outputs = module.evaluate_clusters(x)
    omega = omega.to(outputs.device)
    if owner is None:
        return mixture_probabilities(outputs, module.rule.prediction_weights(omega))
    weights = torch.stack([module.rule.prediction_weights(w) for w in omega]) if omega.shape[0] else omega
    return mixture_probabilities(outputs, weights[owner.to(outputs.device)])


def predicts_per_client(module: TrainingHost) -> bool:
    """Whether a participating client's prediction needs its own model: personal models (FedSoft,
    D-FedEM) or cluster models fine-tuned on its data (FedRC-FT), not just its mixture weights."""
    return module.rule.capabilities.personal_models or module.finetune_epochs > 0


def client_prediction(
    rule: Algorithm,
    copies: ClusterCopies,
    outputs_of: Callable[[Tensor], Tensor],
    x: Tensor,
    omega: Tensor,
    personal: Tensor | None,
    personal_copies: Sequence[int],
    snapshot: Snapshot,
) -> Tensor:
    """A participating client's prediction on x, as every host's validation makes it (the
    Lightning engine's and a Flower node's): its personal model when it has one (FedSoft: one
    copy; D-FedEM: K personal copies mixed by ω), else the mixture of the K global models with the
    rule's prediction weights of ω. ``outputs_of(x)``: the working copies' outputs [K, N, ...]; the
    copies are restored to ``snapshot`` after a personal model."""
    try:
        if personal is not None:
            copies.write_vector(personal, personal_copies)
        outputs = outputs_of(x)
        if personal is not None and len(personal_copies) == 1:
            return outputs[0]
        return mixture_probabilities(outputs, rule.prediction_weights(omega.to(outputs.device)))
    finally:
        if personal is not None:
            copies.load(snapshot)


def personal_prediction(
    module: TrainingHost, client: int, x: Tensor, log_label_stats: Tensor | None, snapshot: Snapshot
) -> Tensor:
    """Participating client's prediction on x from its personal model(s) (``client_prediction``),
    or from the cluster models fine-tuned on its training data (FedRC-FT); the working copies are
    restored to ``snapshot`` (the global weights) afterwards."""
    assert module.client_state is not None
    omega = module.client_state.omega[client].to(module.device)
    personal = module.client_state.personal.get(client) if module.rule.capabilities.personal_models else None
    if personal is not None or not module.finetune_epochs:
        occupied = client_vectors.personal_copies(module.rule, module.num_clusters)
        outputs_of = lambda rows: module.evaluate_clusters(rows)[1]  # noqa: E731
        return client_prediction(
            module.rule, module.copies, outputs_of, x, omega, personal, occupied, snapshot
        )
    try:
        omega = finetune(module, client, module.finetune_epochs, log_label_stats)
        return mixture_prediction(module, x, omega)
    finally:
        module.copies.load(snapshot)


class Evaluation:
    """One validation or test pass: sums [2 + 2G] = (local score, local count, then score and
    count of each of the G global clients), reduced over processes at the end."""

    def __init__(self, module: TrainingHost, stage: str) -> None:
        dm = module.trainer.datamodule
        self.stage = stage
        self.undefined: dict[str, str] = {}  # why each metric would be NaN (set by ``metrics``)
        self.sums = torch.zeros(2 + 2 * dm.num_global_clients, dtype=torch.float64, device=module.device)
        self.log_label_stats = module.current_label_stats()
        self.snapshot = module.copies.snapshot()
        device = module.device
        self.rows = {
            part: (x.to(device), y.to(device), offsets)
            for part in ("local", "global_adapt", "global_score")
            for x, y, offsets in [dm.evaluation_split(stage, part)]
        }

    def client_rows(self, part: str, index: int) -> tuple[Tensor, Tensor]:
        x, y, offsets = self.rows[part]
        start, stop = int(offsets[index]), int(offsets[index + 1])
        return x[start:stop], y[start:stop]

    def local_chunk(self, module: TrainingHost, clients: list[int]) -> None:
        """Score consecutive participating clients on their test rows."""
        x_all, y_all, offsets = self.rows["local"]
        y = y_all[int(offsets[clients[0]]) : int(offsets[clients[-1] + 1])]
        self.add(0, self.local_prediction(module, clients), y, module.task)

    def local_prediction(self, module: TrainingHost, clients: list[int]) -> Tensor:
        """The predictions [N, C] (or [N, D]) of consecutive participating clients on their rows of
        the stage: each client's mixture of the cluster models with its own ω, or its personal model."""
        assert module.client_state is not None
        if predicts_per_client(module):
            rows = [self.client_rows("local", client)[0] for client in clients]
            predictions = [
                personal_prediction(module, client, x, self.log_label_stats, self.snapshot)
                for client, x in zip(clients, rows, strict=True)
            ]
            return torch.cat(predictions)
        x_all, _, offsets = self.rows["local"]
        x = x_all[int(offsets[clients[0]]) : int(offsets[clients[-1] + 1])]
        sizes = (offsets[torch.tensor(clients) + 1] - offsets[torch.tensor(clients)]).to(module.device)
        owner = torch.arange(len(clients), device=module.device).repeat_interleave(sizes)
        return mixture_prediction(module, x, module.client_state.omega[clients], owner)

    def global_client(self, module: TrainingHost, index: int) -> None:
        """An unseen client: ω from its adapt rows by the rule, then scored on its other rows (none:
        nothing is scored, and its metric is undefined)."""
        if not self.client_rows("global_score", index)[0].shape[0]:
            return
        _, prediction = self.global_prediction(module, index)
        self.add(2 + 2 * index, prediction, self.client_rows("global_score", index)[1], module.task)

    def global_prediction(self, module: TrainingHost, index: int) -> tuple[Tensor, Tensor]:
        """An unseen client's ω [K], fitted by the rule on its adapt rows, and its predictions on
        its score rows. A client with no adapt rows (one row in this stage: it is scored) adapts
        on nothing: it gets the mixture prior, as a client without labels does."""
        assert module.client_state is not None
        x, y = self.client_rows("global_adapt", index)
        if x.shape[0]:
            losses, _ = module.evaluate_clusters(x, y)
            active = module.client_state.active.to(module.device)
            omega = module.rule.unseen_client_mixture(losses, y, self.log_label_stats, active)
        else:
            omega = module.mixture_prior()
        x, _ = self.client_rows("global_score", index)
        return omega, mixture_prediction(module, x, omega)

    def add(self, slot: int, prediction: Tensor, y: Tensor, task: Task) -> None:
        self.sums[slot] += score(prediction, y, task)
        self.sums[slot + 1] += float(y.shape[0])

    def metrics(self, module: TrainingHost, stage: str) -> dict[str, float]:
        """Sum over processes and turn the sums into the stage's metrics: local, the mean over the
        global clients, and the mean over each true concept's global clients. A metric with
        nothing to score is NaN, never a made-up 0 (a global client without score rows is left
        out of the means); ``undefined`` says why each NaN is one."""
        assert module.client_state is not None
        sums = module.reduce_sum(self.sums).cpu()
        dm = module.trainer.datamodule
        metric = module.task.metric
        counts = sums[1::2]
        values = (sums[0::2] / counts).tolist()  # NaN where nothing was scored (0 / 0)
        concepts = dm.metadata.global_concept.tolist()
        scored = [g for g in range(len(concepts)) if counts[g + 1] > 0]
        state = module.client_state
        metrics = {
            f"{stage}/local_{metric}": values[0],
            f"{stage}/global_{metric}": _mean(values[g + 1] for g in scored),
            f"{stage}/concept_ari": concept_ari(state.omega, dm.metadata.concept, state.seen),
        }
        for concept in sorted(set(concepts)):
            members = [g for g in scored if concepts[g] == concept]
            metrics[f"{stage}/global_{metric}_concept{concept}"] = _mean(values[g + 1] for g in members)
        seen_concepts = int(dm.metadata.concept.cpu()[state.seen.cpu()].unique().numel())
        self.undefined = undefined_causes(
            stage, metric, counts, int(state.seen.sum()), seen_concepts, concepts
        )
        return metrics


def _mean(values: Iterable[float]) -> float:
    listed = list(values)
    return sum(listed) / len(listed) if listed else math.nan


def undefined_causes(
    stage: str, metric: str, counts: Tensor, seen: int, seen_concepts: int, concepts: list[int]
) -> dict[str, str]:
    """Why each of the stage's metrics would be NaN, keyed by metric name: ``counts`` [1 + G] are
    the rows scored (participating clients, then each global client), ``seen`` the clients that
    took part in training and ``seen_concepts`` their distinct true concepts, ``concepts`` [G] the
    global clients' true concepts."""
    split = "validation" if stage == "val" else "test"
    if seen < 2:
        ari = (
            f"it needs at least two clients that took part in training, {seen} did (from the first round on)"
        )
    elif seen_concepts < 2:
        ari = "the clients that took part all have one true concept: no grouping to recover (concepts=1)"
    else:
        ari = NOT_FINITE
    causes = {
        f"{stage}/local_{metric}": f"no participating client has {split} rows (raise test_fraction, or "
        "give the clients held-out rows)",
        f"{stage}/concept_ari": ari,
        f"{stage}/global_{metric}": "the datamodule has no global (unseen) test clients (give global_test)"
        if not concepts
        else f"no global client has {split} rows to score (give each at least 2 rows)",
    }
    for concept in sorted(set(concepts)):
        empty = [g for g, c in enumerate(concepts) if c == concept and counts[g + 1] == 0]
        if empty:
            causes[f"{stage}/global_{metric}_concept{concept}"] = (
                f"global client(s) {empty} have no {split} rows to score (a global client's rows are "
                "split into validation and test, each into adapt and score rows; with the default "
                "shares 2 rows are scored in both, 4 adapt and score in both)"
            )
    return causes


class Evaluator:
    """The validation and test passes of a host (a component the ClusteredModule holds): one
    ``Evaluation`` per pass, one chunk of clients (or one unseen client) per step, the metrics
    logged at the end through ``log`` (``LightningModule.log``)."""

    def __init__(self) -> None:
        self.current: Evaluation | None = None

    def start(self, host: TrainingHost, stage: str) -> None:
        if stage == "test":
            warn_if_untrained(host)
        self.current = Evaluation(host, stage)

    def step(self, host: TrainingHost, item: EvaluationChunk) -> None:
        assert self.current is not None
        with host.timed("evaluation"):
            if item.global_index >= 0:
                self.current.global_client(host, item.global_index)
            elif item.clients.numel():
                self.current.local_chunk(host, item.clients.tolist())

    def finish(self, host: TrainingHost, stage: str, log: Callable[..., None]) -> dict[str, float]:
        """The pass's metrics, logged (and returned)."""
        assert self.current is not None
        metrics = self.current.metrics(host, stage)
        if not host.trainer.sanity_checking:  # the sanity check's metrics are not logged
            warn_nan_metrics(metrics, self.current.undefined)
        self.current = None
        metric = host.task.metric
        # During a fit the ClusterMonitor logs validation with the round as its step; a test pass or
        # a trainer.validate() logs (and returns) its metrics through Lightning (None: no warning).
        trainer = attached_trainer(host)
        fitting = trainer is not None and trainer.state.fn == TrainerFn.FITTING
        for name, value in metrics.items():
            log(
                name,
                value,
                logger=False if fitting else None,
                batch_size=1,
                sync_dist=True,
                prog_bar=name.endswith((f"local_{metric}", f"global_{metric}")),
            )
        if not fitting:  # Lightning's public way to give the loggers a step: the round, as for
            # every other scalar of the run (ClusterMonitor); global_step counts rounds too
            log("step", float(host.rounds_trained), batch_size=1, sync_dist=True)
        return metrics


def warn_if_untrained(host: TrainingHost) -> None:
    """Warn when a test pass scores models no client has trained yet (``trainer.test`` before
    ``fit``, or after a fit with ``max_epochs=0``): the initial weights under uniform ω. Predicting
    warns likewise (``prediction.py``)."""
    state = host.client_state
    if state is not None and not bool(state.seen.any()):
        rank_zero_warn(
            "testing models that no client has trained yet (trainer.test before trainer.fit, or a fit "
            "with max_epochs=0): the scores are those of the initial weights with uniform cluster "
            "weights ω. Fit first (max_epochs >= 1), or pass ckpt_path= of a trained run"
        )
