"""algorithms/grouping.py: concept grouping (a take-off option of FedRC) against hand computations:
the client signature, the group-to-cluster matching and the grouped ω, the choice of the group
count, when it acts, and its wiring into FedRC's E-step and server step."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.actions import Note, Reassign
from lightning_fedcluster.algorithms.base import ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.grouping import (
    SIGNATURE,
    SIGNATURE_ROWS,
    ConceptGrouping,
    grouped_omega,
)
from lightning_fedcluster.algorithms.server_view import RoundOutcome
from tests.helpers.algorithms import server_view, store
from tests.helpers.weights import assert_same_fit

F64 = torch.float64


def test_each_group_takes_the_cluster_holding_most_of_its_members_mass():
    groups = torch.tensor([0, 0, 1])
    omega = torch.tensor([[0.2, 0.1, 0.7], [0.3, 0.2, 0.5], [0.6, 0.3, 0.1]], dtype=F64)
    result = grouped_omega(groups, omega, torch.ones(3, dtype=torch.bool), 0.9)
    # group 0's mass per cluster [0.5, 0.3, 1.2] -> cluster 2; group 1's [0.6, 0.3, 0.1] -> cluster 0.
    expected = torch.tensor([[0.05, 0.05, 0.9], [0.05, 0.05, 0.9], [0.9, 0.05, 0.05]], dtype=F64)
    assert_close(result, expected)
    # With cluster 2 removed: group 0 -> 1 and group 1 -> 0 keeps 0.3 + 0.6 = 0.9 of the mass, the
    # other way round 0.5 + 0.3 = 0.8.
    result = grouped_omega(groups, omega, torch.tensor([True, True, False]), 0.9)
    assert_close(result, torch.tensor([[0.1, 0.9, 0.0], [0.1, 0.9, 0.0], [0.9, 0.1, 0.0]], dtype=F64))


def test_one_alive_cluster_gets_all_of_the_weight():
    result = grouped_omega(
        torch.tensor([0, 0]), torch.full((2, 2), 0.5, dtype=F64), torch.tensor([False, True]), 0.9
    )
    assert_close(result, torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=F64))


def _state_with_signatures() -> ClientState:
    """Five seen clients: two signatures (label 0 predicted as 0, or as 1), two alive clusters."""
    state = ClientState.initial(5, 2, 3, ConceptGrouping(group_round=4).state_entries())
    state.seen[:] = True
    state.extra[SIGNATURE][:3, 0] = torch.tensor([0.9, 0.1], dtype=F64)
    state.extra[SIGNATURE][3:, 0] = torch.tensor([0.1, 0.9], dtype=F64)
    state.extra[SIGNATURE_ROWS][:, 0] = 5.0
    state.omega[:3] = torch.tensor([0.2, 0.5, 0.3], dtype=F64)
    state.omega[3:] = torch.tensor([0.5, 0.2, 0.3], dtype=F64)
    return state


def test_grouping_acts_once_after_its_round_and_only_on_clients_with_signatures():
    state = _state_with_signatures()
    rule = ConceptGrouping(group_round=4, share=0.8)
    assert rule.actions(state, 2) == [] and rule.actions(state, 4) == []
    state.extra[SIGNATURE_ROWS][4] = 0.0  # client 4 never computed a signature
    actions = rule.actions(state, 3)
    assert [type(a) for a in actions] == [Reassign, Note]
    reassign = actions[0]
    assert reassign.clients.tolist() == [0, 1, 2, 3]
    # 3 alive clusters, so 3 groups of 2 distinct signatures: client 3 never shares a cluster with
    # clients 0-2 (which two groups split between them).
    assert (reassign.omega.max(1).values == 0.8).all()
    clusters = reassign.omega.argmax(1)
    assert int(clusters[3]) not in clusters[:3].tolist()


def test_options_are_checked():
    with pytest.raises(ValueError, match="group_round must be a positive integer"):
        ConceptGrouping(group_round=0)
    with pytest.raises(ValueError, match="group_share must be in"):
        ConceptGrouping(group_round=3, share=0.0)
    with pytest.raises(ValueError, match="cannot be combined with adam_gamma"):
        FedRC(3, group_round=3, adam_gamma=True)
    with pytest.raises(ValueError, match=r"group_share=0.5 has no effect without group_round"):
        FedRC(3, group_share=0.5)


def test_fedrc_records_the_signature_before_the_grouping_round_only():
    rule = FedRC(2, group_round=2)
    assert rule.capabilities.client_outputs
    assert [(e.name, e.reported) for e in rule.state_entries()] == [(SIGNATURE, True), (SIGNATURE_ROWS, True)]
    outputs = torch.tensor([[[0.7, 0.3], [0.2, 0.8]], [[0.5, 0.5], [0.4, 0.6]]])
    losses = -outputs[:, torch.arange(2), torch.tensor([0, 1])].T.log().double()
    for round_index, expect in ((1, True), (2, False)):
        extra = {name: value[0] for name, value in store(rule, 1).extra.items()}
        context = ClientContext(
            client=0,
            round_index=round_index,
            num_samples=2,
            num_classes=2,
            omega=torch.full((2,), 0.5, dtype=F64),
            active=torch.ones(2, dtype=torch.bool),
            extra=extra,
            outputs=outputs,
        )
        rule.e_step(losses, torch.tensor([0, 1]), context, torch.zeros(2, 2, dtype=F64))
        recorded = bool(context.extra[SIGNATURE_ROWS].sum() > 0)
        assert recorded == expect
    assert_close(extra[SIGNATURE], torch.zeros(2, 2, dtype=F64))  # round 2: nothing written
    # Its server step at round group_round - 1 is the grouping; FedRC's own after that.
    state = _state_with_signatures()
    outcome = RoundOutcome(1, torch.arange(5), state.omega, torch.full((5,), 5), torch.full((5,), 5))
    assert isinstance(FedRC(3, group_round=2).after_round(server_view(state, outcome))[0], Reassign)
    assert FedRC(3, group_round=3).after_round(server_view(state, outcome)) == []


# --- through a fit -------------------------------------------------------------------------------------


def _grouped_fit(rounds: int, executor: str = "loop", **trainer_options):
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(
        3, clients_per_round=6, local_steps=2, group_round=2, group_share=0.8, executor=executor
    )
    trainer = make_trainer(strategy, max_epochs=rounds, **trainer_options)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0))
    return trainer


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_after_group_round_every_client_with_a_signature_is_grouped(executor):
    state = _grouped_fit(2, executor).lightning_module.client_state
    with_signature = state.extra[SIGNATURE_ROWS].sum(1) > 0
    assert bool((with_signature == state.seen).all()) and int(state.seen.sum()) >= 6
    grouped = state.omega[state.seen]
    assert_close(grouped.max(1).values, torch.full((grouped.shape[0],), 0.8, dtype=F64))
    assert_close(grouped.min(1).values, torch.full((grouped.shape[0],), 0.1, dtype=F64))
    assert_close(state.omega[~state.seen], torch.full((int((~state.seen).sum()), 3), 1 / 3, dtype=F64))
    # The signature rows count each label's rows: as many as the label sums hold (Σ_k γ = 1 per row).
    assert_close(state.extra[SIGNATURE_ROWS][state.seen], state.label_sums[state.seen].sum(2))


def test_grouping_resumes_exactly_from_a_round_checkpoint(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    straight = _grouped_fit(4)
    _grouped_fit(1, enable_checkpointing=True, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)])
    (checkpoint,) = tmp_path.glob("epoch=0-*.ckpt")
    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(
        3, clients_per_round=6, local_steps=2, group_round=2, group_share=0.8, executor="loop"
    )
    resumed = make_trainer(strategy, max_epochs=4)
    resumed.fit(
        MLPClassifier(lr=0.2),
        datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0),
        ckpt_path=checkpoint,
    )
    assert_same_fit(straight, resumed)
