"""The Flower apps train exactly what the Lightning engine trains (executor="loop", same seed
and schedule): global weights, the server's client store and the nodes' client state (ω, label
sums, FedRC-Adam γ, persistent momentum, FedSoft's importance and personal models), to float
summation order; with the user's LR schedule and a server optimizer too."""

from __future__ import annotations

import logging

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.flower import FlowerApps, simulate
from tests.conftest import make_trainer
from tests.flower import workload
from tests.flower.local_grid import partitions, run_local


def lightning_run(name: str):
    trainer = make_trainer(workload.STRATEGIES[name](), max_epochs=workload.ROUNDS, limit_val_batches=0)
    trainer.fit(workload.make_module(), datamodule=workload.make_datamodule())
    return trainer.lightning_module


def assert_same_training(flower, lightning) -> None:
    expected = lightning.state_dict()
    assert set(flower.state_dict()) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(flower.state_dict()[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    got, want = flower.client_state.state_dict(), lightning.client_state.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name].to(tensor.dtype), tensor, rtol=1e-6, atol=1e-7, msg=name)
    assert flower.round_metrics["train/clients"] == lightning.round_metrics["train/clients"]
    assert flower.round_metrics["train/loss"] == pytest.approx(
        lightning.round_metrics["train/loss"], rel=1e-6
    )


def test_flower_simulation_equals_the_lightning_engine_fedrc(simulated_fedrc):
    reference = lightning_run("fedrc")
    assert_same_training(simulated_fedrc, reference)
    assert not bool(simulated_fedrc.client_state.active.all()), "the run should exercise cluster removal"
    assert simulated_fedrc.client_state.optimizer, "persistent momentum comes back from the nodes"


@pytest.mark.parametrize(
    "name",
    [
        "fedem", "ifca", "fedavg", "fedrc_shared", "fedsoft", "fedrc_server_adam", "cfl", "fesem", "wecfl",
        "fedrc_grouping", "fedrc_retire", "fedrc_discovery",
    ],
)  # fmt: skip
def test_flower_apps_equal_the_lightning_engine(name, task_identity):
    """The same ServerApp and ClientApp on an in-process grid (3 nodes)."""
    apps = FlowerApps(
        workload.STRATEGIES[name], workload.make_module, workload.make_datamodule,
        num_rounds=workload.ROUNDS, collect_client_state=True,
    )  # fmt: skip
    flower, _ = run_local(apps, partitions(3))
    assert_same_training(flower, lightning_run(name))
    if name == "fedsoft":  # the personal models came back from the nodes, equal (compared above)
        assert flower.client_state.personal and flower.client_state.extra["estimated_round"] == 2
    if name == "cfl":  # the run must exercise a split
        assert int(flower.client_state.active.sum()) >= 2
    if name == "fedrc_grouping":  # signatures came from the nodes; 2 retired, a release, one merge
        assert bool((flower.client_state.extra["signature_rows"].sum(1) > 0).all())
        assert int(flower.client_state.active.sum()) == 1
        assert bool((flower.client_state.extra["group_held"] == 3.0).any())  # grouping.RELEASED
    if name == "fedrc_retire":  # the run must exercise a retirement
        assert 1 <= int(flower.client_state.active.sum()) < 4
    if name == "fedrc_discovery":  # the placements came from the nodes' reported cluster scores
        assert bool((flower.client_state.extra["placed_cluster"] >= 0).any())
    if name in ("fesem", "wecfl"):  # the centres came from the nodes' first-round models
        assert float(flower.client_state.extra["centres_ready"]) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedem", "ifca", "fedavg", "fedsoft"])
def test_flower_simulation_equals_the_lightning_engine(name):
    flower = simulate(
        workload.STRATEGIES[name](), workload.make_module(), workload.make_datamodule(),
        num_rounds=workload.ROUNDS, num_supernodes=2, num_cpus=1,
    )  # fmt: skip
    assert_same_training(flower, lightning_run(name))


def test_the_returned_module_tests_like_the_lightning_trained_one(task_identity):
    apps = FlowerApps(
        workload.STRATEGIES["fedem"], workload.make_module, workload.make_datamodule,
        num_rounds=workload.ROUNDS, collect_client_state=True,
    )  # fmt: skip
    flower, _ = run_local(apps, partitions(2))
    lightning = lightning_run("fedem")
    scores = [
        make_trainer(workload.STRATEGIES["fedem"](), max_epochs=1).test(
            module, datamodule=workload.make_datamodule(), verbose=False
        )[0]
        for module in (flower, lightning)
    ]
    assert scores[0] == pytest.approx(scores[1], rel=1e-5) and "test/global_acc" in scores[0]


class DictOutputMLP(workload.MomentumMLP):
    """A forward returning a dict, as many Lightning modules do: the logits under "logits"."""

    def forward(self, x):
        return {"logits": super().forward(x), "features": x.flatten(1)}


def test_a_dict_forward_with_logits_from_trains_as_on_lightning(task_identity):
    def strategy():
        return lf.FedRCStrategy(
            2, local_steps=2, logits_from="logits", optimizer_state="persist", executor="loop"
        )

    apps = FlowerApps(
        strategy, DictOutputMLP, workload.make_datamodule, num_rounds=2, collect_client_state=True
    )
    flower, _ = run_local(apps, partitions(2))
    trainer = make_trainer(strategy(), max_epochs=2, limit_val_batches=0)
    trainer.fit(DictOutputMLP(), datamodule=workload.make_datamodule())
    assert_same_training(flower, trainer.lightning_module)


class StepScheduledMLP(workload.MomentumMLP):
    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


class PlateauScheduledMLP(workload.MomentumMLP):
    """A plateau schedule that cuts the lr every round (patience 0, a loss that must fall 90 %)."""

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.3, patience=0, threshold=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "train/loss"}}


@pytest.mark.parametrize("module", [StepScheduledMLP, PlateauScheduledMLP])
def test_lr_schedulers_step_on_the_server_as_on_lightning(module, task_identity):
    """The server steps the user's schedulers once per round and sends the lr to the nodes: the
    weights equal the Lightning engine's, which steps the same schedule
    (tests/engine/test_lr_schedulers.py)."""
    apps = FlowerApps(
        workload.STRATEGIES["fedrc"], module, workload.make_datamodule, num_rounds=workload.ROUNDS,
        collect_client_state=True,
    )  # fmt: skip
    flower, _ = run_local(apps, partitions(2))
    trainer = make_trainer(workload.STRATEGIES["fedrc"](), max_epochs=workload.ROUNDS, limit_val_batches=0)
    trainer.fit(module(), datamodule=workload.make_datamodule())
    assert_same_training(flower, trainer.lightning_module)
    # StepLR halves after every round; the plateau cuts from the second round on (the first sets its best).
    expected = (
        0.1 * 0.5**workload.ROUNDS if module is StepScheduledMLP else 0.1 * 0.3 ** (workload.ROUNDS - 1)
    )
    assert [group["lr"] for group in apps.server.solver.param_groups] == [pytest.approx(expected)]


class StepIntervalMLP(workload.MomentumMLP):
    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        step = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": step, "interval": "step"}}


def test_a_per_step_schedule_is_refused_before_any_round(task_identity):
    apps = FlowerApps(workload.STRATEGIES["fedavg"], StepIntervalMLP, workload.make_datamodule, num_rounds=1)
    with pytest.raises(ValueError, match="interval='step'"):
        run_local(apps, partitions(2))
    assert apps.server is None or not apps.server.metrics, "no round may run"


@pytest.mark.parametrize("name", ["fedrc", "fedsoft"])
def test_the_nodes_validation_pass_equals_the_lightning_engines(name, task_identity):
    """``eval_every``: the nodes score their clients' validation rows (their own ω; FedSoft: their
    personal models) and the server logs what Lightning's validation logs as val/local_acc."""
    apps = FlowerApps(
        workload.STRATEGIES[name], workload.make_module, workload.make_datamodule,
        num_rounds=workload.ROUNDS, eval_every=2,
    )  # fmt: skip
    run_local(apps, partitions(2))
    flower = [m.get("val/local_acc") for m in apps.server.metrics]
    assert [v is not None for v in flower] == [False, True, True], "rounds 2 and 3 (the last)"
    trainer = make_trainer(workload.STRATEGIES[name](), max_epochs=workload.ROUNDS)
    trainer.fit(workload.make_module(), datamodule=workload.make_datamodule())
    # Lightning keeps its logged metric as a float32 tensor.
    assert flower[-1] == pytest.approx(float(trainer.callback_metrics["val/local_acc"]), abs=1e-6)
    assert 0.0 < flower[-1] <= 1.0


def test_a_reseeding_split_runs_on_flower_as_on_lightning(task_identity, caplog):
    """FedRC's ``reseed_threshold`` splits the largest cluster into a dead one (``SplitCluster``):
    the server sends the moved ω and label sums to the nodes; with ``optimizer_state="reset"`` the
    nodes hold no optimizer state to restart."""

    def strategy():
        return lf.FedRCStrategy(3, local_steps=2, config=FedRC.Config(reseed_threshold=0.34), executor="loop")

    apps = FlowerApps(
        strategy, workload.make_module, workload.make_datamodule, num_rounds=3, collect_client_state=True
    )
    with caplog.at_level(logging.INFO, logger="lightning_fedcluster.flower"):
        flower, _ = run_local(apps, partitions(2))
    assert any("re-seeded cluster" in record.getMessage() for record in caplog.records)
    trainer = make_trainer(strategy(), max_epochs=3)
    trainer.fit(workload.make_module(), datamodule=workload.make_datamodule())
    lightning = trainer.lightning_module
    torch.testing.assert_close(flower.client_state.omega, lightning.client_state.omega, rtol=0, atol=1e-12)
    torch.testing.assert_close(flower.client_state.label_sums, lightning.client_state.label_sums)
    for k in range(3):
        for a, b in zip(flower.cluster_tensors(k), lightning.cluster_tensors(k), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
