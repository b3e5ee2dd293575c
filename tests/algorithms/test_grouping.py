"""algorithms/grouping.py: concept grouping (a take-off option of FedRC) against hand computations:
the client signature, the group-to-cluster matching and the grouped ω, the choice of the group
count, when it acts, and its wiring into FedRC's E-step and server step; the mean-distance
assignment, the margin, the hold after the grouping, and the late pass for the ungrouped clients."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.actions import Note, Reassign, SetState
from lightning_fedcluster.algorithms.base import ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.grouping import (
    GROUPED,
    HELD,
    LATE,
    SIGNATURE,
    SIGNATURE_ROWS,
    ConceptGrouping,
    confident,
    grouped_omega,
    held_report,
    late_clusters,
    mean_distance_groups,
    mean_scores,
    medoid_scores,
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
    with pytest.raises(ValueError, match="group_assign must be one of"):
        ConceptGrouping(group_round=3, assign="median")
    for margin in (0.0, 1.0, True):
        with pytest.raises(ValueError, match="group_margin must be in"):
            ConceptGrouping(group_round=3, margin=margin)
    for hold in (-1, 1.5):
        with pytest.raises(ValueError, match="group_hold must be a non-negative integer"):
            ConceptGrouping(group_round=3, hold=hold)
    for option in ({"group_assign": "mean"}, {"group_margin": 0.7}, {"group_hold": 3}):
        with pytest.raises(ValueError, match=f"{next(iter(option))}=.* has no effect without group_round"):
            FedRC(3, **option)
    with pytest.raises(ValueError, match="cannot be combined with adam_gamma"):
        FedRC(3, group_round=3, adam_gamma=True)
    with pytest.raises(ValueError, match=r"group_share=0.5 has no effect without group_round"):
        FedRC(3, group_share=0.5)
    for ramp in (-1, 1.5, True):
        with pytest.raises(ValueError, match="group_ramp must be a non-negative integer"):
            ConceptGrouping(group_round=3, hold=4, ramp=ramp)
    with pytest.raises(ValueError, match="group_ramp has no effect without group_hold"):
        ConceptGrouping(group_round=3, ramp=2)
    for ramp in (4, 5):
        with pytest.raises(ValueError, match=f"group_ramp={ramp} must be below group_hold=4"):
            ConceptGrouping(group_round=3, hold=4, ramp=ramp)
    with pytest.raises(ValueError, match="group_ramp=2 has no effect without group_round"):
        FedRC(3, group_ramp=2)


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


# --- mean-distance assignment, margin, hold ---------------------------------------------------------

NAN = float("nan")


def test_mean_scores_weigh_each_member_by_the_labels_shared_and_skip_unknown_pairs():
    distances = torch.tensor(
        [[0, 0.2, 0.8, NAN], [0.2, 0, 0.6, 0.4], [0.8, 0.6, 0, 0.1], [NAN, 0.4, 0.1, 0]], dtype=F64
    )
    shared = torch.tensor([[3, 1, 2, 5], [1, 2, 1, 1], [2, 1, 3, 2], [5, 1, 2, 4]], dtype=F64)
    scores = mean_scores(distances, shared, torch.tensor([0, 0, 1, 1]))
    # Client 2 to group 0: (2 * 0.8 + 1 * 0.6) / 3; client 0 to group 1: only client 2 is known.
    expected = torch.tensor([[0.2, 0.8], [0.2, 0.5], [2.2 / 3, 0.1], [0.4, 0.1]], dtype=F64)
    assert_close(scores, expected)
    # A group with no other member (or no known one) scores +inf.
    alone = mean_scores(distances, shared, torch.tensor([0, 1, 1, 1]))
    assert alone[0, 0] == torch.inf and alone[1, 0] == pytest.approx(0.2)
    assert confident(scores, 0.3).tolist() == [True, False, True, True]  # 0.2 < 0.24, 0.2 >= 0.15, ...


def test_mean_assignment_moves_a_client_that_only_its_medoid_pair_put_in_a_group():
    # Clients 0, 1 and 3, 4 are pairs; client 2 is 0.3 from client 0 on one shared label, but 0.9
    # from client 1 and 0.4 from clients 3 and 4 on three.
    d = torch.full((5, 5), 0.9, dtype=F64)
    d.fill_diagonal_(0.0)
    d[0, 1] = d[1, 0] = d[3, 4] = d[4, 3] = 0.1
    d[2, 0] = d[0, 2] = 0.3
    d[2, 3] = d[3, 2] = d[2, 4] = d[4, 2] = 0.4
    w = torch.ones(5, 5, dtype=F64)
    w[2, 1] = w[1, 2] = w[2, 3] = w[3, 2] = w[2, 4] = w[4, 2] = 3.0
    start = torch.tensor([0, 0, 0, 1, 1])
    # Client 2 to group 0: (0.3 + 3 * 0.9) / 4 = 0.75, to group 1: 0.4. Then client 0 stays
    # (0.1 against (0.3 + 0.9 + 0.9) / 3 = 0.7), client 3 too (0.9 against (3 * 0.4 + 0.1) / 4).
    assert mean_distance_groups(d, w, start).tolist() == [0, 0, 1, 1, 1]
    # The medoid of {0, 1, 2} is client 0 (total distance 0.4), so by medoids client 2 stays.
    assert_close(medoid_scores(d, start)[2], torch.tensor([0.3, 0.4], dtype=F64))


def _ambiguous_state(hold: int, late_round: int | None = None) -> tuple[ClientState, ConceptGrouping]:
    """Clients 0-2 predict label 0 as 0, client 3 as 1, client 4 half and half; two clusters."""
    rule = ConceptGrouping(group_round=2, share=0.8, margin=0.5, hold=hold, late_round=late_round)
    state = ClientState.initial(5, 2, 2, rule.state_entries())
    state.seen[:] = True
    state.extra[SIGNATURE][:3, 0] = torch.tensor([0.9, 0.1], dtype=F64)
    state.extra[SIGNATURE][3, 0] = torch.tensor([0.1, 0.9], dtype=F64)
    state.extra[SIGNATURE][4, 0] = torch.tensor([0.5, 0.5], dtype=F64)
    state.extra[SIGNATURE_ROWS][:, 0] = 5.0
    state.omega[:3] = torch.tensor([0.3, 0.7], dtype=F64)
    return state, rule


def test_a_client_equally_close_to_two_groups_is_left_at_uniform_omega_and_not_held():
    state, rule = _ambiguous_state(hold=3)
    reassign, held, note = rule.actions(state, 1)
    assert isinstance(reassign, Reassign) and isinstance(held, SetState) and isinstance(note, Note)
    assert reassign.clients.tolist() == [0, 1, 2, 3, 4]
    # Client 4's centred row is orthogonal to both others' (distance 1 to each): ratio 1, not < 0.5.
    # Clients 0-2 held 0.7 on cluster 1, so their group takes cluster 1.
    expected = torch.tensor([[0.2, 0.8]] * 3 + [[0.8, 0.2], [0.5, 0.5]], dtype=F64)
    assert_close(reassign.omega, expected)
    assert held.name == HELD and held.value.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert "grouped 4 of 5 clients" in note.text
    # Without hold, no flag to set (and no such entry declared).
    state, rule = _ambiguous_state(hold=0)
    assert [type(a) for a in rule.actions(state, 1)] == [Reassign, Note] and HELD not in state.extra


def test_a_held_client_gives_every_sample_its_omega_over_the_alive_clusters():
    report = held_report(
        torch.tensor([0.6, 0.3, 0.1], dtype=F64),
        torch.tensor([True, True, False]),
        torch.tensor([0, 1, 1]),
        2,
    )
    third = torch.tensor([2 / 3, 1 / 3, 0.0], dtype=F64)
    assert_close(report.gamma, third.expand(3, -1))
    assert_close(report.omega, third)
    assert_close(report.label_sums, torch.stack([third, 2 * third]))


def test_a_ramped_held_client_blends_the_e_step_gamma_with_its_omega():
    gamma = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.8, 0.0], [0.0, 0.0, 1.0]], dtype=F64)
    report = held_report(
        torch.tensor([0.6, 0.3, 0.1], dtype=F64),
        torch.tensor([True, True, False]),
        torch.tensor([0, 1, 1]),
        2,
        gamma,
        0.25,
    )
    # 0.25 · (2/3, 1/3, 0) + 0.75 · γ, row by row; the dead cluster's γ (row 2) stays as given.
    expected = torch.tensor(
        [[11 / 12, 1 / 12, 0.0], [1 / 6 + 0.15, 1 / 12 + 0.6, 0.0], [1 / 6, 1 / 12, 0.75]], dtype=F64
    )
    assert_close(report.gamma, expected)
    assert_close(report.omega, torch.tensor([2 / 3, 1 / 3, 0.0], dtype=F64))  # ω stays as held
    assert_close(report.label_sums, torch.stack([expected[0], expected[1] + expected[2]]))
    with pytest.raises(ValueError, match="pass e_step_gamma"):
        alive = torch.ones(2, dtype=torch.bool)
        held_report(torch.ones(2, dtype=F64), alive, torch.tensor([0]), 2, weight=0.5)


def test_the_ramp_raises_omega_s_weight_over_its_rounds_for_both_passes():
    rule = ConceptGrouping(group_round=2, margin=0.7, hold=4, ramp=3, late_round=5)
    grouped, late = ({HELD: torch.tensor(flag, dtype=F64)} for flag in (GROUPED, LATE))
    assert [rule.hold_weight(r, grouped) for r in range(1, 8)] == [None, 0.25, 0.5, 0.75, 1.0, None, None]
    assert [rule.hold_weight(r, late) for r in range(4, 10)] == [None, 0.25, 0.5, 0.75, 1.0, None]
    assert rule.hold_weight(3, {HELD: torch.tensor(0.0, dtype=F64)}) is None
    # Without a ramp every held round has weight 1 (γ = ω).
    plain = ConceptGrouping(group_round=2, hold=2)
    assert [plain.hold_weight(r, grouped) for r in range(1, 5)] == [None, 1.0, 1.0, None]


def test_fedrc_blends_the_e_step_gamma_in_the_ramp_rounds():
    rule = FedRC(2, group_round=2, group_hold=3, group_ramp=1)
    losses = torch.tensor([[0.1, 3.0], [2.0, 0.2]], dtype=F64)
    labels = torch.tensor([0, 1])
    omega = torch.tensor([0.9, 0.1], dtype=F64)
    extra = {name: value[0].clone() for name, value in store(rule, 1).extra.items()}
    extra[HELD] = torch.tensor(GROUPED, dtype=F64)
    context = ClientContext(
        client=0, round_index=2, num_samples=2, num_classes=2, omega=omega,
        active=torch.ones(2, dtype=torch.bool), extra=extra,
    )  # fmt: skip
    report = rule.e_step(losses, labels, context, torch.zeros(2, 2, dtype=F64))
    # Held round 1 of a 1-round ramp: γ = ½ ω + ½ (the E-step's γ with prior ω, C uniform).
    e_step = torch.stack(
        [omega * torch.exp(-losses[i]) / (omega * torch.exp(-losses[i])).sum() for i in range(2)]
    )
    assert_close(report.gamma, 0.5 * omega.expand(2, -1) + 0.5 * e_step)
    assert_close(report.omega, omega)
    # The next held round: γ = ω.
    report = rule.e_step(losses, labels, replace(context, round_index=3), torch.zeros(2, 2, dtype=F64))
    assert_close(report.gamma, omega.expand(2, -1))


def test_fedrc_holds_only_flagged_clients_and_only_in_the_hold_rounds():
    rule = FedRC(2, group_round=2, group_hold=2)
    assert [e.name for e in rule.state_entries()] == [SIGNATURE, SIGNATURE_ROWS, HELD]
    losses = torch.tensor([[0.1, 3.0], [2.0, 0.2]], dtype=F64)
    labels = torch.tensor([0, 1])
    for round_index, flag, held in (
        (1, 1.0, False),
        (2, 1.0, True),
        (3, 1.0, True),
        (4, 1.0, False),
        (2, 0.0, False),
    ):
        extra = {name: value[0].clone() for name, value in store(rule, 1).extra.items()}
        extra[HELD] = torch.tensor(flag, dtype=F64)
        context = ClientContext(
            client=0,
            round_index=round_index,
            num_samples=2,
            num_classes=2,
            omega=torch.tensor([0.9, 0.1], dtype=F64),
            active=torch.ones(2, dtype=torch.bool),
            extra=extra,
        )
        report = rule.e_step(losses, labels, context, torch.zeros(2, 2, dtype=F64))
        if held:
            assert_close(report.gamma, torch.tensor([[0.9, 0.1], [0.9, 0.1]], dtype=F64))
            assert_close(report.omega, torch.tensor([0.9, 0.1], dtype=F64))
        else:  # the E-step: γ of sample 1 in cluster 1 is 0.1 e^-0.2 / (0.1 e^-0.2 + 0.9 e^-2)
            expected = 0.1 * math.exp(-0.2) / (0.1 * math.exp(-0.2) + 0.9 * math.exp(-2.0))
            assert float(report.gamma[1, 1]) == pytest.approx(expected)


# --- through a fit -------------------------------------------------------------------------------------


def _grouped_fit(rounds: int, executor: str = "loop", grouping=None, **trainer_options):
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(
        3,
        clients_per_round=6,
        local_steps=2,
        group_round=2,
        group_share=0.8,
        executor=executor,
        **(grouping or {}),
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


ROBUST = {"group_assign": "mean", "group_margin": 0.9, "group_hold": 2}
LATE_PASS = {**ROBUST, "group_margin": 0.95, "group_late_round": 3}
RAMP = {**ROBUST, "group_hold": 3, "group_ramp": 2}


@pytest.mark.parametrize(
    ("grouping", "epoch"),
    [({}, 0), (ROBUST, 2), (LATE_PASS, 1), (LATE_PASS, 3), (RAMP, 2)],
    ids=["before", "in-the-hold", "before-the-late-pass", "in-the-late-hold", "in-the-ramp"],
)
def test_grouping_resumes_exactly_from_a_round_checkpoint(tmp_path, grouping, epoch):
    from lightning.pytorch.callbacks import ModelCheckpoint

    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    straight = _grouped_fit(5, grouping=grouping)
    _grouped_fit(
        epoch + 1,
        grouping=grouping,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)],
    )
    (checkpoint,) = tmp_path.glob(f"epoch={epoch}-*.ckpt")
    torch.manual_seed(0)
    strategy = lf.FedRCStrategy(
        3, clients_per_round=6, local_steps=2, group_round=2, group_share=0.8, executor="loop", **grouping
    )
    resumed = make_trainer(strategy, max_epochs=5)
    resumed.fit(
        MLPClassifier(lr=0.2),
        datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0),
        ckpt_path=checkpoint,
    )
    assert_same_fit(straight, resumed)


def test_held_clients_keep_their_grouped_omega_for_the_hold_rounds_then_move():
    held = _grouped_fit(4, grouping=ROBUST).lightning_module.client_state
    flagged = held.extra[HELD] > 0
    assert bool(flagged.any())
    # Rounds 3 and 4 (indices 2, 3) are held: every flagged client still has exactly 0.8.
    assert_close(held.omega[flagged].max(1).values, torch.full((int(flagged.sum()),), 0.8, dtype=F64))
    # Unflagged seen clients got uniform ω at the grouping and then their own E-step.
    assert not bool(((held.omega[held.seen & ~flagged] - 1 / 3).abs() < 1e-12).all())
    # Without the hold, or one round after it, the E-step moves the round's clients.
    free = _grouped_fit(4, grouping={**ROBUST, "group_hold": 0}).lightning_module.client_state
    assert not bool((free.omega[flagged].max(1).values == 0.8).all())
    after = _grouped_fit(5, grouping=ROBUST).lightning_module.client_state
    assert not bool((after.omega[flagged].max(1).values == 0.8).all())
    # A ramp keeps the held ω but trains on other γ: the models differ from the plain hold's.
    ramped = _grouped_fit(4, grouping={**ROBUST, "group_ramp": 1}).lightning_module
    assert torch.equal(ramped.client_state.extra[HELD], held.extra[HELD])
    assert torch.equal(ramped.client_state.omega[flagged], held.omega[flagged])
    plain = _grouped_fit(4, grouping=ROBUST).lightning_module
    assert any(
        not torch.equal(tensor, plain.state_dict()[name]) for name, tensor in ramped.state_dict().items()
    )


@pytest.mark.parametrize("grouping", [ROBUST, RAMP], ids=["held", "ramped"])
def test_robust_grouping_is_the_same_on_the_loop_and_the_vectorised_executor(grouping):
    loop, vectorized = (
        _grouped_fit(5, executor, grouping=grouping).lightning_module for executor in ("loop", "vectorized")
    )
    assert loop.executor == "loop" and vectorized.executor == "vectorized"
    for name, tensor in loop.state_dict().items():
        assert_close(vectorized.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    assert_close(vectorized.client_state.omega, loop.client_state.omega, atol=1e-5, rtol=0)
    assert torch.equal(vectorized.client_state.extra[HELD], loop.client_state.extra[HELD])


# --- the late pass ---------------------------------------------------------------------------------


def test_late_pass_picks_the_cluster_whose_grouped_members_are_closest_on_average():
    # Clients 0, 1 grouped in cluster 1, client 2 in cluster 0 (its ω is largest on cluster 2, which
    # is dead); clients 3 and 4 ungrouped (their own ω: argmax cluster 0).
    d = torch.tensor(
        [
            [0.0, 0.1, 0.9, 0.2, 0.5],
            [0.1, 0.0, 0.9, 0.6, 0.5],
            [0.9, 0.9, 0.0, 0.45, 0.6],
            [0.2, 0.6, 0.45, 0.0, 0.0],
            [0.5, 0.5, 0.6, 0.0, 0.0],
        ],
        dtype=F64,
    )
    w = torch.ones(5, 5, dtype=F64)
    w[3, 1] = w[1, 3] = w[3, 4] = w[4, 3] = 3.0
    w[3, 2] = w[2, 3] = 2.0
    omega = torch.tensor(
        [[0.1, 0.8, 0.1], [0.1, 0.8, 0.1], [0.3, 0.2, 0.5], [0.4, 0.3, 0.3], [0.4, 0.3, 0.3]], dtype=F64
    )
    active = torch.tensor([True, True, False])
    grouped = torch.tensor([True, True, True, False, False])
    clusters = late_clusters(d, w, omega, active, grouped)
    # Client 3: cluster 1 (1 * 0.2 + 3 * 0.6) / 4 = 0.5, cluster 0 0.45 -> 0 (unweighted: 0.4 -> 1).
    # Client 4: cluster 1 0.5, cluster 0 0.6 -> 1; client 3 (distance 0) does not vote.
    assert clusters[3:].tolist() == [0, 1]
    assert late_clusters(d, torch.ones(5, 5, dtype=F64), omega, active, grouped)[3] == 1
    # No grouped member shares a label with client 4: -1.
    w[4, :3] = w[:3, 4] = 0.0
    assert late_clusters(d, w, omega, active, grouped)[4] == -1


def test_late_pass_places_the_clients_the_margin_left_out_and_holds_them_from_its_round():
    state, rule = _ambiguous_state(hold=2, late_round=4)
    assert rule.actions(state, 2) == []  # between the passes: nothing
    reassign, held, _ = rule.actions(state, 1)  # the first pass leaves client 4 (distance 1 to both)
    state.omega[reassign.clients] = reassign.omega
    state.extra[HELD] = held.value
    assert held.value.tolist() == [GROUPED] * 4 + [0.0]
    # By round 3 client 4's label-0 row leans to label 1, as client 3's (cluster 0) does.
    state.extra[SIGNATURE][4, 0] = torch.tensor([0.3, 0.7], dtype=F64)
    reassign, held, note = rule.actions(state, 3)
    assert reassign.clients.tolist() == [4]
    assert_close(reassign.omega, torch.tensor([[0.8, 0.2]], dtype=F64))
    assert held.name == HELD and held.value.tolist() == [GROUPED] * 4 + [LATE]
    assert "placed 1 ungrouped clients in clusters [0]" in note.text
    # Signatures until the late pass; the first pass's clients held in rounds 2-3, the late one in 4-5.
    assert [rule.wants_signature(r) for r in (1, 3, 4)] == [True, True, False]
    for flag, rounds in ((GROUPED, {2, 3}), (LATE, {4, 5}), (0.0, set())):
        extra = {HELD: torch.tensor(flag, dtype=F64)}
        assert {r for r in range(8) if rule.holds(r, extra)} == rounds
    # Nothing left to place: a note only.
    state.extra[HELD][4] = LATE
    (note,) = rule.actions(state, 3)
    assert "no ungrouped client" in note.text


def test_late_pass_options_are_checked():
    for late in (2, 1, 2.5, True):
        with pytest.raises(ValueError, match="group_late_round must be an integer above group_round=2"):
            ConceptGrouping(group_round=2, margin=0.7, late_round=late)
    with pytest.raises(ValueError, match="group_late_round has no effect without group_margin"):
        ConceptGrouping(group_round=2, late_round=4)
    with pytest.raises(ValueError, match="group_late_round=5 has no effect without group_round"):
        FedRC(3, group_late_round=5)
    # Without hold the flags are still kept (the late pass must know who was grouped).
    assert HELD in [e.name for e in ConceptGrouping(2, margin=0.7, late_round=4).state_entries()]


def test_late_pass_is_the_same_on_the_loop_and_the_vectorised_executor():
    loop, vectorized = (
        _grouped_fit(5, executor, grouping=LATE_PASS).lightning_module for executor in ("loop", "vectorized")
    )
    flags = loop.client_state.extra[HELD]
    assert bool((flags == LATE).any()) and bool((flags == GROUPED).any())
    for name, tensor in loop.state_dict().items():
        assert_close(vectorized.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    assert_close(vectorized.client_state.omega, loop.client_state.omega, atol=1e-5, rtol=0)
    assert torch.equal(vectorized.client_state.extra[HELD], flags)
