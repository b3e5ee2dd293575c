"""algorithms/discovery/grouping.py: concept grouping (a take-off option of FedRC) against hand computations:
the client signature, the group-to-cluster matching and the grouped ω, the choice of the group
count, when it acts, and its wiring into FedRC's E-step and server step; the mean-distance
assignment, the margin, the hold after the grouping, and the late pass for the ungrouped clients."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.actions import Note, Reassign, RemoveClusters, SetState
from lightning_fedcluster.algorithms.base import ClientContext
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.discovery.grouping import (
    GROUPED,
    HELD,
    LATE,
    RELEASED,
    SIGNATURE,
    SIGNATURE_ROWS,
    ConceptGrouping,
    held_report,
)
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.group_scores import cluster_omega, group_clusters
from lightning_fedcluster.algorithms.server_view import RoundOutcome
from tests.helpers.algorithms import server_view, store, view_at
from tests.helpers.weights import assert_same_fit

F64 = torch.float64


def grouped_omega(groups, omega, active, share):
    """The grouping's ω for grouped clients: ``share`` on the cluster their group was matched to."""
    return cluster_omega(group_clusters(groups, omega, active), active, share)


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


def _state_with_signatures(
    first: tuple[float, ...] = (0.2, 0.5, 0.3),
    second: tuple[float, ...] = (0.5, 0.2, 0.3),
    alike: bool = False,
) -> ClientState:
    """Five seen clients: two signatures (label 0 predicted as 0 by clients 0-2, or as 1 by 3 and
    4; as 0 by all five when ``alike``), three alive clusters; ω ``first`` for clients 0-2,
    ``second`` for 3 and 4."""
    state = ClientState.initial(5, 2, 3, ConceptGrouping(group_round=4).state_entries(3))
    state.seen[:] = True
    state.extra[SIGNATURE][:, 0] = torch.tensor([0.9, 0.1], dtype=F64)
    if not alike:
        state.extra[SIGNATURE][3:, 0] = torch.tensor([0.1, 0.9], dtype=F64)
    state.extra[SIGNATURE_ROWS][:, 0] = 5.0
    state.omega[:3] = torch.tensor(first, dtype=F64)
    state.omega[3:] = torch.tensor(second, dtype=F64)
    return state


def test_grouping_acts_once_after_its_round_and_only_on_clients_with_signatures():
    state = _state_with_signatures()
    rule = ConceptGrouping(group_round=4, share=0.8)
    assert rule.actions(view_at(state, 2)) == [] and rule.actions(view_at(state, 4)) == []
    state.extra[SIGNATURE_ROWS][4] = 0.0  # client 4 never computed a signature
    actions = rule.actions(view_at(state, 3))
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


def _ambiguous_state(hold: int, late_round: int | None = None) -> tuple[ClientState, ConceptGrouping]:
    """Clients 0-2 predict label 0 as 0, client 3 as 1, client 4 half and half; two clusters."""
    rule = ConceptGrouping(group_round=2, share=0.8, margin=0.5, hold=hold, late_round=late_round)
    state = ClientState.initial(5, 2, 2, rule.state_entries(2))
    state.seen[:] = True
    state.extra[SIGNATURE][:3, 0] = torch.tensor([0.9, 0.1], dtype=F64)
    state.extra[SIGNATURE][3, 0] = torch.tensor([0.1, 0.9], dtype=F64)
    state.extra[SIGNATURE][4, 0] = torch.tensor([0.5, 0.5], dtype=F64)
    state.extra[SIGNATURE_ROWS][:, 0] = 5.0
    state.omega[:3] = torch.tensor([0.3, 0.7], dtype=F64)
    return state, rule


def test_a_client_equally_close_to_two_groups_is_left_at_uniform_omega_and_not_held():
    state, rule = _ambiguous_state(hold=3)
    reassign, held, note = rule.actions(view_at(state, 1))
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
    assert [type(a) for a in rule.actions(view_at(state, 1))] == [Reassign, Note] and HELD not in state.extra


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


def _rule_options(grouping: dict | None) -> dict:
    """``grouping``'s FedRC options (all but the strategy's ``gradient_clip_val``)."""
    return {name: value for name, value in (grouping or {}).items() if name != "gradient_clip_val"}


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
        config=FedRC.Config(group_round=2, group_share=0.8, **_rule_options(grouping)),
        gradient_clip_val=(grouping or {}).get("gradient_clip_val"),
        executor=executor,
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
RAMP_RETIRE = {**RAMP, "group_retire": 0.2}  # on this fit the grouping retires one of the 3 clusters
# Released from the hold whenever another cluster scores higher (hold_release.py): some clients are.
RELEASING = {**ROBUST, "group_hold": 3, "group_release": 0.0, "group_release_rounds": 1}
# The server weighs copies by N_i · (3/4 + ω_ik/4) in round index 3 (omega_weighting_from, the first
# resumed) and by N_i · (1/2 + ω_ik/2) from 4 on (a one-round omega_weighting_ramp to strength 1/2).
# The ω weighting, and every local gradient clipped (the strategy's gradient_clip_val): a setting
# that changes the weights, resumed with the rest.
OMEGA_WEIGHTED = {
    **RELEASING,
    "omega_weighting_from": 3,
    "omega_weighting_ramp": 1,
    "omega_weighting_strength": 0.5,
    "gradient_clip_val": 0.5,
}


@pytest.mark.parametrize(
    ("grouping", "epoch"),
    [
        ({}, 0), (ROBUST, 2), (LATE_PASS, 1), (LATE_PASS, 3), (RAMP_RETIRE, 2), (RELEASING, 2),
        (RELEASING, 3), (OMEGA_WEIGHTED, 2),
    ],
    ids=[
        "before", "in-the-hold", "before-the-late-pass", "in-the-late-hold", "in-the-ramp-after-retiring",
        "between-releases", "after-releases", "omega-weighted-from-the-resumed-round",
    ],
)  # fmt: skip
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
        3,
        clients_per_round=6,
        local_steps=2,
        config=FedRC.Config(group_round=2, group_share=0.8, **_rule_options(grouping)),
        gradient_clip_val=grouping.get("gradient_clip_val"),
        executor="loop",
    )
    resumed = make_trainer(strategy, max_epochs=5)
    resumed.fit(
        MLPClassifier(lr=0.2),
        datamodule=DigitsFederated(num_clients=9, concepts=3, seed=0),
        ckpt_path=checkpoint,
    )
    assert_same_fit(straight, resumed)
    if grouping is RAMP_RETIRE:
        assert int(resumed.lightning_module.client_state.active.sum()) == 2


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


@pytest.mark.parametrize("grouping", [ROBUST, RAMP, RELEASING], ids=["held", "ramped", "released"])
def test_robust_grouping_is_the_same_on_the_loop_and_the_vectorised_executor(grouping):
    loop, vectorized = (
        _grouped_fit(5, executor, grouping=grouping).lightning_module for executor in ("loop", "vectorized")
    )
    assert loop.executor == "loop" and vectorized.executor == "vectorized"
    for name, tensor in loop.state_dict().items():
        assert_close(vectorized.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    assert_close(vectorized.client_state.omega, loop.client_state.omega, atol=1e-5, rtol=0)
    assert torch.equal(vectorized.client_state.extra[HELD], loop.client_state.extra[HELD])
    if grouping is RELEASING:
        assert bool((loop.client_state.extra[HELD] == RELEASED).any())


# --- the late pass ---------------------------------------------------------------------------------


def test_late_pass_places_the_clients_the_margin_left_out_and_holds_them_from_its_round():
    state, rule = _ambiguous_state(hold=2, late_round=4)
    assert rule.actions(view_at(state, 2)) == []  # between the passes: nothing
    reassign, held, _ = rule.actions(view_at(state, 1))  # the first pass leaves client 4 (distance 1 to both)
    state.omega[reassign.clients] = reassign.omega
    state.extra[HELD] = held.value
    assert held.value.tolist() == [GROUPED] * 4 + [0.0]
    # By round 3 client 4's label-0 row leans to label 1, as client 3's (cluster 0) does.
    state.extra[SIGNATURE][4, 0] = torch.tensor([0.3, 0.7], dtype=F64)
    reassign, held, note = rule.actions(view_at(state, 3))
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
    (note,) = rule.actions(view_at(state, 3))
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
    assert HELD in [e.name for e in ConceptGrouping(2, margin=0.7, late_round=4).state_entries(3)]


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


RETIRE_OMEGA = ((0.6, 0.2, 0.2), (0.2, 0.2, 0.6))  # group {0, 1, 2} takes cluster 0, {3, 4} cluster 2


def test_group_retire_retires_the_clusters_no_group_went_to_when_there_are_two_groups_or_more():
    state = _state_with_signatures(*RETIRE_OMEGA)
    rule = ConceptGrouping(group_round=4, assign="mean", retire=0.0)
    actions = rule.actions(view_at(state, 3))
    assert [type(a) for a in actions] == [Reassign, Note, RemoveClusters, Note]
    reassign, remove = actions[0], actions[2]
    assert reassign.omega.argmax(1).tolist() == [0, 0, 0, 2, 2]
    assert remove.mask.tolist() == [False, True, False]  # no group went to cluster 1
    state.omega[reassign.clients] = reassign.omega
    state.remove_clusters(remove.mask)
    # 0.9 on the group's cluster and 0.1 / 2 on each other one, renormalised over the two kept:
    # 0.9 / (0.9 + 0.05) = 18 / 19 and 0.05 / (0.9 + 0.05) = 1 / 19.
    expected = torch.tensor([[18 / 19, 0.0, 1 / 19]] * 3 + [[1 / 19, 0.0, 18 / 19]] * 2, dtype=F64)
    assert_close(state.omega, expected)
    # With the margin the same groups are sure (their best score is 0), and the same is retired.
    margin = replace(rule, margin=0.7).actions(view_at(_state_with_signatures(*RETIRE_OMEGA), 3))
    assert [type(a) for a in margin] == [Reassign, Note, RemoveClusters, Note]
    assert margin[2].mask.tolist() == [False, True, False]
    # Without the option nothing is retired; with one group (all five alike) neither.
    without = replace(rule, retire=None).actions(view_at(_state_with_signatures(*RETIRE_OMEGA), 3))
    assert [type(a) for a in without] == [Reassign, Note]
    one_group = rule.actions(view_at(_state_with_signatures(*RETIRE_OMEGA, alike=True), 3))
    assert [type(a) for a in one_group] == [Reassign, Note]
    assert one_group[0].omega.argmax(1).unique().numel() == 1


def test_group_retire_gives_no_cluster_to_a_group_under_its_share_of_the_rows():
    """Three pairs of clients, each pair predicting label 0 as a different class (A, B, C), three
    alive clusters; pairs A and B hold 20 rows each per client, pair C 5: 10 of the 90 rows."""
    state = ClientState.initial(6, 3, 3, ConceptGrouping(group_round=4).state_entries(3))
    state.seen[:] = True
    for pair, rows in ((0, 20.0), (1, 20.0), (2, 5.0)):
        members = slice(2 * pair, 2 * pair + 2)
        one_hot = torch.nn.functional.one_hot(torch.tensor(pair), 3).to(F64)
        state.extra[SIGNATURE][members, 0] = 0.1 + 0.7 * one_hot  # label 0 predicted as the pair's class
        state.extra[SIGNATURE_ROWS][members, 0] = rows
        state.omega[members] = 0.2 + 0.4 * one_hot
    rule = ConceptGrouping(group_round=4, margin=0.7, retire=0.12)
    reassign, note, remove, _ = rule.actions(view_at(state, 3))
    assert "grouped 4 of 6 clients" in note.text
    assert reassign.omega[:4].argmax(1).tolist() == [0, 0, 1, 1]
    assert_close(reassign.omega[4:], torch.full((2, 3), 1 / 3, dtype=F64))  # left for the late pass
    assert remove.mask.tolist() == [False, False, True]  # pair C's 10 / 90 = 0.111 < 0.12
    # At a share of 0.11 pair C keeps cluster 2 and no cluster is spare.
    kept = replace(rule, retire=0.11).actions(view_at(state, 3))
    assert [type(a) for a in kept] == [Reassign, Note]
    assert kept[0].omega.argmax(1).tolist() == [0, 0, 1, 1, 2, 2]


def test_group_retire_is_checked():
    for retire in (-0.1, 1.0, True, "0.1"):
        with pytest.raises(ValueError, match="group_retire must be a share of the rows in"):
            ConceptGrouping(group_round=3, margin=0.7, retire=retire)
    with pytest.raises(ValueError, match="group_retire=0.1 leaves small groups' clients ungrouped"):
        ConceptGrouping(group_round=3, retire=0.1)
    with pytest.raises(ValueError, match="group_retire=0.1 has no effect without group_round"):
        FedRC(3, group_retire=0.1)
    assert FedRC(3, group_round=3, group_retire=0).config.grouping.retire == 0


def test_the_component_refuses_a_rule_it_cannot_serve():
    from lightning_fedcluster.algorithms.ifca import IFCA

    grouping = ConceptGrouping(group_round=2)
    with pytest.raises(ValueError, match="group_round cannot be combined with adam_gamma"):
        FedRC(3, adam_gamma=True, components=(grouping,))
    with pytest.raises(ValueError, match="ConceptGrouping reads the models' outputs"):
        IFCA(3, components=(grouping,))
    assert FedRC(3, components=(grouping,)).uses_client_outputs
    assert FedRC(3, group_round=2).components == (grouping,)
