"""The Flower server's checkpoint: a run whose ServerApp went down goes on from the last
checkpoint (a new run, whose nodes start with empty stores that the server restores) to the
weights and client store of the run that never stopped, bit for bit; a run whose nodes held
state the server cannot restore, or a damaged checkpoint, is refused by name."""

from __future__ import annotations

import logging

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.engine.verified_files import CorruptCheckpointError, load_verified
from lightning_fedcluster.flower import FlowerApps
from tests.flower import workload
from tests.flower.local_grid import partitions, run_local

ROUNDS = 4


class ServerAppCrash(RuntimeError):
    pass


def crash_at(round_index: int):
    """The ServerApp dies when it sends round ``round_index``."""

    def fault(node, message):
        if message.metadata.message_type == "train" and int(message.metadata.group_id) == round_index:
            raise ServerAppCrash(f"the ServerApp went down in round {round_index}")

    return fault


class ScheduledMLP(workload.MomentumMLP):
    """The LR schedule's state lives on the server and must survive the restart."""

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]


STRATEGIES = {
    # Cluster removal and the server's own optimizer (its moments are in the checkpoint).
    "fedrc": lambda: lf.FedRCStrategy(
        3,
        clients_per_round=4,
        local_steps=2,
        config=FedRC.Config(removal_threshold=0.33),
        server_optimizer="momentum",
        executor="loop",
    ),
    "ifca": lambda: lf.IFCAStrategy(2, local_steps=3, executor="loop"),
}  # fmt: skip


def apps(name: str, path=None, every: int = 1, resume: bool = False) -> FlowerApps:
    return FlowerApps(
        STRATEGIES[name], ScheduledMLP, workload.make_datamodule, num_rounds=ROUNDS,
        collect_client_state=True, checkpoint_path=None if path is None else str(path),
        checkpoint_every=every, resume=resume,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["fedrc", "ifca"])
def test_a_run_resumed_after_the_serverapp_went_down_equals_the_run_that_never_stopped(
    name, tmp_path, task_identity
):
    path = tmp_path / "server.ckpt"
    straight, _ = run_local(apps(name), partitions(2))
    with pytest.raises(ServerAppCrash):
        run_local(apps(name, path), partitions(2), crash_at(2))
    assert load_verified(path)[0]["round"] == 1, "rounds 0 and 1 were checkpointed"
    resumed_apps = apps(name, path, resume=True)
    resumed, _ = run_local(resumed_apps, partitions(2))  # a new run: the nodes' stores start empty
    for key, tensor in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], tensor), key
    for key, tensor in straight.client_state.state_dict().items():
        assert torch.equal(resumed.client_state.state_dict()[key], tensor), key
    assert len(resumed_apps.server.metrics) == ROUNDS
    if name == "fedrc":
        assert not bool(straight.client_state.active.all()), "the run should remove a cluster"


def test_checkpoints_are_written_every_n_rounds_and_after_the_last(tmp_path, task_identity):
    path = tmp_path / "server.ckpt"
    with pytest.raises(ServerAppCrash):
        run_local(apps("ifca", path, every=3), partitions(2), crash_at(3))
    assert load_verified(path)[0]["round"] == 2
    run_local(apps("ifca", path, every=3), partitions(2))
    saved = load_verified(path)[0]
    assert saved["round"] == ROUNDS - 1 and len(saved["metrics"]) == ROUNDS


def test_resume_without_a_checkpoint_starts_the_run(tmp_path, task_identity, caplog):
    with caplog.at_level(logging.INFO, logger="lightning_fedcluster.flower"):
        module, _ = run_local(apps("ifca", tmp_path / "none.ckpt", resume=True), partitions(2))
    assert "no checkpoint at" in caplog.text and (tmp_path / "none.ckpt").exists()


def test_a_damaged_checkpoint_is_refused_by_name(tmp_path, task_identity):
    path = tmp_path / "server.ckpt"
    with pytest.raises(ServerAppCrash):
        run_local(apps("ifca", path), partitions(2), crash_at(2))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError) as error:
        run_local(apps("ifca", path, resume=True), partitions(2))
    assert str(path) in str(error.value)


def test_a_run_whose_nodes_held_state_the_server_lacks_is_not_resumed(tmp_path, task_identity):
    path = tmp_path / "server.ckpt"

    def fedrc_adam():
        return lf.FedRCStrategy(
            2,
            local_steps=2,
            config=FedRC.Config(adam_gamma=True),
            optimizer_state="persist",
            executor="loop",
        )

    options = dict(num_rounds=ROUNDS, checkpoint_path=str(path))
    with pytest.raises(ServerAppCrash):
        run_local(FlowerApps(fedrc_adam, workload.make_module, workload.make_datamodule, **options),
                  partitions(2), crash_at(2))  # fmt: skip
    resumed = FlowerApps(fedrc_adam, workload.make_module, workload.make_datamodule, resume=True, **options)
    with pytest.raises(ValueError, match="its nodes held per-sample state .* and persistent optimizer state"):
        run_local(resumed, partitions(2))


def test_a_checkpoint_of_a_run_with_another_save_path_is_refused_by_name(tmp_path, task_identity):
    """Two runs of one app share its checkpoint-path unless given their own: the second run must
    neither resume nor overwrite the first's state."""
    path = tmp_path / "server-state.pt"
    first, second = str(tmp_path / "run-1.pt"), str(tmp_path / "run-2.pt")

    def run_apps(save_path, resume=False):
        return FlowerApps(
            STRATEGIES["ifca"], ScheduledMLP, workload.make_datamodule, num_rounds=2,
            checkpoint_path=str(path), save_path=save_path, resume=resume,
        )  # fmt: skip

    run_local(run_apps(first), partitions(2))
    written = path.read_bytes()
    for resume in (False, True):
        with pytest.raises(ValueError) as error:
            run_local(run_apps(second, resume), partitions(2))
        message = str(error.value)
        assert message.startswith(f"checkpoint-path {path} holds the state of the run saved to {first}")
        assert second in message and "its own checkpoint-path" in message
        assert path.read_bytes() == written and not (tmp_path / "run-2.pt").exists()
    run_local(run_apps(first), partitions(2))  # the same run again (its save-path) may start over
