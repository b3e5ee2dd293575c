"""The rules of IFCA, FeSEM/WeCFL, FedProx, FedSoft, CFL and FedRC's options, each against a hand
computation on tiny tensors, plus the edge cases: removed clusters, empty clusters, zero weights."""

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms import IFCA, FedProx, FeSEM, initial_assignment
from lightning_fedcluster.algorithms.actions import Reassign, RoundOutcome, SetCentre, SetState
from lightning_fedcluster.algorithms.base import Algorithm, ClientContext, ClientReport, Contribution
from lightning_fedcluster.algorithms.cfl import CFL, bipartition, cosine_similarity_matrix, split_decision
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.dfedem import DFedEM, metropolis_weights, random_connected_graph
from lightning_fedcluster.algorithms.fedrc import FedRC, adam_gamma_step, clusters_to_remove
from lightning_fedcluster.algorithms.fedsoft import (
    FedSoft,
    importance_weights,
    select_clients,
    selection_probabilities,
)
from lightning_fedcluster.engine.round_buffer import RoundBuffer

F64 = torch.float64
TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def t(values, dtype=F64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def ctx(
    omega, *, num_classes=2, num_samples=4, client=0, active=None, seen=False, extra=None, seed=0,
    membership=None,
):
    omega = torch.as_tensor(omega, dtype=F64)
    active = torch.ones(len(omega), dtype=torch.bool) if active is None else torch.tensor(active)
    return ClientContext(
        client=client,
        round_index=0,
        num_samples=num_samples,
        num_classes=num_classes,
        omega=omega,
        active=active,
        seen=seen,
        generator=torch.Generator().manual_seed(seed),
        extra=dict(extra or {}),
        membership=membership,
    )


# --- IFCA --------------------------------------------------------------------------------------------


def test_ifca_picks_lowest_mean_loss_and_trains_only_it():
    losses = t([[1.0, 3.0, 2.0], [1.0, 0.0, 5.0]])  # means 1.0, 1.5, 3.5
    rule, context = IFCA(3), ctx([1 / 3] * 3, num_samples=2)
    report = rule.e_step(losses, torch.tensor([0, 1]), context, None)
    assert torch.equal(report.omega, t([1.0, 0, 0]))
    assert torch.equal(report.label_sums, t([[1.0, 0, 0], [1.0, 0, 0]]))
    plan = rule.local_plan(report, context)
    assert plan.clusters == (0,) and plan.sample_weights is None
    assert rule.contributions(report, plan, context) == [Contribution(0, 0, 2.0)]


def test_ifca_ties_go_to_the_lowest_index_and_removed_clusters_never_win():
    rule = IFCA(3)
    tie = rule.e_step(t([[2.0, 1.0, 1.0]]), torch.tensor([0]), ctx([1 / 3] * 3), None)
    assert torch.equal(tie.omega, t([0, 1.0, 0]))
    masked = rule.e_step(
        t([[2.0, 1.0, 1.0]]), torch.tensor([0]), ctx([1 / 3] * 3, active=[True, False, True]), None
    )
    assert torch.equal(masked.omega, t([0, 0, 1.0]))


def test_ifca_unseen_client_takes_the_lowest_loss_model():
    omega = IFCA(2).unseen_client_mixture(t([[3.0, 1.0], [3.0, 2.0]]), torch.tensor([0, 1]), None)
    assert torch.equal(omega, t([0, 1.0]))
    assert IFCA(2).prediction_weights(t([0.2, 0.8])).tolist() == [0.0, 1.0]


# --- FeSEM / WeCFL ------------------------------------------------------------------------------------


def test_fesem_first_assignment_is_seeded_and_then_kept():
    rule = FeSEM(3, seed=5)
    first = rule.e_step(t([[0.0, 0.0, 0.0]]), torch.tensor([0]), ctx([1 / 3] * 3, client=7), None)
    k = initial_assignment(5, 7, torch.ones(3, dtype=torch.bool))
    assert torch.equal(first.omega, torch.nn.functional.one_hot(torch.tensor(k), 3).double())
    # Deterministic, and different clients spread over clusters.
    draws = {initial_assignment(5, c, torch.ones(3, dtype=torch.bool)) for c in range(30)}
    assert draws == {0, 1, 2}
    kept = rule.e_step(t([[0.0, 0.0, 0.0]]), torch.tensor([0]), ctx([0, 0, 1.0], seen=True), None)
    assert torch.equal(kept.omega, t([0, 0, 1.0]))
    # A client whose cluster was removed draws again among the survivors.
    moved = rule.e_step(
        t([[0.0, 0.0, 0.0]]),
        torch.tensor([0]),
        ctx([0, 0, 1.0], seen=True, active=[True, False, False]),
        None,
    )
    assert torch.equal(moved.omega, t([1.0, 0, 0]))


@pytest.mark.parametrize(("weighted", "weight"), [(False, 1.0), (True, 4.0)])
def test_fesem_reassigns_to_the_nearest_centre_with_fesem_or_wecfl_weight(weighted, weight):
    rule = FeSEM(3, weighted=weighted)
    context = ctx([1.0, 0, 0], seen=True, num_samples=4)
    report = rule.e_step(t([[0.0, 0.0, 0.0]] * 4), torch.tensor([0, 1, 0, 1]), context, None)
    plan = rule.local_plan(report, context)
    assert plan.clusters == (0,)
    moved = rule.reassign(report, t([5.0, 0.5, 2.0]), context)
    assert torch.equal(moved.omega, t([0, 1.0, 0]))
    # Trained copy 0 goes into its new cluster 1: Δ = θ_local − θ_1.
    assert rule.contributions(moved, plan, context) == [Contribution(0, 1, weight)]
    masked = rule.reassign(report, t([5.0, 0.5, 2.0]), ctx([1.0, 0, 0], active=[True, False, True]))
    assert torch.equal(masked.omega, t([0, 0, 1.0]))


def test_fesem_representation_layers():
    names = ["features.0.weight", "features.0.bias", "head.weight", "head.bias"]
    assert FeSEM(2).representation_mask(names) == [True] * 4
    assert FeSEM(2, representation_layers=("head",)).representation_mask(names) == [False, False, True, True]
    with pytest.raises(ValueError, match="representation_layers"):
        FeSEM(2, representation_layers=("nothing",)).representation_mask(names)


# --- FedProx / FedAvg -----------------------------------------------------------------------------------


def test_fedprox_plan_anchors_to_the_global_model():
    report = FedProx(0.5).e_step(t([[1.0], [2.0]]), torch.tensor([0, 1]), ctx([1.0], num_samples=2), None)
    assert FedProx(0.5).local_plan(report, ctx([1.0])).proximal == (((0, 0.5),),)
    assert FedProx(0.0).local_plan(report, ctx([1.0])).proximal == ()
    assert FedProx(0.0).contributions(
        report, FedProx(0.0).local_plan(report, ctx([1.0])), ctx([1.0], num_samples=2)
    ) == [Contribution(0, 0, 2.0)]


# --- FedSoft ---------------------------------------------------------------------------------------------


def test_fedsoft_importance_weights_by_hand():
    # argmin per sample: 0, 1, 0, 0 (tie → lowest index) → n = [3, 1], u = [0.75, 0.25]
    losses = t([[1.0, 2.0], [3.0, 0.0], [0.0, 5.0], [2.0, 2.0]])
    assert_close(importance_weights(losses, torch.ones(2, dtype=torch.bool)), t([0.75, 0.25]), **TIGHT)
    # A cluster that wins no sample gets the smoother σ.
    assert_close(
        importance_weights(t([[0.0, 1.0]] * 3), torch.ones(2, dtype=torch.bool), 1e-4), t([1.0, 1e-4])
    )
    # A removed cluster gets 0 and never wins.
    assert_close(importance_weights(losses, torch.tensor([True, False])), t([1.0, 0.0]))


def test_fedsoft_selection_probabilities_by_hand():
    u = t([[0.75, 0.25], [1e-4, 0.9999]])
    sizes = torch.tensor([4, 2])
    v = selection_probabilities(u, sizes)  # mass u_ik N_i = [[3, 1], [2e-4, 1.9998]]
    assert_close(v, t([[3 / 3.0002, 2e-4 / 3.0002], [1 / 2.9998, 1.9998 / 2.9998]]), **TIGHT)
    assert_close(v.sum(1), t([1.0, 1.0]), **TIGHT)


def test_fedsoft_selects_selection_size_clients_per_active_cluster():
    u = torch.rand(20, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    sizes = torch.randint(5, 50, (20,), generator=torch.Generator().manual_seed(1))
    active = torch.tensor([True, True, False])
    a = select_clients(u, sizes, 4, active, torch.Generator().manual_seed(3))
    b = select_clients(u, sizes, 4, active, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert a[:, :2].sum(0).tolist() == [4, 4] and int(a[:, 2].sum()) == 0
    # A client whose weight is the smoother is (almost) never picked when others dominate.
    skewed = torch.full((10, 1), 1e-4, dtype=F64)
    skewed[:3] = 1.0
    picks = torch.zeros(10)
    for s in range(200):
        picks += select_clients(
            skewed, torch.ones(10), 3, torch.ones(1, dtype=torch.bool), torch.Generator().manual_seed(s)
        )[:, 0]
    assert picks[:3].tolist() == [200, 200, 200]


def test_fedsoft_plan_and_contributions():
    rule = FedSoft(3, proximal=0.5)
    extra = {"importance": t([0.6, 0.3, 0.1])}
    context = ctx([1 / 3] * 3, extra=extra, num_samples=5, membership=torch.tensor([True, False, True]))
    report = rule.e_step(t([[0.0, 1.0, 2.0]] * 5), torch.tensor([0, 1, 0, 1, 0]), context, None)
    assert_close(report.omega, t([0.6, 0.3, 0.1]), **TIGHT)
    plan = rule.local_plan(report, context)
    assert plan.from_personal and plan.clusters == (0,)
    assert plan.proximal == (((0, 0.3), (1, 0.15), (2, 0.05)),)
    # The personal model enters every cluster that selected the client, with weight 1 (a plain mean).
    assert rule.contributions(report, plan, context) == [Contribution(0, 0, 1.0), Contribution(0, 2, 1.0)]
    assert rule.initial_personal_cluster(context) == 0
    state = ClientState.initial(4, 2, 3)
    state.extra.update(rule.initial_extra(4, 10))
    assert rule.needs_estimation(0, state) and not rule.needs_estimation(1, state)
    state.extra["estimated_round"] = torch.tensor(0.0)
    assert not rule.needs_estimation(0, state) and rule.needs_estimation(2, state)
    assert rule.max_clients_per_round(100) == 30 and rule.max_clients_per_round(12) == 12


# --- CFL -------------------------------------------------------------------------------------------------


def test_cfl_cosine_similarity_and_bipartition():
    updates = t([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.05], [-0.8, -0.1]])
    similarity = cosine_similarity_matrix(updates)
    assert_close(similarity[0, 1], t(0.9 / math.sqrt(0.82)), **TIGHT)
    assert_close(similarity.diagonal(), torch.ones(4, dtype=F64), **TIGHT)
    assert bipartition(similarity).tolist() == [False, False, True, True]


def test_cfl_split_decision_thresholds():
    opposite = t([[2.0, 0.0], [-2.0, 0.0]])  # mean 0 (stationary), members move a lot
    assert split_decision(opposite, t([1.0, 1.0]), eps1=0.4, eps2=1.6)
    assert not split_decision(opposite, t([1.0, 1.0]), eps1=0.4, eps2=2.5)  # no member moves enough
    assert not split_decision(opposite, t([3.0, 1.0]), eps1=0.4, eps2=1.6)  # weighted mean = 1.0 > ε1
    assert not split_decision(opposite[:1], t([1.0]), eps1=10, eps2=0.1)  # a single member never splits


def test_cfl_plan_splits_uses_a_free_cluster_and_starts_with_one():
    rule = CFL(3, eps1=0.4, eps2=1.6)
    assert rule.initial_active().tolist() == [True, False, False]
    clusters = torch.tensor([0, 0, 0, 0])
    updates = t([[2.0, 0.0], [1.9, 0.1], [-2.0, 0.0], [-1.9, -0.1]])
    splits = rule.plan_splits(clusters, updates, torch.ones(4), torch.tensor([True, False, False]))
    assert len(splits) == 1
    parent, child, moving = splits[0]
    assert (parent, child, moving.tolist()) == (0, 1, [False, False, True, True])
    # No free cluster left: no split.
    assert rule.plan_splits(clusters, updates, torch.ones(4), torch.ones(3, dtype=torch.bool)) == []


# --- FedRC options -------------------------------------------------------------------------------------


def test_adam_gamma_first_step_by_hand():
    # g = γ_prev − γ̃ = [-0.4, 0.4]; after bias correction m̂ = g, v̂ = g², so the step is α·g/(|g|+ε) ≈ ±1.
    previous, target = t([[0.5, 0.5]]), t([[0.9, 0.1]])
    zeros = torch.zeros(1, 2, dtype=F64)
    gamma, m, v = adam_gamma_step(previous, target, zeros, zeros, 0, torch.ones(2, dtype=torch.bool))
    assert_close(m, t([[-0.04, 0.04]]), **TIGHT)
    assert_close(v, t([[0.0016, 0.0016]]), **TIGHT)
    assert_close(gamma, t([[1.0, 0.0]]), **TIGHT)  # [1.5, -0.5] clamped at 0, renormalised


def test_adam_gamma_rule_keeps_per_sample_state():
    rule = FedRC(2, use_label_stats=False, adam_gamma=True)
    extra = {k: v[:2] if v.dim() == 2 else v[0] for k, v in rule.initial_extra(3, 5).items()}
    context = ctx([0.5, 0.5], extra=extra, num_samples=2)
    first = rule.e_step(t([[0.1, 2.0], [1.0, 0.9]]), torch.tensor([0, 1]), context, None)
    # First participation: γ is the E-step's γ̃ and it is stored for the next round.
    plain = FedRC(2, use_label_stats=False).e_step(
        t([[0.1, 2.0], [1.0, 0.9]]), torch.tensor([0, 1]), ctx([0.5, 0.5], num_samples=2), None
    )
    assert_close(first.gamma, plain.gamma, **TIGHT)
    assert_close(context.extra["gamma"], plain.gamma, **TIGHT)
    later = ctx(first.omega, extra=context.extra, num_samples=2)
    second = rule.e_step(t([[0.1, 2.0], [1.0, 0.9]]), torch.tensor([0, 1]), later, None)
    assert float(later.extra["adam_steps"]) == 1.0
    assert_close(second.omega, second.gamma.mean(0), **TIGHT)
    assert_close(second.gamma.sum(1), torch.ones(2, dtype=F64), **TIGHT)


def test_label_noise_is_gaussian_with_the_clients_sigma():
    losses, labels = t([[0.5, 1.5], [2.0, 0.25], [1.0, 1.0]]), torch.tensor([0, 1, 1])
    clean = FedRC(2).e_step(losses, labels, ctx([0.7, 0.3], seed=9), None)
    noisy = FedRC(2, label_noise_std=[0.0, 2.0]).e_step(
        losses, labels, ctx([0.7, 0.3], client=1, seed=9), None
    )
    expected = 2.0 * torch.randn((2, 2), generator=torch.Generator().manual_seed(9), dtype=F64)
    assert_close(noisy.label_sums - clean.label_sums, expected, **TIGHT)
    assert_close(noisy.gamma, clean.gamma, **TIGHT)  # only what is sent changes
    silent = FedRC(2, label_noise_std=[0.0, 2.0]).e_step(losses, labels, ctx([0.7, 0.3], client=0), None)
    assert torch.equal(silent.label_sums, clean.label_sums)


def test_hard_training_trains_only_the_argmax_cluster():
    rule = FedRC(3, hard_training=True)
    report = ClientReport(
        gamma=t([[0.2, 0.5, 0.3]]), omega=t([0.2, 0.5, 0.3]), label_sums=t([[0.2, 0.5, 0.3]])
    )
    plan = rule.local_plan(report, ctx([1 / 3] * 3))
    assert plan.clusters == (1,) and plan.sample_weights is None
    masked = rule.local_plan(report, ctx([1 / 3] * 3, active=[True, False, True]))
    assert masked.clusters == (2,)


def test_cluster_removal_by_hand_and_state_renormalisation():
    omega = t([[0.9, 0.08, 0.02], [0.5, 0.45, 0.05], [0.0, 0.0, 1.0]])
    sizes = torch.tensor([10, 30, 1000])
    seen = torch.tensor([True, True, False])  # the unseen client does not count
    # shares: (10·[.9,.08,.02] + 30·[.5,.45,.05]) / 40 = [0.6, 0.3575, 0.0425]
    remove = clusters_to_remove(omega, sizes, seen, torch.ones(3, dtype=torch.bool), 0.05)
    assert remove.tolist() == [False, False, True]
    state = ClientState(omega=omega.clone(), label_sums=torch.ones(3, 2, 3, dtype=F64), seen=seen)
    state.remove_clusters(remove)
    assert state.active.tolist() == [True, True, False]
    assert_close(state.omega[0], t([0.9 / 0.98, 0.08 / 0.98, 0.0]), **TIGHT)
    assert_close(state.omega[2], t([0.5, 0.5, 0.0]), **TIGHT)  # all its mass was removed: uniform
    assert torch.equal(state.label_sums[..., 2], torch.zeros(3, 2, dtype=F64))
    # The last cluster standing is never removed, even below the threshold.
    survivors = clusters_to_remove(
        t([[0.5, 0.5, 0.0]]), torch.tensor([1]), torch.tensor([True]), torch.tensor([True, True, False]), 0.9
    )
    assert survivors.tolist() == [False, True, False]  # cluster 0 (the tie's lowest index) stays
    with pytest.raises(ValueError, match="at least one"):
        state.remove_clusters(torch.ones(3, dtype=torch.bool))


def test_soft_rule_skips_removed_clusters_everywhere():
    rule = Algorithm(3)
    active = [True, False, True]
    report = rule.e_step(t([[0.1, 0.0, 0.3]]), torch.tensor([0]), ctx([0.4, 0.2, 0.4], active=active), None)
    assert report.gamma[0, 1] == 0 and report.omega[1] == 0
    plan = rule.local_plan(report, ctx([0.4, 0.2, 0.4], active=active))
    assert plan.clusters == (0, 2) and plan.sample_weights.shape == (1, 2)
    omega = rule.unseen_client_mixture(t([[0.1, 0.0, 0.3]]), torch.tensor([0]), None, torch.tensor(active))
    assert omega[1] == 0 and math.isclose(float(omega.sum()), 1.0)


def test_round_buffer_segments_share_one_flat_tensor():
    buffer = RoundBuffer({"omega": (2, 3), "reported": (2,)})
    buffer["omega"][1] = t([0.1, 0.2, 0.7])
    buffer["reported"][1] = 1.0
    assert buffer.flat.tolist() == [0, 0, 0, 0.1, 0.2, 0.7, 0, 1.0]
    buffer.replace(buffer.flat * 2)
    assert buffer["reported"].tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="shape"):
        buffer.replace(torch.zeros(3, dtype=F64))


# --- D-FedEM ---------------------------------------------------------------------------------------------


def test_dfedem_graph_is_connected_seeded_and_its_weights_doubly_stochastic():
    graph = random_connected_graph(8, 0.3, seed=4)
    assert torch.equal(graph, random_connected_graph(8, 0.3, seed=4))
    assert torch.equal(graph, graph.T) and not bool(graph.diagonal().any())
    assert all(bool(graph[i, (i + 1) % 8]) for i in range(8))  # the ring keeps it connected
    weights = metropolis_weights(graph)
    assert_close(weights, weights.T, **TIGHT)
    assert_close(weights.sum(0), torch.ones(8, dtype=F64), **TIGHT)
    assert_close(weights.sum(1), torch.ones(8, dtype=F64), **TIGHT)
    assert bool((weights >= 0).all())


def test_dfedem_mixing_by_hand_on_a_path():
    # Path 0-1-2 (the ring on 3 nodes is a triangle, so build the path by hand): degrees 1, 2, 1.
    path = torch.tensor([[False, True, False], [True, False, True], [False, True, False]])
    weights = metropolis_weights(path)
    third = 1 / 3
    assert_close(weights, t([[1 - third, third, 0], [third, third, third], [0, third, 1 - third]]), **TIGHT)
    rule = DFedEM(2, edge_probability=1.0)
    personal = {0: torch.tensor([3.0, 0.0]), 1: torch.tensor([0.0, 3.0]), 2: torch.tensor([6.0, 6.0])}
    rule.mix_personal(personal, 0)  # complete graph on 3 nodes: every weight is 1/3
    for vector in personal.values():
        assert_close(vector, torch.tensor([3.0, 3.0]))
    plan = rule.local_plan(
        ClientReport(gamma=t([[0.5, 0.5]]), omega=t([0.5, 0.5]), label_sums=t([[0.5, 0.5]])), ctx([0.5, 0.5])
    )
    assert plan.from_personal and plan.clusters == (0, 1)


def test_zero_weight_client_changes_nothing_in_the_average():
    from lightning_fedcluster.algorithms.aggregation import accumulate_delta, apply_weighted_update

    reference = [t([1.0, 2.0])]
    accumulator = [torch.zeros(2, dtype=F64)]
    accumulate_delta(accumulator, [t([3.0, 2.0])], reference, 5.0)  # Δ = [2, 0], weight 5
    accumulate_delta(accumulator, [t([100.0, -50.0])], reference, 0.0)  # a zero-weight client
    model = [reference[0].clone()]
    apply_weighted_update(model, accumulator, 5.0)
    assert_close(model[0], t([3.0, 2.0]), **TIGHT)
    # A soft cluster with zero responsibility on a client is not trained and gets no update from it.
    rule = Algorithm(2)
    report = rule.e_step(t([[0.0, 1e6]]), torch.tensor([0]), ctx([1.0, 0.0]), None)
    assert report.gamma[0, 1] == 0.0


def test_fesem_kmeans_initialisation_from_local_models():
    rule = FeSEM(2, seed=1)
    not_ready = {"centres_ready": torch.tensor(0.0)}
    report = rule.e_step(t([[0.0, 0.0]]), torch.tensor([0]), ctx([0.5, 0.5], client=3, extra=not_ready), None)
    assert torch.equal(report.omega, t([1.0, 0.0]))  # everybody trains the common model 0 first
    same = rule.reassign(report, t([9.0, 0.0]), ctx([0.5, 0.5], extra=not_ready))
    assert torch.equal(same.omega, report.omega)  # the server assigns after the first round
    state = ClientState.initial(4, 2, 2)
    state.extra.update(rule.initial_extra(4, 8))
    assert rule.round_vectors(state) == "model"
    vectors = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.0, 4.9]])
    centres, assignment = rule.initial_centres(vectors, 0, torch.ones(2, dtype=torch.bool))
    rows = sorted(centres.values())
    assert (
        len(set(rows)) == 2
        and centres == rule.initial_centres(vectors, 0, torch.ones(2, dtype=torch.bool))[0]
    )
    for row, cluster in enumerate(assignment.tolist()):  # every model joins its nearest centre
        nearest = min(centres, key=lambda k: float((vectors[row] - vectors[centres[k]]).square().sum()))
        assert cluster == nearest
    # As server actions: the picked models become the centres, every client its nearest, ready.
    clients = torch.tensor([10, 11, 12, 13])
    outcome = RoundOutcome(0, clients, t([[1.0, 0.0]] * 4), torch.ones(4), torch.ones(14), vectors)
    actions = rule.after_round(state, outcome)
    set_centres = {a.cluster: a.vector.tolist() for a in actions if isinstance(a, SetCentre)}
    assert set_centres == {k: vectors[r].tolist() for k, r in centres.items()}
    (moved,) = [a for a in actions if isinstance(a, Reassign)]
    assert moved.clients.tolist() == clients.tolist()
    assert moved.omega.argmax(1).tolist() == assignment.tolist()
    ready = [a for a in actions if isinstance(a, SetState) and a.name == "centres_ready"]
    assert len(ready) == 1 and float(ready[0].value) == 1.0
    state.extra["centres_ready"] = torch.tensor(1.0)
    assert rule.round_vectors(state) is None


# --- several clients' E-step at once (the vectorised executor) ---------------------------------------


@pytest.mark.parametrize(
    "make_rule",
    [
        lambda: FedRC(3),
        lambda: FedRC(3, use_label_stats=False),
        lambda: FedRC(3, adam_gamma=True, label_noise_std=0.3),
        lambda: IFCA(3),
        lambda: Algorithm(3),
    ],
    ids=["fedrc", "fedem", "fedrc_adam_noise", "ifca", "base"],
)
def test_e_step_of_many_clients_equals_the_client_by_client_e_step(make_rule):
    generator = torch.Generator().manual_seed(4)
    sizes = [5, 1, 7, 3]
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    losses = 3 * torch.rand(int(offsets[-1]), 3, generator=generator, dtype=F64)
    labels = torch.randint(0, 4, (int(offsets[-1]),), generator=generator)
    log_stats = torch.rand(4, 3, generator=generator, dtype=F64).log()
    active = [True, False, True]
    omegas = torch.rand(len(sizes), 3, generator=generator, dtype=F64).softmax(1)

    def contexts():
        return [
            ctx(omegas[c], num_classes=4, num_samples=n, client=c, active=active, seed=c)
            for c, n in enumerate(sizes)
        ]

    rule = make_rule()
    many = rule.e_step_many(losses, labels, offsets, contexts(), log_stats)
    one_by_one = [
        rule.e_step(losses[a:b], labels[a:b], context, log_stats)
        for a, b, context in zip(offsets[:-1], offsets[1:], contexts(), strict=True)
    ]
    assert len(many) == len(sizes)
    for batched, single in zip(many, one_by_one, strict=True):
        assert_close(batched.gamma, single.gamma, **TIGHT)
        assert_close(batched.omega, single.omega, **TIGHT)
        assert_close(batched.label_sums, single.label_sums, **TIGHT)
        assert float(batched.omega[1]) == 0.0  # the removed cluster gets nothing
