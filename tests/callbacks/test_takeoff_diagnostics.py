"""callbacks/takeoff_diagnostics.py: per-round cluster-formation diagnostics, recomputed by hand
from the module after a fit, and no effect on training."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.algorithms.protocols import label_statistics
from lightning_fedcluster.callbacks.takeoff_diagnostics import (
    TakeoffDiagnostics,
    entropy,
    seen_misplaced,
    separation,
)
from lightning_fedcluster.metrics import concept_ari, misplaced_clients
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def _fit(digits, callbacks, rounds=2):
    torch.manual_seed(0)
    model = MLPClassifier(lr=0.2)
    trainer = make_trainer(
        FedRCStrategy(3, clients_per_round=None, local_steps=1, executor="loop", seed=0),
        max_epochs=rounds,
        callbacks=callbacks,
    )
    trainer.fit(model, datamodule=digits)
    return trainer, trainer.lightning_module


def test_the_last_rounds_record_matches_a_recomputation_and_training_is_unchanged(digits, tmp_path):
    diagnostics = TakeoffDiagnostics(gradients=True)
    trainer, module = _fit(digits, [diagnostics])
    _, plain = _fit(digits, [])
    for a, b in zip(module.models.parameters(), plain.models.parameters(), strict=True):
        assert torch.equal(a, b)  # attaching it changes nothing
    assert [row["round"] for row in diagnostics.rows] == [1, 2]
    row = diagnostics.rows[-1]
    state = module.client_state
    assert row["ari"] == concept_ari(state.omega, digits.metadata.concept, state.seen)
    # every client has been seen (full participation): the misplaced ones are those of argmax ω
    assert bool(state.seen.all())
    misplaced = misplaced_clients(state.omega.argmax(1), digits.metadata.concept).tolist()
    assert row["misplaced"] == misplaced and (misplaced == []) == (row["ari"] == 1.0)
    # Client 0's margin and entropies by hand from the final models.
    x, y = module.split("train", 0)
    losses, _ = module.evaluate_clusters(x, y)
    log_c = label_statistics(module.rule, state)
    scores = -losses.double() - log_c[y]
    mean_ll = scores.mean(0).sort(descending=True).values
    assert row["margin"][0] == pytest.approx(float(mean_ll[0] - mean_ll[1]))
    gamma = torch.softmax(scores + state.omega[0].log(), dim=1)
    assert row["gamma_entropy"][0] == pytest.approx(float(entropy(gamma).mean()))
    assert row["omega_entropy"][0] == pytest.approx(float(entropy(state.omega[0])))
    assert len(row["model_distance"]) == 3 and all(d > 0 for d in row["model_distance"])
    assert -1.0 <= row["prediction_ari"] <= 1.0 and -1.0 <= row["gradient_ari"] <= 1.0
    path = tmp_path / "d.json"
    diagnostics.save(path)
    assert json.loads(path.read_text())[-1]["ari"] == row["ari"]


def _flat(module, k):
    return torch.cat([t.detach().flatten().double() for t in module.cluster_tensors(k)])


def test_update_norm_is_how_far_the_recorded_round_moved_each_model(digits):
    # every=2 over 4 rounds records rounds 1, 2 and 4: round 4's move is from round 3's models (not
    # from round 2's, the last recorded), which a 3-round fit of the same seed reproduces (the
    # callback changes no weight)
    diagnostics = TakeoffDiagnostics(every=2)
    _, module = _fit(digits, [diagnostics], rounds=4)
    _, after_two = _fit(digits, [], rounds=2)
    _, after_three = _fit(digits, [], rounds=3)
    assert [row["round"] for row in diagnostics.rows] == [1, 2, 4]
    row = diagnostics.rows[-1]
    moved = [float((_flat(module, k) - _flat(after_three, k)).norm()) for k in range(3)]
    since_two = [float((_flat(module, k) - _flat(after_two, k)).norm()) for k in range(3)]
    assert row["update_norm"] == pytest.approx(moved, rel=1e-12)
    assert row["update_norm"] != pytest.approx(since_two, rel=1e-6)
    assert all(m > 0 for m in moved) and row["update_norm_max"] == pytest.approx(max(moved), rel=1e-12)
    assert row["model_norm"] == pytest.approx([float(_flat(module, k).norm()) for k in range(3)], rel=1e-12)


def test_seen_misplaced_names_clients_among_all():
    # clients 0-5, concepts [0,0,1,1,2,2], argmax ω [0,0,1,1,2,0]; client 3 not seen yet. Among the
    # seen (0,1,2,4,5): concept 0 -> cluster 0, 1 -> 1, 2 -> 2 (client 4), so client 5 is misplaced.
    omega = torch.nn.functional.one_hot(torch.tensor([0, 0, 1, 1, 2, 0]), 3).double() * 0.8 + 0.2 / 3
    seen = torch.tensor([True, True, True, False, True, True])
    assert seen_misplaced(omega, torch.tensor([0, 0, 1, 1, 2, 2]), seen) == [5]


def test_separation_is_between_over_within():
    truth = torch.tensor([0, 0, 1])
    d = torch.tensor([[0.0, 0.1, 0.6], [0.1, 0.0, 0.8], [0.6, 0.8, 0.0]], dtype=torch.float64)
    assert separation(d, truth) == pytest.approx(0.7 / 0.1)
    assert math.isnan(separation(d, torch.tensor([0, 1, 2])))  # no pair shares a concept


def test_every_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="every must be a positive integer"):
        TakeoffDiagnostics(every=0)
