"""The take-off study's ceiling (``benchmarks/_takeoff_variants.py``'s ``TrueConceptFedRC``, the
``true`` runs): every client's ω is one-hot at its concept, only its concept's model trains on it,
and its E-step scores are reported every round."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from _takeoff_variants import TrueConceptFedRC, true_concepts
from torch.testing import assert_close

from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.algorithms.base import ClientContext
from lightning_fedcluster.algorithms.discovery.protocol import CLUSTER_SCORES, client_scores


def _context(client: int, num_samples: int, round_index: int = 4) -> ClientContext:
    uniform, alive = torch.full((3,), 1 / 3), torch.ones(3, dtype=torch.bool)
    return ClientContext(client, round_index, num_samples, num_classes=2, omega=uniform, active=alive)


def test_the_e_step_is_one_hot_at_the_concept_and_records_the_free_scores():
    rule = TrueConceptFedRC(3, None, concepts=torch.tensor([2, 0]))
    losses = torch.tensor([[0.1, 2.0, 1.0], [0.3, 0.2, 3.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1])
    log_c = torch.log(torch.tensor([[0.5, 0.2, 0.1], [0.5, 0.8, 0.9]], dtype=torch.float64))
    context = _context(client=0, num_samples=2)
    report = rule.e_step(losses, labels, context, log_c)
    assert_close(report.omega, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    assert_close(report.gamma, torch.tensor([[0.0, 0.0, 1.0]] * 2, dtype=torch.float64))
    assert_close(report.label_sums, torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=torch.float64))
    # the scores FedRC's E-step would weigh: mean over rows of −loss − log C_{y,k}; cluster 0 fits
    # this client best although it is held at its concept's cluster 2
    expected = torch.tensor([-(0.1 + 0.3) / 2, -(2.0 + 0.2) / 2, -(1.0 + 3.0) / 2], dtype=torch.float64)
    expected -= (log_c[0] + log_c[1]) / 2
    assert_close(context.extra[CLUSTER_SCORES], expected)
    assert_close(client_scores(losses, labels, log_c), expected)
    assert int(context.extra[CLUSTER_SCORES].argmax()) == 0


def test_a_concept_beyond_the_clusters_is_refused():
    with pytest.raises(ValueError, match="num_clusters must exceed it"):
        TrueConceptFedRC(2, None, concepts=torch.tensor([0, 2]))


class _StartWeights(pl.Callback):
    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.weights = [[t.detach().clone() for t in module.cluster_tensors(k)] for k in range(3)]


def test_through_a_fit_only_a_concept_s_clients_train_its_model():
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    dm = DigitsFederated(num_clients=6, concepts=3, seed=0)
    told = torch.tensor([0, 1, 0, 1, 0, 1])  # nobody is told concept 2: its model must not move
    strategy = true_concepts(lf.FedRCStrategy(
        3, local_steps=2, config=FedRC.Config(label_stats_floor=0.1),
    ), told)
    start = _StartWeights()
    trainer = make_trainer(strategy, max_epochs=2, callbacks=[start])
    trainer.fit(MLPClassifier(lr=0.2), datamodule=dm)
    module = trainer.lightning_module
    state = module.client_state
    assert_close(state.omega, torch.nn.functional.one_hot(told, 3).to(state.omega))
    for k, before in enumerate(start.weights):
        moved = any(not torch.equal(a, b) for a, b in zip(before, module.cluster_tensors(k), strict=True))
        assert moved == (k != 2)
    scores = state.extra[CLUSTER_SCORES]
    assert scores.shape == (6, 3) and bool(torch.isfinite(scores).all()) and bool((scores != 0).any())
