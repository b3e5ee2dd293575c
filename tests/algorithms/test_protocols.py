"""algorithms/protocols.py: a rule's optional groups of hooks are detected by the protocols it
derives from (one place, ``Capabilities.of``), and a group is never half written."""

from __future__ import annotations

import pytest
import torch

from lightning_fedcluster.algorithms import (
    CFL,
    IFCA,
    Algorithm,
    Capabilities,
    DFedEM,
    Estimation,
    FedProx,
    FedRC,
    FedSoft,
    FeSEM,
    ModelDistances,
)
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.protocols import label_statistics


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (FedRC(3), Capabilities(label_stats=True)),
        (FedRC(3, use_label_stats=False), Capabilities()),  # FedEM: the protocol, switched off
        (IFCA(3), Capabilities()),
        (CFL(3), Capabilities()),
        (FedProx(0.1), Capabilities()),
        (FeSEM(3), Capabilities(model_distances=True)),
        (
            FedSoft(3),
            Capabilities(estimation=True, server_selection=True, personal_models=True),
        ),
        (DFedEM(3), Capabilities(personal_models=True, personal_copies=0, personal_mixing=True)),
    ],
    ids=["fedrc", "fedem", "ifca", "cfl", "fedprox", "fesem", "fedsoft", "dfedem"],
)
def test_capabilities_are_the_protocols_a_rule_derives_from(rule, expected):
    assert rule.capabilities == expected == Capabilities.of(rule)


def test_a_protocols_hooks_must_be_written_together():
    class HalfEstimation(Algorithm, Estimation):
        def needs_estimation(self, round_index, state):
            return True

    with pytest.raises(TypeError, match="abstract"):
        HalfEstimation(2)

    class Nearest(Algorithm, ModelDistances):
        def reassign(self, report, distances, context):
            return report

    rule = Nearest(2)  # representation_mask has a default: every parameter
    assert rule.capabilities.model_distances
    assert rule.representation_mask(["a", "b"]) == [True, True]


def test_a_rule_without_label_statistics_gives_none():
    state = ClientState.initial(2, 3, 2)
    state.label_sums[0, 0, 0] = 4.0
    state.seen[0] = True
    assert label_statistics(IFCA(2), state) is None
    assert label_statistics(FedRC(2, use_label_stats=False), state) is None
    stats = label_statistics(FedRC(2), state)
    assert stats is not None and stats.shape == (3, 2)
    torch.testing.assert_close(stats.exp().sum(0), torch.ones(2, dtype=torch.float64))
