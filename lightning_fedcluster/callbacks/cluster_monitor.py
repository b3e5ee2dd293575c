"""ClusterMonitor: writes each round's metrics with the round as the step and, for loggers that take
images (TensorBoard), figures of how the clusters relate to the true concepts.

The ClusteredModule adds it automatically (configure_callbacks). Scalars go to every logger; a
round's server actions (merges, removals, groupings) go as text to loggers that take text
(``clusters/events``), beside ``clusters/active``, the clusters alive. The
figures (drawn by `lightning_fedcluster.figures`) are: the clients × clusters ω matrix, the
concept × cluster shares, C_{y,k} (FedRC), and the validation accuracy per concept over rounds.
They are drawn at validation rounds (``check_val_every_n_epoch``; rendering a figure costs far
more than a round of the small models) and at the end of training (a run that does not end on a
validation round still gets its final clusters), plus every ``images_every`` rounds when given,
and not at all with ``figures=False`` (``fedcluster fit --figures=false``). Every scalar and
figure has the round as its step, as the test scores have (``engine/evaluation.py``). ``draw`` gives the run's
current figures, e.g. to save them for a paper with `lightning_fedcluster.figures.save_figure`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from matplotlib.figure import Figure

from lightning_fedcluster import figures
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.callbacks.image_logging import experiments_with, log_figure
from lightning_fedcluster.engine.federation import EVENTS_TAG
from lightning_fedcluster.metrics.clustering import concept_shares

CONCEPT_METRIC = re.compile(r"^val/global_(acc|mse)_concept(\d+)$")
"""The validation metric of each concept's global client, as the evaluation names it."""


class ClusterMonitor(pl.Callback):
    """Per-round logging.

    Args:
        images_every: also draw the cluster figures every this many rounds (None: only at
            validation rounds).
        figures: draw figures at all (False: scalars only, e.g. for fast sweeps).
    """

    def __init__(self, images_every: int | None = None, figures: bool = True) -> None:
        if images_every is not None and (isinstance(images_every, bool) or images_every < 1):
            raise ValueError(f"images_every must be a positive integer or None, got {images_every!r}")
        if not isinstance(figures, bool):
            raise ValueError(f"figures must be True or False, got {figures!r}")
        self.images_every = images_every
        self.figures = figures
        self.history: dict[int, dict[str, float]] = {}
        """Validation metrics per round, for the accuracy-over-rounds figure (kept in checkpoints)."""
        self._drawn_round: int | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.current_epoch + 1
        metrics = dict(getattr(pl_module, "round_metrics", {}))
        state = getattr(pl_module, "client_state", None)
        if state is None or not metrics:
            return
        dm = trainer.datamodule
        shares = concept_shares(state.omega, dm.metadata.concept, dm.train_sizes)
        for c in range(shares.shape[0]):
            for k in range(shares.shape[1]):
                metrics[f"clusters/concept{c}_share_in_cluster{k}"] = float(shares[c, k])
        self._log_scalars(trainer, metrics, step)
        log_events(trainer, getattr(pl_module, "round_events", []), step)
        if self.images_every is not None and step % self.images_every == 0:
            self._draw_clusters(trainer, pl_module, step)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        step = trainer.current_epoch + 1
        metrics = dict(getattr(pl_module, "eval_metrics", {}))
        self._log_scalars(trainer, metrics, step)
        if not metrics:
            return
        self.history[step] = {name: float(v) for name, v in metrics.items() if name.startswith("val/")}
        self._draw_clusters(trainer, pl_module, step)
        if self.figures:
            log_figure(trainer, "val/per_concept", self._accuracy_figure, step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The final round's cluster figures, unless its validation already drew them."""
        rounds = getattr(pl_module, "rounds_trained", 0)
        if rounds > 0:
            self._draw_clusters(trainer, pl_module, rounds)

    def draw(
        self,
        trainer: pl.Trainer,
        size: tuple[float, float] | None = None,
        titles: bool = True,
    ) -> dict[str, Figure]:
        """The run's current figures by TensorBoard tag (ω, concept shares, C_{y,k} for FedRC, and
        the accuracy over the validation rounds so far), drawn at ``size`` inches and with or
        without ``titles`` (`lightning_fedcluster.figures`); e.g. after ``trainer.fit``::

            for tag, fig in monitor.draw(trainer, size=(3.3, 1.8), titles=False).items():
                figures.save_figure(fig, tag.replace("/", "_") + ".pdf")
        """
        drawers = self._cluster_drawers(trainer, trainer.lightning_module, None, size, titles)
        drawers["val/per_concept"] = lambda: self._accuracy_figure(size, titles)
        drawn = {tag: draw() for tag, draw in drawers.items()}
        return {tag: fig for tag, fig in drawn.items() if fig is not None}

    def state_dict(self) -> dict[str, Any]:
        return {"history": {step: dict(metrics) for step, metrics in self.history.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = {int(step): dict(metrics) for step, metrics in state_dict.get("history", {}).items()}

    def _draw_clusters(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> None:
        """ω sorted by concept, the concept × cluster shares and, for FedRC, C_{y,k}."""
        if not self.figures or self._drawn_round == step:
            return
        self._drawn_round = step
        for tag, draw in self._cluster_drawers(trainer, pl_module, step).items():
            log_figure(trainer, tag, draw, step)

    @staticmethod
    def _cluster_drawers(
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        step: int | None,
        size: tuple[float, float] | None = None,
        titles: bool = True,
    ) -> dict[str, Callable[[], Figure | None]]:
        """The cluster figures by tag, each drawn only when called (nothing without client state)."""
        state = getattr(pl_module, "client_state", None)
        if state is None:
            return {}
        concept, sizes = trainer.datamodule.metadata.concept, trainer.datamodule.train_sizes
        style: dict[str, Any] = {"size": size, "titles": titles}

        def label_stats() -> Figure | None:
            stats = label_statistics(pl_module.rule, state)
            return None if stats is None else figures.label_stats_figure(stats.exp(), step, **style)

        return {
            "clusters/omega_clients_by_concept": lambda: figures.omega_figure(
                state.omega, concept, step, state.seen, **style
            ),
            "clusters/concept_shares": lambda: figures.shares_figure(
                concept_shares(state.omega, concept, sizes), step, **style
            ),
            "clusters/label_stats_C": label_stats,
        }

    def _accuracy_figure(self, size: tuple[float, float] | None = None, titles: bool = True) -> Figure | None:
        per_concept: dict[int, str] = {}
        for metrics in self.history.values():
            for name in metrics:
                match = CONCEPT_METRIC.match(name)
                if match:
                    per_concept[int(match.group(2))] = name
        if not per_concept:
            return None
        mean = next(iter(per_concept.values())).rsplit("_concept", 1)[0]
        return figures.accuracy_figure(self.history, per_concept, mean, size=size, titles=titles)

    @staticmethod
    def _log_scalars(trainer: pl.Trainer, metrics: dict[str, float], step: int) -> None:
        if not trainer.is_global_zero or not metrics:
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


def log_events(trainer: pl.Trainer, events: list[str], step: int) -> None:
    """A round's server-action notes as one text entry at the round's step (``EVENTS_TAG``), for
    loggers that take text (TensorBoard); nothing for a round without events."""
    if not events:
        return
    for experiment in experiments_with(trainer, "add_text"):
        experiment.add_text(EVENTS_TAG, "\n\n".join(events), global_step=step)
