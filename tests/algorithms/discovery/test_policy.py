"""discovery/policy.py: ConceptDiscovery's two parameters, its components, and a fit on real data."""

from __future__ import annotations

import pytest

from lightning_fedcluster import ConceptDiscovery, FedRCStrategy
from lightning_fedcluster.algorithms.discovery.placement import PLACED, Placement
from lightning_fedcluster.algorithms.discovery.settled_events import SettledEvents
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_share": 0.0}, "min_share must be a share of the rows in (0, 0.5)"),
        ({"min_share": 0.5}, "min_share must be a share of the rows in (0, 0.5)"),
        ({"min_share": True}, "min_share must be"),
        ({"gap": 0}, "gap must be > 0 (nats per sample"),
        ({"gap": "0.1"}, "gap must be > 0"),
    ],
)
def test_out_of_range_values_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ConceptDiscovery(**options)


def test_the_components_in_their_order_carry_the_two_values():
    placement, events = ConceptDiscovery(min_share=0.1, gap=0.05).components()
    assert isinstance(placement, Placement) and placement.margin == 0.0
    assert isinstance(events, SettledEvents) and (events.gap, events.min_share) == (0.05, 0.1)


def test_a_fit_places_every_client_it_saw_on_a_live_cluster_and_trains_by_assignment():
    """The main job's digits (three label-map concepts), from K = 5 over 12 rounds: every client that
    took part is placed, on a live cluster unless a K event removed its cluster after its last turn
    (client 9 here: moved in round 10 to the cluster merged away in that round; its next turn is the
    soft E-step), some placed clients trained their
    cluster alone (ω one-hot where the ramp was over), and no K event left fewer than three models.
    (The placements are not the concepts here: on 12 clients and 12 rounds clients placed early on
    another concept's cluster move between clusters; the concepts page records it.)"""
    dm = DigitsFederated(num_clients=12, concepts=3, seed=0)
    strategy = FedRCStrategy(5, discovery=ConceptDiscovery(), clients_per_round=6, local_steps=3, seed=0)
    trainer = make_trainer(strategy, max_epochs=12, limit_val_batches=0)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=dm)
    state = trainer.lightning_module.client_state
    placed = state.extra[PLACED].long()
    seen = state.seen
    assert bool((placed[seen] >= 0).all()), placed
    on_live = state.active[placed[seen]]
    assert int((~on_live).sum()) <= 1 and int(state.active.sum()) < 5  # stale only after a K event
    trained_alone = state.omega[seen].max(1).values > 1 - 1e-9
    assert bool(trained_alone.any())  # the ramp ended for some: their last E-step was one-hot
    assert 3 <= int(state.active.sum()) <= 5
