"""engine/federation.py: the round driver runs without a Trainer and reproduces a Lightning fit,
actions apply themselves to the server state, and a replaced model restarts its server state."""

from __future__ import annotations

import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.algorithms.actions import CopyCluster, Note, Reassign, RemoveClusters
from lightning_fedcluster.algorithms.server_optimizer import ServerOptimizerConfig
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.copies import local_solver
from lightning_fedcluster.engine.executors.local import LocalClients
from lightning_fedcluster.engine.executors.loop import LoopExecutor
from lightning_fedcluster.engine.federation import (
    ClientDirectory,
    RoundDriver,
    ServerState,
    initial_client_state,
)
from lightning_fedcluster.engine.losses import pass_rows
from lightning_fedcluster.engine.lr_schedulers import RoundSchedulers
from lightning_fedcluster.engine.optimizer_state import persistent_layout
from lightning_fedcluster.engine.runtime import ClientRuntime, LocalSetup, LocalSolver
from lightning_fedcluster.engine.server_optimizer_state import ServerOptimizer
from lightning_fedcluster.engine.task import Task
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

ROUNDS = 3


def _strategy() -> lf.FedRCStrategy:
    return lf.FedRCStrategy(2, local_steps=3, clients_per_round=4, executor="loop", optimizer_state="persist")


def _datamodule() -> DigitsFederated:
    dm = DigitsFederated(num_clients=6, concepts=2, seed=0)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _trainer_free_fit() -> tuple[lf.ClusteredModule, object]:
    """The rounds of a FedRC fit with no Trainer: ``RoundDriver.run`` with the loop executor over
    every client's data (plain autograd and the user's own optimizer)."""
    strategy, dm = _strategy(), _datamodule()
    plan = strategy.plan
    module = lf.ClusteredModule(MLPClassifier(lr=0.05), plan.num_clusters, seed=plan.seed)
    samples = int(dm.train_sizes.sum())
    state = initial_client_state(plan, dm.num_clients, dm.num_classes, samples)
    optimizer, _ = local_solver(module.models)
    layout = persistent_layout(module.models)
    schedule = strategy.round_schedule(dm)
    driver = RoundDriver(
        plan,
        ServerState(module.copies, state, None, RoundSchedulers()),
        schedule,
        ClientDirectory(dm.train_sizes, dm.num_classes, Task.CLASSIFICATION),
        optimizer_size=layout.size,
        optimizer_in_store=True,
        num_rounds=ROUNDS,
    )
    sample = dm.train_split(0)[0][:2]
    rows = pass_rows(module.models[0], sample, module.eval_batch_size)
    setup = LocalSetup(
        module.copies, plan.rule, Task.CLASSIFICATION, plan.seed, rows, dm.batch_size, None, False,
        torch.device("cpu"), num_classes=dm.num_classes,
    )  # fmt: skip
    clients = LocalClients(
        dm.train_x, dm.train_y, dm.train_offsets, torch.arange(dm.num_clients), schedule.steps_per_client
    )
    executor = LoopExecutor(ClientRuntime(setup, LocalSolver.plain(optimizer, layout)), clients)
    module.models.train()
    rounds: list[int] = []
    driver.prepare_round(0, executor)
    driver.run(executor, range(ROUNDS), lambda round_state, metrics: rounds.append(round_state.round_index))
    assert rounds == list(range(ROUNDS))
    return module, state


def test_a_trainer_free_driver_reproduces_the_lightning_fit_bit_for_bit():
    trainer = make_trainer(_strategy(), max_epochs=ROUNDS)
    trainer.fit(MLPClassifier(lr=0.05), datamodule=_datamodule())
    lightning = trainer.lightning_module
    module, state = _trainer_free_fit()
    for k in range(2):
        for a, b in zip(module.cluster_tensors(k), lightning.cluster_tensors(k), strict=True):
            assert torch.equal(a, b)
    assert torch.equal(state.omega, lightning.client_state.omega)
    assert torch.equal(state.label_sums, lightning.client_state.label_sums)
    assert sorted(state.optimizer) == sorted(lightning.client_state.optimizer)


def _server(num_clusters: int = 3) -> tuple[ServerState, list[list[torch.Tensor]]]:
    module = lf.ClusteredModule(MLPClassifier(), num_clusters, seed=0)
    optimizer = ServerOptimizer(ServerOptimizerConfig("momentum"))
    state = ServerState(module.copies, initial_client_state_for(num_clusters), optimizer, RoundSchedulers())
    clusters, _ = module.copies.snapshot()
    for k, tensors in enumerate(clusters):  # one momentum step per cluster: every group has state
        optimizer.step(
            f"cluster{k}", tensors, [torch.ones_like(t, dtype=torch.float64) for t in tensors], 1.0, 1.0
        )
    return state, clusters


def initial_client_state_for(num_clusters: int):
    plan = lf.FedRCStrategy(num_clusters).plan
    return initial_client_state(plan, 4, 10, 40)


def _driver(state: ServerState, notes: list[str]) -> RoundDriver:
    plan = lf.FedRCStrategy(3).plan
    directory = ClientDirectory(torch.full((4,), 10), 10, Task.CLASSIFICATION)
    return RoundDriver(plan, state, None, directory, say=notes.append)  # type: ignore[arg-type]


def test_actions_apply_themselves_and_a_copied_model_restarts_its_server_state():
    state, clusters = _server()
    notes: list[str] = []
    omega = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    _driver(state, notes).apply(
        [CopyCluster(target=2, source=0), Reassign(torch.tensor([1]), omega), Note("moved client 1")],
        clusters,
    )
    for a, b in zip(clusters[2], clusters[0], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(state.client_state.omega[1], omega[0])
    assert notes == ["moved client 1"]
    groups = {key.split(".", 1)[0] for key in state.server_optimizer.state}
    assert groups == {"cluster0", "cluster1"}  # cluster 2's velocity belonged to the replaced model


def test_removing_a_cluster_renormalises_the_rules_per_sample_mixtures_only():
    state, clusters = _server()
    store = state.client_state
    store.extra["gamma"] = torch.full((40, 3), 1 / 3, dtype=torch.float64)
    store.extra["adam_m"] = torch.full((40, 3), 0.5, dtype=torch.float64)
    remove = torch.tensor([False, False, True])
    _driver(state, []).apply([RemoveClusters(remove, ("gamma",))], clusters)
    torch.testing.assert_close(store.extra["gamma"][:, :2], torch.full((40, 2), 0.5, dtype=torch.float64))
    assert torch.equal(store.extra["adam_m"], torch.full((40, 3), 0.5, dtype=torch.float64))
    torch.testing.assert_close(store.omega[:, :2], torch.full((4, 2), 0.5, dtype=torch.float64))
    assert store.active.tolist() == [True, True, False]


class SeeingFedRC(FedRC):
    """FedRC whose server hook records what it sees of the server."""

    def __init__(self, num_clusters: int) -> None:
        super().__init__(num_clusters)
        self.seen: list[tuple[int, list[torch.Tensor], torch.Tensor, torch.Tensor]] = []

    def after_round(self, server):
        vectors = [server.cluster_vector(k) for k in range(server.num_clusters)]
        self.seen.append((server.round_index, vectors, server.client_state.omega, server.outcome.clients))
        return super().after_round(server)


def test_the_rules_server_hook_sees_the_aggregated_models_and_the_updated_store():
    rule = SeeingFedRC(2)
    strategy = lf.FederatedStrategy(algorithm=rule, local_steps=2, clients_per_round=4, executor="loop")
    trainer = make_trainer(strategy, max_epochs=2)
    trainer.fit(MLPClassifier(lr=0.05), datamodule=_datamodule())
    module = trainer.lightning_module
    assert [entry[0] for entry in rule.seen] == [0, 1]
    round_index, vectors, omega, clients = rule.seen[-1]
    for k in range(2):  # the last round's view shows the models the fit ended with
        expected = torch.cat([t.detach().flatten().double() for t in module.cluster_tensors(k)])
        assert torch.equal(vectors[k], expected)
    assert torch.equal(omega, module.client_state.omega)
    assert clients.numel() == 4
    first = rule.seen[0][1]
    assert not torch.equal(first[0], vectors[0])  # each round's view is that round's aggregate
