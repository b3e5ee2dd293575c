"""ClusteredModule: K cluster copies of the user's LightningModule, trained as federated clients.

The module runs the shared client loop. Each work item of the round loader is one local step of
one client: on a client's first step the K working copies are reset to the global weights and
the client's E-step runs (one no-grad pass that also gives the training metrics); each step
trains on a weighted minibatch; on the last step the client's weighted update is accumulated.
After the round's last item the updates of all processes are summed and applied, so validation
and checkpoints always see aggregated weights. The algorithm's rules (E-step, sample and server
weights, label statistics) come from the strategy's rule object in ``algorithms/``.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_fedcluster.algorithms.aggregation import accumulate_delta, apply_weighted_update
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.fedrc import ClientReport
from lightning_fedcluster.algorithms.mixture import mixture_probabilities
from lightning_fedcluster.algorithms.schedule import check_positive_int, check_seed, derive_seed
from lightning_fedcluster.datamodules.loaders import GLOBAL, NO_CLIENT
from lightning_fedcluster.metrics.clustering import concept_ari

CHECKPOINT_KEY = "fedcluster_client_state"
# Cumulative wall time per engine phase, in ``ClusteredModule.phase_seconds``.
PHASES = ("e_step", "local_training", "aggregation", "evaluation")


def _independent_copies(module: nn.Module, num_clusters: int, seed: int) -> list[nn.Module]:
    """K deep copies of ``module``, each re-initialised with its own seed (reset_parameters).

    Identical starting models are a fixed point of the soft-clustering EM (every γ stays 1/K),
    so the copies must differ. The user's trainer is not copied along.
    """
    trainer = getattr(module, "_trainer", None)
    memo: dict[int, Any] = {id(trainer): None} if trainer is not None else {}
    copies, resettable = [], False
    for k in range(num_clusters):
        clone = copy.deepcopy(module, memo=dict(memo))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, k, 0xC1))
            for sub in clone.modules():
                if callable(getattr(sub, "reset_parameters", None)):
                    sub.reset_parameters()
                    resettable = True
        copies.append(clone)
    if num_clusters > 1 and not resettable:
        warnings.warn(
            f"{type(module).__name__} has no submodule with reset_parameters(): the {num_clusters} cluster "
            "models start identical, and soft clustering cannot separate identical models",
            stacklevel=3,
        )
    return copies


def _state_tensors(model: nn.Module) -> list[Tensor]:
    """The tensors that are federated: parameters and floating-point buffers (e.g. BN statistics)."""
    return [p for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


def _first_optimizer(config: Any, owner: str) -> torch.optim.Optimizer:
    """The optimizer out of any configure_optimizers return form; schedulers are ignored."""
    if isinstance(config, torch.optim.Optimizer):
        return config
    if isinstance(config, dict) and "optimizer" in config:
        if "lr_scheduler" in config:
            warnings.warn(
                f"{owner}.configure_optimizers returns an LR scheduler: it is ignored, every client's "
                "local solver starts afresh each round",
                stacklevel=4,
            )
        return config["optimizer"]
    if isinstance(config, (list, tuple)) and config:
        first = config[0]
        if isinstance(first, (list, tuple)):  # ([optimizers], [schedulers])
            first = first[0] if first else None
        return _first_optimizer(first, owner)
    raise TypeError(
        f"{owner}.configure_optimizers must return an optimizer (it is the local solver of every "
        f"client), got {type(config).__name__}"
    )


@dataclass
class _ClientRun:
    """The client being simulated now: its data, E-step report and minibatch order."""

    client: int
    slot: int
    x: Tensor
    y: Tensor
    report: ClientReport
    sample_weights: Tensor  # [N, K] float32
    active: list[int]  # clusters trained by this client
    order: Tensor  # permutation of the client's samples


class ClusteredModule(pl.LightningModule):
    """K copies of ``module`` (a classifier whose ``forward`` returns logits) trained federatedly.

    The per-sample loss is ``module.per_sample_loss(batch)`` if defined, else ``module.criterion``
    (its reduction is switched to ``"none"``), else cross-entropy. The optimizer comes from
    ``module.configure_optimizers()`` and is the local solver of every client.
    """

    def __init__(
        self, module: nn.Module, num_clusters: int = 1, *, seed: int = 0, eval_batch_size: int = 4096
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
        self.automatic_optimization = False
        self.seed = seed
        self.eval_batch_size = eval_batch_size
        self.models = nn.ModuleList(_independent_copies(module, num_clusters, seed))
        self.client_state: ClientState | None = None
        self.round_metrics: dict[str, float] = {}
        self.eval_metrics: dict[str, float] = {}
        self._pending_state: dict[str, Tensor] | None = None
        self._resident: dict[str, Tensor] | None = None
        self._log_label_stats: Tensor | None = None
        self._run: _ClientRun | None = None
        self.phase_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)

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
        self.rule = strategy.algorithm
        self._check_output_shape(datamodule)
        if stage == "fit":
            strategy.round_schedule(datamodule)  # validates clients_per_round before training
        shape = (datamodule.num_clients, datamodule.num_classes, self.num_clusters)
        if (
            self.client_state is None
            or (
                self.client_state.num_clients,
                self.client_state.label_sums.shape[1],
                self.client_state.num_clusters,
            )
            != shape
        ):
            self.client_state = ClientState.initial(*shape)
        if self._pending_state is not None:
            self.client_state.load_state_dict(self._pending_state)
            self._pending_state = None
        self._resident = None

    def _check_output_shape(self, datamodule: Any) -> None:
        x, y = datamodule.train_split(0)
        model = self.models[0]
        was_training = model.training
        model.eval()
        with torch.no_grad():
            out = model(x[:2].to(self.device))
        model.train(was_training)
        if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[1] != datamodule.num_classes:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"{type(model).__name__}.forward must return logits of shape [batch, num_classes] = "
                f"[batch, {datamodule.num_classes}] for this datamodule, got {got}: set the model's "
                "output size to the datamodule's num_classes"
            )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """One optimizer over all K copies (so global_step counts local steps), built from the
        user's own configure_optimizers."""
        groups: list[dict[str, Any]] = []
        template: torch.optim.Optimizer | None = None
        for model in self.models:
            owner = type(model).__name__
            if type(model).configure_optimizers is pl.LightningModule.configure_optimizers:
                raise TypeError(
                    f"{owner} must define configure_optimizers: it is every client's local solver"
                )
            template = _first_optimizer(model.configure_optimizers(), owner)
            groups.extend(template.param_groups)
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

    def per_sample_loss(self, k: int, x: Tensor, y: Tensor, logits: Tensor | None = None) -> Tensor:
        """Loss of every sample under cluster model k, shape [N]."""
        model = self.models[k]
        custom = getattr(model, "per_sample_loss", None)
        if callable(custom):
            loss = custom((x, y))
        else:
            logits = model(x) if logits is None else logits
            criterion = getattr(model, "criterion", None)
            if criterion is None:
                loss = F.cross_entropy(logits, y, reduction="none")
            else:
                if isinstance(getattr(criterion, "reduction", None), str) and criterion.reduction != "none":
                    criterion = copy.copy(criterion)
                    criterion.reduction = "none"
                loss = criterion(logits, y)
        if loss.shape != y.shape[:1]:
            raise ValueError(
                f"the per-sample loss of {type(model).__name__} must have shape [batch] = [{y.shape[0]}], "
                f"got {tuple(loss.shape)}: return unreduced losses"
            )
        return loss

    @torch.no_grad()
    def evaluate_clusters(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
        """One no-grad pass of every cluster model over x in large batches, in eval mode.

        Returns per-sample losses [N, K] (None when no labels are given: prediction only) and
        class probabilities [K, N, C].
        """
        losses, probs = [], []
        for k, model in enumerate(self.models):
            was_training = model.training
            model.eval()
            loss_k, prob_k = [], []
            for start in range(0, x.shape[0], self.eval_batch_size):
                stop = start + self.eval_batch_size
                xb = x[start:stop]
                logits = model(xb)
                if y is not None:
                    loss_k.append(self.per_sample_loss(k, xb, y[start:stop], logits))
                prob_k.append(torch.softmax(logits.float(), dim=1))
            model.train(was_training)
            if y is not None:
                losses.append(torch.cat(loss_k))
            probs.append(torch.cat(prob_k))
        return (torch.stack(losses, dim=1) if y is not None else None), torch.stack(probs)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of every cluster model, shape [K, N, C]."""
        return torch.stack([model(x) for model in self.models])

    @torch.no_grad()
    def adapt(self, x: Tensor, y: Tensor) -> Tensor:
        """Mixture weights ω [K] of a client that took no part in training, from its labelled
        data (the algorithm's iterated E-step); the cluster models are not changed."""
        losses, _ = self.evaluate_clusters(x.to(self.device), y.to(self.device))
        return self.rule.unseen_client_mixture(losses, y.to(self.device), self._current_label_stats())

    @torch.no_grad()
    def predict_proba(self, x: Tensor, omega: Tensor) -> Tensor:
        """p(y|x) of a client with mixture weights ω (hard or soft, as the algorithm predicts)."""
        _, probs = self.evaluate_clusters(x.to(self.device))
        return mixture_probabilities(probs, self.rule.prediction_weights(omega.to(self.device)))

    def _current_label_stats(self) -> Tensor | None:
        assert self.client_state is not None
        stats = self.rule.log_label_stats(self.client_state)
        return None if stats is None else stats.to(self.device)

    # ------------------------------------------------------------------ one round
    def on_train_epoch_start(self) -> None:
        """Round start: snapshot the global weights and clear the round's accumulators."""
        dm = self.trainer.datamodule
        self._global = [[t.detach().clone() for t in _state_tensors(m)] for m in self.models]
        self._delta_sum = [[torch.zeros_like(t, dtype=torch.float64) for t in g] for g in self._global]
        clients = self.trainer.strategy.round_schedule(dm).clients(self.trainer.current_epoch)
        n, c, k = len(clients), dm.num_classes, self.num_clusters
        self._round_clients = clients
        self._round_report = torch.zeros(n * k + n * c * k + n, dtype=torch.float64, device=self.device)
        self._round_sums = torch.zeros(k + 3, dtype=torch.float64, device=self.device)  # weights, metrics
        self._log_label_stats = self._current_label_stats()

    def training_step(self, batch: dict[str, int], batch_idx: int) -> None:
        if batch["client"] == NO_CLIENT:
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

    def _start_client(self, item: dict[str, int]) -> None:
        assert self.client_state is not None
        client, round_index = item["client"], item["round"]
        torch.manual_seed(derive_seed(self.seed, round_index, client))  # dropout etc.: rank-independent
        with torch.no_grad():
            for model, global_tensors in zip(self.models, self._global, strict=True):
                for t, g in zip(_state_tensors(model), global_tensors, strict=True):
                    t.copy_(g)
        self.optimizers().optimizer.state.clear()
        x, y = self._split("train", client)
        losses, probs = self.evaluate_clusters(x, y)
        if not bool(torch.isfinite(losses).all()):
            self._fail(round_index, client, "in its E-step pass")
        report = self.rule.e_step(
            losses,
            y,
            self.client_state.omega[client].to(self.device),
            self._log_label_stats,
            self.trainer.datamodule.num_classes,
        )
        weights = self.rule.sample_weights(report).to(torch.float32)
        generator = torch.Generator().manual_seed(derive_seed(self.seed, round_index, client, 0xBA7C))
        self._run = _ClientRun(
            client=client,
            slot=item["slot"],
            x=x,
            y=y,
            report=report,
            sample_weights=weights,
            active=[k for k in range(self.num_clusters) if float(weights[:, k].sum()) > 0],
            order=torch.randperm(x.shape[0], generator=generator).to(self.device),
        )
        self._record_report(item["slot"], report)
        mixture = mixture_probabilities(probs.double(), report.omega)
        likelihood = mixture.gather(1, y.unsqueeze(1)).squeeze(1).clamp_min(1e-300)
        self._round_sums[-3:] += torch.stack(
            [
                -likelihood.log().sum(),
                (mixture.argmax(1) == y).sum().double(),
                torch.tensor(float(y.shape[0]), dtype=torch.float64, device=self.device),
            ]
        )

    def _record_report(self, slot: int, report: ClientReport) -> None:
        n, k = len(self._round_clients), self.num_clusters
        c = report.label_sums.shape[0]
        omega, sums, mask = torch.split(self._round_report, [n * k, n * c * k, n])
        omega.view(n, k)[slot] = report.omega
        sums.view(n, c, k)[slot] = report.label_sums
        mask[slot] = 1.0

    def _local_step(self, item: dict[str, int]) -> None:
        run = self._run
        assert run is not None and run.client == item["client"]
        n = run.x.shape[0]
        size = min(self.trainer.datamodule.batch_size, n)
        positions = (item["step"] * size + torch.arange(size, device=self.device)) % n
        index = run.order[positions]
        x, y, weights = run.x[index], run.y[index], run.sample_weights[index]
        optimizer = self.optimizers()
        optimizer.zero_grad()
        total = torch.zeros((), device=self.device)
        for k in run.active:
            total = total + (weights[:, k] * self.per_sample_loss(k, x, y)).sum() / size
        if not bool(torch.isfinite(total)):
            self._fail(item["round"], run.client, f"at local step {item['step']}")
        self.manual_backward(total)
        optimizer.step()

    def _finish_client(self) -> None:
        run = self._run
        assert run is not None
        weights = self.rule.aggregation_weights(run.x.shape[0], run.report)
        for k in run.active:
            if float(weights[k]) > 0:
                accumulate_delta(
                    self._delta_sum[k], _state_tensors(self.models[k]), self._global[k], float(weights[k])
                )
                self._round_sums[k] += weights[k]
        self._run = None

    def _fail(self, round_index: int, client: int, where: str) -> None:
        raise FloatingPointError(
            f"non-finite loss in round {round_index} at client {client} {where}: lower the learning "
            f"rate or check client {client}'s data for NaN/inf"
        )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.trainer.is_last_batch:
            with self._timed("aggregation"):
                self._end_round()

    def _end_round(self) -> None:
        """Sum every process's client updates, apply them, and refresh the client store."""
        assert self.client_state is not None
        flat = [t.flatten() for deltas in self._delta_sum for t in deltas]
        sizes = [t.numel() for t in flat] + [self._round_report.numel(), self._round_sums.numel()]
        summed = self.trainer.strategy.reduce(
            torch.cat(flat + [self._round_report, self._round_sums]), reduce_op="sum"
        )
        parts = list(torch.split(summed, sizes))
        round_sums, round_report = parts.pop(), parts.pop()
        k = self.num_clusters
        with torch.no_grad():
            for cluster, (model, global_tensors) in enumerate(zip(self.models, self._global, strict=True)):
                deltas = [parts.pop(0).view_as(g) for g in global_tensors]
                apply_weighted_update(
                    global_tensors, deltas, float(round_sums[cluster]), self.trainer.strategy.server_lr
                )
                for t, g in zip(_state_tensors(model), global_tensors, strict=True):
                    t.copy_(g)
        n, c = len(self._round_clients), self.trainer.datamodule.num_classes
        omega, sums, mask = torch.split(round_report.cpu(), [n * k, n * c * k, n])
        reported = mask > 0
        self.client_state.record(
            self._round_clients[reported], omega.view(n, k)[reported], sums.view(n, c, k)[reported]
        )
        nll, correct, count = (float(v) for v in round_sums[-3:])
        self.round_metrics = {
            "train/loss": nll / max(count, 1.0),
            "train/acc": correct / max(count, 1.0),
            "train/clients": float(reported.sum()),
        }
        for name, value in self.round_metrics.items():
            self.log(
                name,
                value,
                on_step=False,
                on_epoch=True,
                logger=False,
                prog_bar=name != "train/clients",
                batch_size=1,
                sync_dist=True,
                rank_zero_only=False,
            )

    # ------------------------------------------------------------------ evaluation
    def on_validation_epoch_start(self) -> None:
        self._start_evaluation()

    def on_test_epoch_start(self) -> None:
        self._start_evaluation()

    def _start_evaluation(self) -> None:
        dm = self.trainer.datamodule
        self._eval_sums = torch.zeros(2 + 2 * dm.num_global_clients, dtype=torch.float64, device=self.device)
        self._eval_label_stats = self._current_label_stats()

    def validation_step(self, batch: dict[str, int], batch_idx: int) -> None:
        with self._timed("evaluation"):
            self._evaluate_client(batch)

    def test_step(self, batch: dict[str, int], batch_idx: int) -> None:
        with self._timed("evaluation"):
            self._evaluate_client(batch)

    def _evaluate_client(self, item: dict[str, int]) -> None:
        assert self.client_state is not None
        if item["index"] == NO_CLIENT:
            return
        if item["kind"] == GLOBAL:
            x, y = self._split("global", item["index"])
            losses, probs = self.evaluate_clusters(x, y)
            omega = self.rule.unseen_client_mixture(losses, y, self._eval_label_stats)
        else:
            x, y = self._split("test", item["index"])
            _, probs = self.evaluate_clusters(x)
            omega = self.client_state.omega[item["index"]].to(self.device)
        predicted = mixture_probabilities(probs, self.rule.prediction_weights(omega)).argmax(1)
        correct, total = (predicted == y).sum().double(), float(y.shape[0])
        slot = 0 if item["kind"] != GLOBAL else 2 + 2 * item["index"]
        self._eval_sums[slot] += correct
        self._eval_sums[slot + 1] += total

    def on_validation_epoch_end(self) -> None:
        self._finish_evaluation("val")

    def on_test_epoch_end(self) -> None:
        self._finish_evaluation("test")

    def _finish_evaluation(self, stage: str) -> None:
        assert self.client_state is not None
        sums = self.trainer.strategy.reduce(self._eval_sums, reduce_op="sum").cpu()
        dm = self.trainer.datamodule
        per_global = (sums[2::2] / sums[3::2].clamp_min(1)).tolist()
        metrics = {
            f"{stage}/local_acc": float(sums[0] / sums[1].clamp_min(1)),
            f"{stage}/global_acc": sum(per_global) / len(per_global) if per_global else float("nan"),
            f"{stage}/concept_ari": concept_ari(
                self.client_state.omega, dm.metadata.concept, self.client_state.seen
            ),
        }
        for g, acc in enumerate(per_global):
            metrics[f"{stage}/global_acc_concept{int(dm.metadata.global_concept[g])}"] = acc
        self.eval_metrics = metrics
        for name, value in metrics.items():
            self.log(
                name,
                value,
                logger=stage == "test",
                batch_size=1,
                sync_dist=True,
                prog_bar=name.endswith(("local_acc", "global_acc")),
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
