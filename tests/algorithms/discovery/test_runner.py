"""algorithms/discovery/runner.py: components run in their declared order on the client and on the
server, the first decisive component that acts ends a round's decisions, declared entries are
merged by name, a turn's plan and server weights reach the rule's plan and contributions, and a
fit hands the components the run's rounds."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
import torch

from lightning_fedcluster.algorithms.actions import Note
from lightning_fedcluster.algorithms.client_state import Scope, StateEntry
from lightning_fedcluster.algorithms.client_turn import Contribution, LocalPlan
from lightning_fedcluster.algorithms.discovery.protocol import (
    CLUSTER_SCORES,
    ClientTurn,
    Component,
    DiscoveryView,
    client_scores,
)
from lightning_fedcluster.algorithms.discovery.runner import declared_entries, run_client, run_server
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.ifca import IFCA
from lightning_fedcluster.algorithms.server_view import RoundOutcome
from tests.helpers.algorithms import F64, ctx, server_view, store, t


@dataclass(frozen=True)
class Says(Component):
    """Returns a note with its name (or nothing when ``quiet``); records its client turns in order."""

    name: str
    decisive_: bool = False
    quiet: bool = False

    @property
    def decisive(self) -> bool:  # type: ignore[override]
        return self.decisive_

    def client(self, turn: ClientTurn) -> ClientTurn:
        seen = turn.context.extra.setdefault("order", [])
        seen.append(self.name)  # type: ignore[union-attr]
        return turn

    def actions(self, view: DiscoveryView) -> list:
        return [] if self.quiet else [Note(self.name)]


def _view(round_index: int = 3, num_rounds: int | None = 10):
    rule = FedRC(2)
    state = store(rule, 2)
    state.seen[:] = True
    sizes = torch.tensor([4, 6])
    outcome = RoundOutcome(round_index, torch.tensor([0, 1]), state.omega, sizes, sizes)
    return DiscoveryView(server_view(state, outcome), num_rounds)


def _texts(actions) -> list[str]:
    return [action.text for action in actions]


def test_the_server_hooks_run_in_order_and_the_first_decisive_one_that_acts_ends_the_round():
    first, grouping, merge, retire = Says("a"), Says("b", True), Says("c", True), Says("d")
    assert _texts(run_server((first, grouping, merge, retire), _view())) == ["a", "b"]
    quiet = Says("b", True, quiet=True)  # a decisive component with nothing to do lets the next decide
    assert _texts(run_server((first, quiet, merge, retire), _view())) == ["a", "c"]
    assert _texts(run_server((first, Says("x"), retire), _view())) == ["a", "x", "d"]  # none decisive


def test_the_view_gives_the_round_the_store_and_the_run_s_rounds():
    view = _view(round_index=4, num_rounds=12)
    assert (view.round_index, view.num_rounds, view.outcome.round_index) == (4, 12, 4)
    assert view.state.seen.tolist() == [True, True]


def test_the_client_hooks_run_in_order_each_on_the_previous_turn():
    @dataclass(frozen=True)
    class Doubles(Component):
        def client(self, turn: ClientTurn) -> ClientTurn:
            weights = torch.ones(2, dtype=F64) if turn.copy_weights is None else turn.copy_weights
            return replace(turn, copy_weights=2 * weights + 1)

    report = FedRC(2).e_step(t([[0.5, 1.0]]), torch.tensor([0]), ctx([0.5, 0.5]), None)
    turn = ClientTurn(report, t([[0.5, 1.0]]), torch.tensor([0]), None, ctx([0.5, 0.5]))
    out = run_client((Says("a"), Doubles(), Says("b"), Doubles()), turn)
    assert out.context.extra["order"] == ["a", "b"]
    assert out.copy_weights.tolist() == [7.0, 7.0]  # 2 · (2 · 1 + 1) + 1


def test_entries_are_declared_once_by_name_and_a_conflict_is_named():
    @dataclass(frozen=True)
    class Keeps(Component):
        shape: tuple[int, ...] = ()

        def state_entries(self, num_clusters: int) -> tuple[StateEntry, ...]:
            return (StateEntry("kept", Scope.CLIENT, self.shape),)

    entries = declared_entries((Keeps(), Says("a"), Keeps()), 3, scores=True)
    assert [e.name for e in entries] == ["kept", CLUSTER_SCORES]
    assert entries[1].shape == (3,) and entries[1].reported
    with pytest.raises(ValueError, match="declare the client-store entry 'kept' differently"):
        declared_entries((Keeps(), Keeps((2,))), 3)


@dataclass(frozen=True)
class TrainsFirst(Component):
    """Trains copy 0 only, from round 1 on."""

    def client(self, turn: ClientTurn) -> ClientTurn:
        return turn if turn.context.round_index < 1 else replace(turn, train_clusters=(0,))


@dataclass(frozen=True)
class HalvesSecond(Component):
    """Copy 1 enters the server's sum at half the client's size."""

    wants_scores = True

    def client(self, turn: ClientTurn) -> ClientTurn:
        return replace(turn, copy_weights=t([1.0, 0.5]))


def test_fedrc_runs_given_components_in_order_with_the_decisive_rule():
    rule = FedRC(2, components=(Says("a"), Says("b", True), Says("c", True), TrainsFirst(), HalvesSecond()))
    assert _texts(rule.after_round(_view().server)) == ["a", "b"]
    assert [e.name for e in rule.state_entries()] == [CLUSTER_SCORES]  # HalvesSecond wants scores
    losses, labels = t([[0.5, 1.0], [2.0, 0.1]]), torch.tensor([0, 1])
    context = replace(ctx([0.5, 0.5], num_samples=2), round_index=1)
    report = rule.e_step(losses, labels, context, None)
    assert context.extra["order"] == ["a", "b", "c"]
    assert torch.equal(context.extra[CLUSTER_SCORES], client_scores(losses, labels, None))
    plan = rule.local_plan(report, context)
    assert plan == LocalPlan(clusters=(0,))  # each sample with weight 1
    assert rule.contributions(report, plan, context) == [Contribution(0, 0, 2.0)]
    plan = LocalPlan(clusters=(0, 1))
    assert rule.contributions(report, plan, context) == [Contribution(0, 0, 2.0), Contribution(1, 1, 1.0)]
    early = replace(context, round_index=0, extra={})  # TrainsFirst not yet: FedRC's own plan, γ weights
    report = rule.e_step(losses, labels, early, None)
    assert rule.local_plan(report, early).clusters == (0, 1)


def test_fedrc_refuses_components_together_with_mechanism_options():
    with pytest.raises(ValueError, match="components= and FedRC.Config's mechanism options"):
        FedRC(3, components=(Says("a"),), merge_threshold=0.5)
    with pytest.raises(TypeError, match="must be discovery Components"):
        FedRC(3, components=("merging",))
    assert FedRC(3, components=()).components == ()  # the paper's FedRC
    assert FedRC(3).components == ()


def test_a_component_that_reads_outputs_is_refused_by_a_rule_that_gives_none():
    @dataclass(frozen=True)
    class Reads(Component):
        wants_outputs = True

    with pytest.raises(ValueError, match="Reads reads the models' outputs"):
        IFCA(3, components=(Reads(),))
    assert FedRC(3, components=(Reads(),)).uses_client_outputs


@dataclass(frozen=True)
class Rounds(Component):
    """Records the round and the run's rounds, as the view gives them."""

    seen: list = field(default_factory=list)

    def actions(self, view: DiscoveryView) -> list:
        self.seen.append((view.round_index, view.num_rounds))
        return []


def test_a_fit_hands_the_components_the_run_s_rounds():
    import lightning_fedcluster as lf
    from lightning_fedcluster.datamodules import DigitsFederated
    from lightning_fedcluster.models import MLPClassifier
    from tests.conftest import make_trainer

    torch.manual_seed(0)
    rounds = Rounds()
    strategy = lf.FederatedStrategy(algorithm=FedRC(2, components=(rounds,)), local_steps=1)
    trainer = make_trainer(strategy, max_epochs=2)
    trainer.fit(MLPClassifier(lr=0.1), datamodule=DigitsFederated(num_clients=4, seed=0))
    assert rounds.seen == [(0, 2), (1, 2)]
