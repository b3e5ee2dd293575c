"""ClusteredModule: K cluster copies of the user's LightningModule, trained as federated clients.

The module runs the one client loop every algorithm shares. Each work item of the round loader
is one local step of one client. On a client's first step the working copies are reset to the
global weights and the client's E-step runs (one no-grad pass that also gives the training
metrics); the algorithm's rule then says which copies the client trains, with which sample
weights and proximal anchors. Each step trains on a weighted minibatch; on the last step the
client's updates go into the clusters the rule names. After the round's last item the updates of
all processes are summed and applied in one all-reduce, so validation and checkpoints always
see aggregated weights. The rules are plain-tensor objects from ``lightning_fedcluster.algorithms``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lightning_fedcluster.algorithms.aggregation import accumulate_delta, apply_weighted_update
from lightning_fedcluster.algorithms.base import Algorithm, ClientContext, ClientReport, LocalPlan
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.mixture import mixture_probabilities
from lightning_fedcluster.algorithms.round_buffer import RoundBuffer
from lightning_fedcluster.algorithms.schedule import check_positive_int, check_seed, derive_seed
from lightning_fedcluster.cluster_copies import (
    first_optimizer,
    independent_copies,
    state_tensors_of,
    tie_shared_layers,
)
from lightning_fedcluster.datamodules.loaders import GLOBAL, NO_CLIENT
from lightning_fedcluster.executor import VectorizedExecutor, choose_executor, chunk_size_for
from lightning_fedcluster.metrics.clustering import concept_ari

CHECKPOINT_KEY = "fedcluster_client_state"
# Cumulative wall time per engine phase, in ``ClusteredModule.phase_seconds``.
PHASES = ("e_step", "local_training", "aggregation", "evaluation")


@dataclass
class _ClientRun:
    """The client being simulated now: its data, E-step report, plan and minibatch order."""

    client: int
    slot: int
    x: Tensor
    y: Tensor
    context: ClientContext
    report: ClientReport
    plan: LocalPlan
    sample_weights: Tensor | None  # [N, len(plan.clusters)] float32
    order: Tensor  # permutation of the client's samples
    trained: tuple[int, ...] = ()  # the plan's copies with positive total weight


def _trained_copies(plan: LocalPlan, weights: Tensor | None) -> tuple[int, ...]:
    """The plan's copies that train: a soft cluster with zero total weight on this client does not."""
    if weights is None:
        return plan.clusters
    totals = weights.sum(0).tolist()
    return tuple(k for s, k in enumerate(plan.clusters) if totals[s] > 0)


@dataclass
class ClientPredictor:
    """A client's mixture weights ω [K] and its predictor p(y|x) (or ŷ for regression)."""

    omega: Tensor
    module: ClusteredModule

    def predict_proba(self, x: Tensor) -> Tensor:
        return self.module.predict_proba(x, self.omega)

    def predict(self, x: Tensor) -> Tensor:
        out = self.predict_proba(x)
        return out.argmax(1) if self.module.task == "classification" else out


class ClusteredModule(pl.LightningModule):
    """K copies of ``module`` (whose ``forward`` returns logits, or predictions for regression)
    trained federatedly.

    The per-sample loss is ``module.per_sample_loss(batch)`` if defined, else ``module.criterion``
    (its reduction is switched to ``"none"``), else cross-entropy (classification) or the squared
    error averaged over output dimensions (regression). The optimizer comes from
    ``module.configure_optimizers()`` and is the local solver of every client.

    Args:
        module: the user's LightningModule (reused unchanged; copied K times).
        num_clusters: K.
        seed: seeds the independent initialisation of the copies.
        eval_batch_size: batch size of the no-grad E-step and evaluation passes.
        shared_layers: dotted names of submodules shared by all K copies (one feature extractor,
            K clustered heads; FedRC Table 11). Shared layers are averaged over all clients.
    """

    def __init__(
        self,
        module: nn.Module,
        num_clusters: int = 1,
        *,
        seed: int = 0,
        eval_batch_size: int = 4096,
        shared_layers: Sequence[str] = (),
    ) -> None:
        super().__init__()
        check_positive_int("num_clusters", num_clusters)
        check_seed(seed)
        if not isinstance(module, pl.LightningModule):
            raise TypeError(
                f"module must be a LightningModule (with forward and configure_optimizers), got "
                f"{type(module).__name__}"
            )
        if eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be >= 1, got {eval_batch_size}")
        if isinstance(shared_layers, str):
            shared_layers = (shared_layers,)
        self.automatic_optimization = False
        self.seed = seed
        self.eval_batch_size = eval_batch_size
        self.shared_layers = tuple(shared_layers)
        copies = independent_copies(module, num_clusters, seed)
        shared = tie_shared_layers(copies, self.shared_layers) if self.shared_layers else []
        self.models = nn.ModuleList(copies)
        self._shared_ids = {id(t) for t in shared}
        self.client_state: ClientState | None = None
        self.round_metrics: dict[str, float] = {}
        self.eval_metrics: dict[str, float] = {}
        self._pending_state: dict[str, Tensor] | None = None
        self._resident: dict[str, Tensor] | None = None
        self._log_label_stats: Tensor | None = None
        self._run: _ClientRun | None = None
        self.phase_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.task = "classification"
        self.executor = "loop"  # resolved from the strategy's ``executor`` when fitting starts
        self._vectorized: VectorizedExecutor | None = None

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        """Add the wall time of the block to ``phase_seconds[phase]`` (for benchmarks' breakdowns)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.phase_seconds[phase] += time.perf_counter() - start

    @property
    def num_clusters(self) -> int:
        return len(self.models)

    # ------------------------------------------------------------------ federated tensors
    def cluster_tensors(self, k: int) -> list[Tensor]:
        """The federated tensors of cluster k (parameters and float buffers), shared layers excluded."""
        return [t for t in state_tensors_of(self.models[k]) if id(t) not in self._shared_ids]

    def shared_tensors(self) -> list[Tensor]:
        """The federated tensors of the shared layers (empty without ``shared_layers``)."""
        return [t for t in state_tensors_of(self.models[0]) if id(t) in self._shared_ids]

    def _num_params(self, k: int) -> int:
        """How many of ``cluster_tensors(k)`` are parameters (they come first)."""
        return sum(1 for p in self.models[k].parameters() if id(p) not in self._shared_ids)

    # ------------------------------------------------------------------ setup and validation
    def setup(self, stage: str) -> None:
        from lightning_fedcluster.datamodules.federated import FederatedDataModule
        from lightning_fedcluster.strategies.federated import FederatedStrategy

        strategy, datamodule = self.trainer.strategy, self.trainer.datamodule
        if not isinstance(strategy, FederatedStrategy):
            raise TypeError(
                f"ClusteredModule trains under a federated strategy, got {type(strategy).__name__}: "
                "pass e.g. Trainer(strategy=FedRCStrategy(num_clusters=3))"
            )
        if not isinstance(datamodule, FederatedDataModule):
            raise TypeError(
                "ClusteredModule needs a FederatedDataModule: call trainer.fit(module, datamodule=dm) "
                "with dm built by FederatedDataModule.from_tensors(...) or e.g. DigitsFederated()"
            )
        if strategy.num_clusters != self.num_clusters:
            raise ValueError(
                f"the strategy has num_clusters={strategy.num_clusters} but the ClusteredModule holds "
                f"{self.num_clusters} cluster models: make them agree"
            )
        self.task = getattr(datamodule, "task", "classification")
        self.rule: Algorithm = strategy.algorithm
        if self.task == "regression" and self.rule.uses_label_stats:
            raise ValueError(
                f"{type(strategy).__name__} uses label statistics C_(y,k), which need class labels, but the "
                "datamodule is a regression task: use FedEMStrategy (FedRC without C) for regression"
            )
        strategy.check_datamodule(datamodule)
        self._check_output_shape(datamodule)
        if stage == "fit":
            strategy.chunk_size = None
            strategy.round_schedule(datamodule)  # validates clients_per_round before training
            x, y = datamodule.train_split(0)
            self.executor = choose_executor(strategy.executor, self, x, y)
            if self.executor == "vectorized":
                strategy.chunk_size = chunk_size_for(self, strategy.clients_per_chunk)
            self._vectorized = None
        shape = (datamodule.num_clients, self.num_state_classes, self.num_clusters)
        state = self.client_state
        if state is None or (state.num_clients, state.label_sums.shape[1], state.num_clusters) != shape:
            self.client_state = ClientState.initial(*shape)
            self.client_state.extra.update(
                self.rule.initial_extra(datamodule.num_clients, int(datamodule.train_sizes.sum()))
            )
            self.client_state.active = self.rule.initial_active()
        if self._pending_state is not None:
            self.client_state.load_state_dict(self._pending_state)
            self._pending_state = None
        self._resident = None

    @property
    def num_state_classes(self) -> int:
        """Rows of the label statistics: the class count, 0 for regression."""
        return self.trainer.datamodule.num_classes if self.task == "classification" else 0

    def _check_output_shape(self, datamodule: Any) -> None:
        x, y = datamodule.train_split(0)
        model = self.models[0]
        was_training = model.training
        model.eval()
        with torch.no_grad():
            out = model(x[:2].to(self.device))
        model.train(was_training)
        if self.task == "regression":
            expected = tuple(y[:2].shape)
            if not isinstance(out, Tensor) or out.shape[0] != expected[0] or out[0].numel() != y[0].numel():
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise ValueError(
                    f"{type(model).__name__}.forward must return predictions shaped like the targets "
                    f"{expected} (per sample {tuple(y.shape[1:])}), got {got}: set the model's output size"
                )
            return
        if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[1] != datamodule.num_classes:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"{type(model).__name__}.forward must return logits of shape [batch, num_classes] = "
                f"[batch, {datamodule.num_classes}] for this datamodule, got {got}: set the model's "
                "output size to the datamodule's num_classes"
            )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """One optimizer over all K copies (so global_step counts local steps), built from the
        user's own configure_optimizers; shared layers appear once."""
        groups: list[dict[str, Any]] = []
        template: torch.optim.Optimizer | None = None
        seen: set[int] = set()
        for model in self.models:
            owner = type(model).__name__
            if type(model).configure_optimizers is pl.LightningModule.configure_optimizers:
                raise TypeError(
                    f"{owner} must define configure_optimizers: it is every client's local solver"
                )
            template = first_optimizer(model.configure_optimizers(), owner)
            for group in template.param_groups:
                params = [p for p in group["params"] if id(p) not in seen]
                seen.update(id(p) for p in params)
                if params:
                    groups.append({**group, "params": params})
        assert template is not None
        return type(template)(groups, **template.defaults)

    # ------------------------------------------------------------------ data and losses
    @property
    def data(self) -> dict[str, Tensor]:
        """The datamodule's tensors, resident on this module's device (moved once)."""
        if self._resident is None or self._resident["train_x"].device != self.device:
            dm = self.trainer.datamodule
            names = ("train_x", "train_y", "test_x", "test_y", "global_x", "global_y")
            self._resident = {n: getattr(dm, n).to(self.device) for n in names}
            offsets = ("train_offsets", "test_offsets", "global_offsets")
            self._resident.update({n: getattr(dm, n) for n in offsets})
        return self._resident

    def _split(self, name: str, index: int) -> tuple[Tensor, Tensor]:
        offsets = self.data[f"{name}_offsets"]
        start, stop = int(offsets[index]), int(offsets[index + 1])
        return self.data[f"{name}_x"][start:stop], self.data[f"{name}_y"][start:stop]

    def per_sample_loss(self, k: int, x: Tensor, y: Tensor, out: Tensor | None = None) -> Tensor:
        """Loss of every sample under cluster model k, shape [N]."""
        model = self.models[k]
        custom = getattr(model, "per_sample_loss", None)
        if callable(custom):
            loss = custom((x, y))
        else:
            out = model(x) if out is None else out
            criterion = getattr(model, "criterion", None)
            if criterion is not None:
                if isinstance(getattr(criterion, "reduction", None), str) and criterion.reduction != "none":
                    criterion = copy.copy(criterion)
                    criterion.reduction = "none"
                loss = criterion(out, y)
                if loss.dim() > 1:
                    loss = loss.reshape(loss.shape[0], -1).mean(1)
            elif self.task == "regression":
                loss = (out.reshape(y.shape) - y).square().reshape(y.shape[0], -1).mean(1)
            else:
                loss = F.cross_entropy(out, y, reduction="none")
        if loss.shape != y.shape[:1]:
            raise ValueError(
                f"the per-sample loss of {type(model).__name__} must have shape [batch] = [{y.shape[0]}], "
                f"got {tuple(loss.shape)}: return unreduced losses"
            )
        return loss

    def _outputs(self, raw: Tensor, y_like: Tensor | None) -> Tensor:
        """Class probabilities (classification) or predictions shaped [N, D] (regression)."""
        if self.task == "regression":
            return raw.reshape(raw.shape[0], -1).float()
        return torch.softmax(raw.float(), dim=1)

    @torch.no_grad()
    def evaluate_clusters(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
        """One no-grad pass of every cluster model over x in large batches, in eval mode.

        Returns per-sample losses [N, K] (None when no labels are given: prediction only) and
        outputs [K, N, C] (class probabilities) or [K, N, D] (regression predictions).
        """
        losses, outputs = [], []
        for k, model in enumerate(self.models):
            was_training = model.training
            model.eval()
            loss_k, out_k = [], []
            for start in range(0, x.shape[0], self.eval_batch_size):
                stop = start + self.eval_batch_size
                xb = x[start:stop]
                raw = model(xb)
                if y is not None:
                    loss_k.append(self.per_sample_loss(k, xb, y[start:stop], raw))
                out_k.append(self._outputs(raw, y))
            model.train(was_training)
            if y is not None:
                losses.append(torch.cat(loss_k))
            outputs.append(torch.cat(out_k))
        return (torch.stack(losses, dim=1) if y is not None else None), torch.stack(outputs)

    def forward(self, x: Tensor) -> Tensor:
        """Outputs of every cluster model, shape [K, N, ...]."""
        return torch.stack([model(x) for model in self.models])

    # ------------------------------------------------------------------ new clients
    @torch.no_grad()
    def adapt(self, x: Tensor, y: Tensor) -> Tensor:
        """Mixture weights ω [K] of a client that took no part in training, from its labelled
        data (the algorithm's rule: iterated E-step, lowest loss, ...); the models are not changed."""
        losses, _ = self.evaluate_clusters(x.to(self.device), y.to(self.device))
        assert self.client_state is not None
        return self.rule.unseen_client_mixture(
            losses, y.to(self.device), self._current_label_stats(), self.client_state.active.to(self.device)
        )

    def new_client(self, x: Tensor, y: Tensor) -> ClientPredictor:
        """A predictor for a new client from its labelled data, without training the cluster models."""
        return ClientPredictor(omega=self.adapt(x, y), module=self)

    @torch.no_grad()
    def predict_proba(self, x: Tensor, omega: Tensor) -> Tensor:
        """p(y|x) (or the mixture prediction, regression) of a client with mixture weights ω."""
        _, outputs = self.evaluate_clusters(x.to(self.device))
        return mixture_probabilities(outputs, self.rule.prediction_weights(omega.to(self.device)))

    def _current_label_stats(self) -> Tensor | None:
        assert self.client_state is not None
        stats = self.rule.log_label_stats(self.client_state)
        return None if stats is None else stats.to(self.device)

    # ------------------------------------------------------------------ one round
    def on_fit_start(self) -> None:
        self._prepare_round(self.trainer.current_epoch)

    def _prepare_round(self, round_index: int) -> None:
        """Server work that must happen before a round's clients are chosen (FedSoft's estimation)."""
        if self.rule.needs_estimation(round_index, self.client_state):
            self._estimate_importance(round_index)

    def on_train_epoch_start(self) -> None:
        """Round start: snapshot the global weights and allocate the round's report buffer."""
        assert self.client_state is not None
        dm = self.trainer.datamodule
        self._global = [
            [t.detach().clone() for t in self.cluster_tensors(k)] for k in range(self.num_clusters)
        ]
        self._global_shared = [t.detach().clone() for t in self.shared_tensors()]
        self._delta_sum = [[torch.zeros_like(t, dtype=torch.float64) for t in g] for g in self._global]
        self._delta_shared = [torch.zeros_like(t, dtype=torch.float64) for t in self._global_shared]
        round_index = self.trainer.current_epoch
        clients = self.trainer.strategy.round_schedule(dm).clients(round_index)
        self._round_clients = clients
        self._membership = self.rule.round_membership(
            round_index, self.client_state, dm.train_sizes, self.trainer.strategy.seed
        )
        n, c, k = len(clients), self.num_state_classes, self.num_clusters
        sizes = dm.train_sizes[clients]
        self._sample_offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        shapes: dict[str, tuple[int, ...]] = {
            "omega": (n, k),
            "label_sums": (n, c, k),
            "reported": (n,),
            "weights": (k + 1,),
            "metrics": (3,),
        }
        for name, value in self.client_state.extra.items():
            per_sample = self.rule.per_sample_state and name in self.rule.per_sample_state
            rows = int(self._sample_offsets[-1]) if per_sample else n
            if name in self.rule.client_reported_state():
                shapes[f"extra.{name}"] = (rows, *value.shape[1:])
        self._round_report = RoundBuffer(shapes, self.device)
        vector_size = self._vector_size()
        self._round_vectors = (
            RoundBuffer({"vectors": (n, vector_size)}, self.device, torch.float32) if vector_size else None
        )
        self._log_label_stats = self._current_label_stats()

    def _vector_size(self) -> int:
        """Per-client flat model vectors this round needs (personal models, CFL updates)."""
        if self.rule.keeps_personal_models:
            return sum(t.numel() for k in self._personal_copies() for t in self._global[k])
        if self.rule.needs_update_vectors or self.rule.wants_model_vectors(self.client_state):
            return sum(t.numel() for t in self._global[0])
        return 0

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if batch["client"] == NO_CLIENT:
            return None
        if "clients" in batch:  # a chunk of clients (vectorised executor)
            if self._vectorized is None:
                self._vectorized = VectorizedExecutor(self)
            self._vectorized.run_chunk(self, batch)
            return None
        if batch["step"] == 0:
            with self._timed("e_step"):
                self._start_client(batch)
        with self._timed("local_training"):
            self._local_step(batch)
        if batch["step"] == batch["num_steps"] - 1:
            with self._timed("aggregation"):
                self._finish_client()
        return None

    def _client_context(self, client: int, round_index: int, num_samples: int) -> ClientContext:
        assert self.client_state is not None
        state = self.client_state
        extra = {}
        for name, value in state.extra.items():
            if self.rule.per_sample_state and name in self.rule.per_sample_state:
                start, stop = (int(v) for v in self.trainer.datamodule.train_offsets[client : client + 2])
                extra[name] = value[start:stop].to(self.device)
            elif value.dim() > 0 and value.shape[0] == state.num_clients:
                extra[name] = value[client].to(self.device)
            elif value.dim() == 0:
                extra[name] = value
        if self._membership is not None:
            extra["selected"] = self._membership[client]
        return ClientContext(
            client=client,
            round_index=round_index,
            num_samples=num_samples,
            num_classes=self.num_state_classes,
            omega=state.omega[client].to(self.device),
            active=state.active.to(self.device),
            seen=bool(state.seen[client]),
            seed_parts=(self.seed, round_index, client, 0x7015E),
            extra=extra,
        )

    def _start_client(self, item: dict[str, int]) -> None:
        assert self.client_state is not None
        client, round_index = item["client"], item["round"]
        torch.manual_seed(derive_seed(self.seed, round_index, client))  # dropout etc.: rank-independent
        self._load_global()
        self.optimizers().optimizer.state.clear()
        x, y = self._split("train", client)
        losses, outputs = self.evaluate_clusters(x, y)
        if not bool(torch.isfinite(losses).all()):
            self._fail(round_index, client, "in its E-step pass")
        context = self._client_context(client, round_index, x.shape[0])
        report = self.rule.e_step(losses, y, context, self._log_label_stats)
        plan = self.rule.local_plan(report, context)
        weights = None if plan.sample_weights is None else plan.sample_weights.to(torch.float32)
        if plan.from_personal:
            self._load_personal(client, context)
        generator = torch.Generator().manual_seed(derive_seed(self.seed, round_index, client, 0xBA7C))
        self._run = _ClientRun(
            client=client,
            slot=item["slot"],
            x=x,
            y=y,
            context=context,
            report=report,
            plan=plan,
            sample_weights=weights,
            order=torch.randperm(x.shape[0], generator=generator).to(self.device),
            trained=_trained_copies(plan, weights),
        )
        self._add_train_metrics(outputs, y, self.rule.prediction_weights(report.omega))

    def _load_global(self) -> None:
        self._load_snapshot(self._global, self._global_shared)

    def _load_snapshot(self, clusters: list[list[Tensor]], shared: list[Tensor]) -> None:
        """Copy a snapshot of every cluster's (and the shared layers') tensors into the working copies."""
        with torch.no_grad():
            for k in range(self.num_clusters):
                for t, g in zip(self.cluster_tensors(k), clusters[k], strict=True):
                    t.copy_(g)
            for t, g in zip(self.shared_tensors(), shared, strict=True):
                t.copy_(g)

    def _personal_copies(self) -> range:
        """The working copies a personal model occupies: copy 0 (FedSoft) or all K (D-FedEM)."""
        return range(self.rule.personal_copies if self.rule.personal_copies else self.num_clusters)

    def _write_vector(self, vector: Tensor, copies: range) -> None:
        """Copy a flat vector (personal model) into the working copies, tensor by tensor, in place."""
        offset = 0
        with torch.no_grad():
            for k in copies:
                for t in self.cluster_tensors(k):
                    t.copy_(vector[offset : offset + t.numel()].view_as(t).to(t))
                    offset += t.numel()

    def _read_vector(self, copies: range) -> Tensor:
        return torch.cat([t.detach().flatten().float() for k in copies for t in self.cluster_tensors(k)])

    def _load_personal(self, client: int, context: ClientContext) -> None:
        """The trained copies start from the client's personal model(s), kept on the CPU; the first
        time, from the global model(s) the rule picks."""
        assert self.client_state is not None
        stored = self.client_state.personal.get(client)
        if stored is not None:
            self._write_vector(stored, self._personal_copies())
            return
        with torch.no_grad():
            for k in self._personal_copies():
                source = self._global[
                    self.rule.initial_personal_cluster(context) if len(self._personal_copies()) == 1 else k
                ]
                for t, g in zip(self.cluster_tensors(k), source, strict=True):
                    t.copy_(g)

    def _add_train_metrics(self, outputs: Tensor, y: Tensor, weights: Tensor) -> None:
        """Add the training loss/accuracy of the mixture prediction with ``weights`` ([K] for one
        client, or [N, K] per sample) to the round's metrics."""
        mixture = mixture_probabilities(outputs.double(), weights)
        if self.task == "regression":
            error = (mixture - y.reshape(y.shape[0], -1).double()).square().mean(1).sum()
            values = [error, error]
        else:
            likelihood = mixture.gather(1, y.unsqueeze(1)).squeeze(1).clamp_min(1e-300)
            values = [-likelihood.log().sum(), (mixture.argmax(1) == y).sum().double()]
        count = torch.tensor(float(y.shape[0]), dtype=torch.float64, device=self.device)
        self._round_report["metrics"].add_(torch.stack([*values, count]))

    def _local_step(self, item: dict[str, int]) -> None:
        run = self._run
        assert run is not None and run.client == item["client"]
        n = run.x.shape[0]
        size = min(self.trainer.datamodule.batch_size, n)
        positions = (item["step"] * size + torch.arange(size, device=self.device)) % n
        index = run.order[positions]
        x, y = run.x[index], run.y[index]
        weights = None if run.sample_weights is None else run.sample_weights[index]
        optimizer = self.optimizers()
        optimizer.zero_grad()
        total = self._plan_loss(run.plan, run.trained, x, y, weights, size, proximal=True)
        if not bool(torch.isfinite(total)):
            self._fail(item["round"], run.client, f"at local step {item['step']}")
        self.manual_backward(total)
        optimizer.step()

    def _plan_loss(
        self,
        plan: LocalPlan,
        trained: Sequence[int],
        x: Tensor,
        y: Tensor,
        weights: Tensor | None,
        size: int,
        proximal: bool,
    ) -> Tensor:
        """The local objective on one minibatch: Σ over the trained copies k of
        (1/B) Σ_j w_jk f(x_j, y_j; θ_k), plus their proximal terms when ``proximal``."""
        total = torch.zeros((), device=self.device)
        for s, k in enumerate(plan.clusters):
            if k not in trained:
                continue
            loss = self.per_sample_loss(k, x, y)
            total = total + (loss if weights is None else weights[:, s] * loss).sum() / size
            if proximal and plan.proximal:
                total = total + self._proximal_term(k, plan.proximal[s])
        return total

    def _proximal_term(self, k: int, anchors: Sequence[tuple[int, float]]) -> Tensor:
        """Σ (c/2)‖w_k − θ_anchor‖² over the parameters of working copy k."""
        params = self.cluster_tensors(k)[: self._num_params(k)]
        total = torch.zeros((), device=self.device)
        for anchor, coefficient in anchors:
            if coefficient == 0:
                continue
            reference = self._global[anchor][: len(params)]
            squared = sum(((p - r).square().sum() for p, r in zip(params, reference, strict=True)), total)
            total = total + 0.5 * coefficient * squared
        return total

    def _finish_client(self) -> None:
        run = self._run
        assert run is not None
        report = run.report
        if self.rule.needs_model_distances:
            report = self.rule.reassign(report, self._distances(run.plan.clusters[0]), run.context)
        trained = set(run.trained)
        contributions = [
            c for c in self.rule.contributions(report, run.plan, run.context) if c.source in trained
        ]
        weights = self._round_report["weights"]
        for contribution in contributions:
            if contribution.weight > 0:
                accumulate_delta(
                    self._delta_sum[contribution.target],
                    self.cluster_tensors(contribution.source),
                    self._global[contribution.target],
                    contribution.weight,
                )
                weights[contribution.target] += contribution.weight
        if self._delta_shared and contributions:
            accumulate_delta(
                self._delta_shared, self.shared_tensors(), self._global_shared, float(run.x.shape[0])
            )
            weights[-1] += float(run.x.shape[0])
        self._record_report(run, report)
        self._run = None

    def _distances(self, k: int) -> Tensor:
        """‖g − G_j‖² between the trained copy k's representation and every global model j."""
        names = [n for n, p in self.models[k].named_parameters() if id(p) not in self._shared_ids]
        keep = self.rule.representation_mask(names)
        local = self.cluster_tensors(k)[: len(names)]
        distances = torch.zeros(self.num_clusters, dtype=torch.float64)
        for j in range(self.num_clusters):
            reference = self._global[j][: len(names)]
            distances[j] = sum(
                float((p.detach() - r).double().square().sum())
                for p, r, use in zip(local, reference, keep, strict=True)
                if use
            )
        return distances

    def _record_report(self, run: _ClientRun, report: ClientReport) -> None:
        slot, buffer = run.slot, self._round_report
        buffer["omega"][slot] = report.omega
        buffer["label_sums"][slot] = report.label_sums
        buffer["reported"][slot] = 1.0
        self._record_client_state(run)

    def _record_client_state(self, run: _ClientRun) -> None:
        """The client's algorithm state (FedRC-Adam's γ and moments) and model vector for the server."""
        slot, buffer = run.slot, self._round_report
        start, stop = int(self._sample_offsets[slot]), int(self._sample_offsets[slot + 1])
        for name in self.rule.client_reported_state():
            if f"extra.{name}" not in buffer or name not in run.context.extra:
                continue
            value = run.context.extra[name].to(torch.float64)
            if self.rule.per_sample_state and name in self.rule.per_sample_state:
                buffer[f"extra.{name}"][start:stop] = value
            else:
                buffer[f"extra.{name}"][slot] = value
        if self._round_vectors is not None:
            copies = (
                self._personal_copies()
                if self.rule.keeps_personal_models
                else range(run.plan.clusters[0], run.plan.clusters[0] + 1)
            )
            local = self._read_vector(copies)
            if self.rule.needs_update_vectors:
                reference = torch.cat([g.flatten().float() for g in self._global[run.plan.clusters[0]]])
                local = local - reference
            self._round_vectors["vectors"][slot] = local

    def _fail(self, round_index: int, client: int, where: str) -> None:
        raise FloatingPointError(
            f"non-finite loss in round {round_index} at client {client} {where}: lower the learning "
            f"rate or check client {client}'s data for NaN/inf"
        )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.trainer.is_last_batch:
            with self._timed("aggregation"):
                self._end_round()
            next_round, last = self.trainer.current_epoch + 1, self.trainer.max_epochs
            if last is None or last < 0 or next_round < last:
                self._prepare_round(next_round)

    def _end_round(self) -> None:
        """Sum every process's client updates, apply them, and refresh the client store."""
        assert self.client_state is not None
        strategy = self.trainer.strategy
        flat = [t.flatten() for deltas in self._delta_sum for t in deltas] + [
            t.flatten() for t in self._delta_shared
        ]
        sizes = [t.numel() for t in flat] + [self._round_report.flat.numel()]
        summed = strategy.reduce(torch.cat(flat + [self._round_report.flat]), reduce_op="sum")
        parts = list(torch.split(summed, sizes))
        self._round_report.replace(parts.pop())
        if self._round_vectors is not None:
            self._round_vectors.replace(strategy.reduce(self._round_vectors.flat, reduce_op="sum"))
        weights = self._round_report["weights"]
        with torch.no_grad():
            for cluster, global_tensors in enumerate(self._global):
                deltas = [parts.pop(0).view_as(g) for g in global_tensors]
                apply_weighted_update(global_tensors, deltas, float(weights[cluster]), strategy.server_lr)
            if self._global_shared:
                deltas = [parts.pop(0).view_as(g) for g in self._global_shared]
                apply_weighted_update(self._global_shared, deltas, float(weights[-1]), strategy.server_lr)
        self._record_round()
        self._server_step()
        self._load_global()
        self._set_round_metrics()

    def _record_round(self) -> None:
        assert self.client_state is not None
        state, buffer = self.client_state, self._round_report
        reported = (buffer["reported"] > 0).cpu()
        clients = self._round_clients[reported]
        state.record(clients, buffer["omega"].cpu()[reported], buffer["label_sums"].cpu()[reported])
        offsets = self.trainer.datamodule.train_offsets
        for name in self.rule.client_reported_state():
            if f"extra.{name}" not in buffer:
                continue
            values = buffer[f"extra.{name}"].cpu()
            target = state.extra[name]
            if self.rule.per_sample_state and name in self.rule.per_sample_state:
                for slot in reported.nonzero().flatten().tolist():
                    client = int(self._round_clients[slot])
                    start, stop = int(self._sample_offsets[slot]), int(self._sample_offsets[slot + 1])
                    target[int(offsets[client]) : int(offsets[client + 1])] = values[start:stop].to(
                        target.dtype
                    )
            else:
                target[clients] = values[reported].to(target.dtype)
        if self.rule.keeps_personal_models and self._round_vectors is not None:
            vectors = self._round_vectors["vectors"].cpu()
            for slot in reported.nonzero().flatten().tolist():
                state.personal[int(self._round_clients[slot])] = vectors[slot].clone()
            self.rule.mix_personal(state.personal, self.trainer.current_epoch)

    def _server_step(self) -> None:
        """Structural server decisions after aggregation: cluster removal (FedRC) and splits (CFL)."""
        assert self.client_state is not None
        state = self.client_state
        dm = self.trainer.datamodule
        remove = self.rule.clusters_to_remove(state, dm.train_sizes)
        if remove is not None and bool(remove.any()):
            state.remove_clusters(remove)
            rank_zero_info(
                f"round {self.trainer.current_epoch}: removed cluster(s) "
                f"{remove.nonzero().flatten().tolist()} "
                f"(share of γ below the threshold); {int(state.active.sum())} remain"
            )
        if self._round_vectors is not None and self.rule.wants_model_vectors(state):
            self._initialise_centres()
        if self.rule.needs_update_vectors and self._round_vectors is not None:
            reported = (self._round_report["reported"] > 0).cpu()
            clusters = self._round_report["omega"].cpu().argmax(1)[reported]
            updates = self._round_vectors["vectors"].cpu()[reported]
            sizes = dm.train_sizes[self._round_clients[reported]]
            for parent, child, moving in self.rule.plan_splits(clusters, updates, sizes, state.active):
                movers = self._round_clients[reported][moving]
                state.active[child] = True
                state.omega[movers] = 0.0
                state.omega[movers, child] = 1.0
                for t, g in zip(self._global[child], self._global[parent], strict=True):
                    t.copy_(g)
                rank_zero_info(
                    f"round {self.trainer.current_epoch}: CFL split cluster {parent}; clients "
                    f"{movers.tolist()} move to new cluster {child}"
                )

    def _initialise_centres(self) -> None:
        """K-means initialisation from the round's locally trained models (FeSEM/WeCFL): the rule
        picks K clients whose models become the centres and assigns every client to its nearest."""
        assert self.client_state is not None and self._round_vectors is not None
        reported = (self._round_report["reported"] > 0).cpu()
        clients = self._round_clients[reported]
        vectors = self._round_vectors["vectors"].cpu()[reported]
        centres, assignment = self.rule.initial_centres(
            vectors, self.trainer.current_epoch, self.client_state.active
        )
        with torch.no_grad():
            for k, row in centres.items():
                offset = 0
                for g in self._global[k]:
                    g.copy_(vectors[row, offset : offset + g.numel()].view_as(g).to(g))
                    offset += g.numel()
        self.client_state.omega[clients] = torch.nn.functional.one_hot(assignment, self.num_clusters).double()
        self.client_state.extra["centres_ready"] = torch.tensor(1.0)
        rank_zero_info(
            f"round {self.trainer.current_epoch}: centres initialised from the models of clients "
            f"{[int(clients[row]) for row in centres.values()]}"
        )

    def _set_round_metrics(self) -> None:
        assert self.client_state is not None
        nll, second, count = (float(v) for v in self._round_report["metrics"])
        count = max(count, 1.0)
        reported = float((self._round_report["reported"] > 0).sum())
        if self.task == "regression":
            self.round_metrics = {"train/loss": nll / count, "train/mse": second / count}
        else:
            self.round_metrics = {"train/loss": nll / count, "train/acc": second / count}
        self.round_metrics["train/clients"] = reported
        self.round_metrics["clusters/active"] = float(self.client_state.active.sum())
        for name, value in self.round_metrics.items():
            self.log(
                name,
                value,
                on_step=False,
                on_epoch=True,
                logger=False,
                prog_bar=name in ("train/loss", "train/acc", "train/mse"),
                batch_size=1,
                sync_dist=True,
                rank_zero_only=False,
            )

    # ------------------------------------------------------------------ FedSoft's estimation
    @torch.no_grad()
    def _estimate_importance(self, round_index: int) -> None:
        """Every client's importance weights from the current centres, split across processes."""
        assert self.client_state is not None
        dm = self.trainer.datamodule
        strategy = self.trainer.strategy
        world, rank = strategy.world_size, strategy.global_rank
        estimates = torch.zeros(dm.num_clients, self.num_clusters, dtype=torch.float64, device=self.device)
        with self._timed("e_step"):
            for client in range(rank, dm.num_clients, world):
                x, y = self._split("train", client)
                losses, _ = self.evaluate_clusters(x, y)
                estimates[client] = self.rule.estimate(losses, self.client_state.active.to(self.device))
            estimates = strategy.reduce(estimates, reduce_op="sum") if world > 1 else estimates
        self.client_state.extra["importance"] = estimates.cpu()
        self.client_state.extra["estimated_round"] = torch.tensor(float(round_index))
        u = estimates.cpu()
        self.client_state.omega = u / u.sum(1, keepdim=True)

    # ------------------------------------------------------------------ evaluation
    def on_validation_epoch_start(self) -> None:
        self._start_evaluation()

    def on_test_epoch_start(self) -> None:
        self._start_evaluation()

    def _start_evaluation(self) -> None:
        dm = self.trainer.datamodule
        self._eval_sums = torch.zeros(2 + 2 * dm.num_global_clients, dtype=torch.float64, device=self.device)
        self._eval_label_stats = self._current_label_stats()
        self._eval_global = [
            [t.detach().clone() for t in self.cluster_tensors(k)] for k in range(self.num_clusters)
        ]
        self._eval_shared = [t.detach().clone() for t in self.shared_tensors()]

    def validation_step(self, batch: dict[str, int], batch_idx: int) -> None:
        with self._timed("evaluation"):
            self._evaluate_client(batch)

    def test_step(self, batch: dict[str, int], batch_idx: int) -> None:
        with self._timed("evaluation"):
            self._evaluate_client(batch)

    def _score(self, prediction: Tensor, y: Tensor) -> Tensor:
        """Correct predictions (classification) or summed per-sample squared error (regression)."""
        if self.task == "regression":
            return (prediction.double() - y.reshape(y.shape[0], -1).double()).square().mean(1).sum()
        return (prediction.argmax(1) == y).sum().double()

    def _evaluate_client(self, item: dict[str, int]) -> None:
        assert self.client_state is not None
        if item["index"] == NO_CLIENT:
            return
        active = self.client_state.active.to(self.device)
        if item["kind"] == GLOBAL:
            x, y = self._split("global", item["index"])
            losses, outputs = self.evaluate_clusters(x, y)
            omega = self.rule.unseen_client_mixture(losses, y, self._eval_label_stats, active)
            prediction = mixture_probabilities(outputs, self.rule.prediction_weights(omega))
        else:
            prediction = self._local_prediction(item["index"])
            _, y = self._split("test", item["index"])
        slot = 0 if item["kind"] != GLOBAL else 2 + 2 * item["index"]
        self._eval_sums[slot] += self._score(prediction, y)
        self._eval_sums[slot + 1] += float(y.shape[0])

    def _local_prediction(self, client: int) -> Tensor:
        """A participating client's prediction on its test split: its personal model (FedSoft), or
        the cluster models, optionally fine-tuned on its training data first (FedRC-FT), mixed by ω."""
        assert self.client_state is not None
        x, _ = self._split("test", client)
        omega = self.client_state.omega[client].to(self.device)
        personal = self.client_state.personal.get(client) if self.rule.keeps_personal_models else None
        finetune = getattr(self.trainer.strategy, "finetune_epochs", 0)
        if personal is None and not finetune:
            _, outputs = self.evaluate_clusters(x)
            return mixture_probabilities(outputs, self.rule.prediction_weights(omega))
        try:
            if personal is not None:
                self._write_vector(personal, self._personal_copies())
                _, outputs = self.evaluate_clusters(x)
                if len(self._personal_copies()) == 1:
                    return outputs[0]
                return mixture_probabilities(outputs, self.rule.prediction_weights(omega))
            omega = self._finetune(client, finetune)
            _, outputs = self.evaluate_clusters(x)
            return mixture_probabilities(outputs, self.rule.prediction_weights(omega))
        finally:
            self._load_snapshot(self._eval_global, self._eval_shared)

    def _finetune(self, client: int, epochs: int) -> Tensor:
        """FedRC-FT: ``epochs`` local epochs of the client's weighted M-step on copies of the cluster
        models (restored afterwards). Returns the client's ω from the E-step before fine-tuning."""
        assert self.client_state is not None
        x, y = self._split("train", client)
        losses, _ = self.evaluate_clusters(x, y)
        context = self._client_context(client, -1, x.shape[0])
        report = self.rule.e_step(losses, y, context, self._eval_label_stats)
        plan = self.rule.local_plan(report, context)
        weights = None if plan.sample_weights is None else plan.sample_weights.float()
        optimizer = self.configure_optimizers()
        size = min(self.trainer.datamodule.batch_size, x.shape[0])
        generator = torch.Generator().manual_seed(derive_seed(self.seed, client, 0xF1E))
        with torch.inference_mode(False), torch.enable_grad():
            self.models.train()
            for _ in range(epochs):
                order = torch.randperm(x.shape[0], generator=generator).to(self.device)
                for start in range(0, x.shape[0], size):
                    index = order[start : start + size]
                    optimizer.zero_grad()
                    batch_weights = None if weights is None else weights[index]
                    total = self._plan_loss(
                        plan, plan.clusters, x[index], y[index], batch_weights, size, proximal=False
                    )
                    total.backward()
                    optimizer.step()
            self.models.eval()
        return report.omega

    def on_validation_epoch_end(self) -> None:
        self._finish_evaluation("val")

    def on_test_epoch_end(self) -> None:
        self._finish_evaluation("test")

    def _finish_evaluation(self, stage: str) -> None:
        assert self.client_state is not None
        sums = self.trainer.strategy.reduce(self._eval_sums, reduce_op="sum").cpu()
        dm = self.trainer.datamodule
        metric = "mse" if self.task == "regression" else "acc"
        per_global = (sums[2::2] / sums[3::2].clamp_min(1)).tolist()
        metrics = {
            f"{stage}/local_{metric}": float(sums[0] / sums[1].clamp_min(1)),
            f"{stage}/global_{metric}": sum(per_global) / len(per_global) if per_global else math.nan,
            f"{stage}/concept_ari": concept_ari(
                self.client_state.omega, dm.metadata.concept, self.client_state.seen
            ),
        }
        for g, value in enumerate(per_global):
            metrics[f"{stage}/global_{metric}_concept{int(dm.metadata.global_concept[g])}"] = value
        self.eval_metrics = metrics
        for name, value in metrics.items():
            self.log(
                name,
                value,
                logger=stage == "test",
                batch_size=1,
                sync_dist=True,
                prog_bar=name.endswith((f"local_{metric}", f"global_{metric}")),
            )

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.client_state is not None:
            checkpoint[CHECKPOINT_KEY] = self.client_state.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(CHECKPOINT_KEY)
        if state is None:
            return
        if self.client_state is None:
            self._pending_state = state
        else:
            self.client_state.load_state_dict(state)

    def configure_callbacks(self) -> list[pl.Callback]:
        from lightning_fedcluster.callbacks.cluster_monitor import ClusterMonitor

        return [ClusterMonitor()]
