"""training.py: the module's federated training component. Its ``state_dict`` is the checkpoint's
entries under the keys checkpoints have always had (older checkpoints load), it restores them
exactly, the server optimizer follows the plan, and a round's metrics are logged as before."""

from __future__ import annotations

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.checkpoint import CLIENT_STATE_KEY, METADATA_KEY
from lightning_fedcluster.engine.federation import initial_client_state
from lightning_fedcluster.engine.server_optimizer_state import SERVER_OPTIMIZER_KEY
from lightning_fedcluster.engine.verified_files import HASH_KEY
from lightning_fedcluster.models import MLPClassifier
from lightning_fedcluster.training import FederatedTraining, log_round_metrics
from tests.conftest import make_trainer

# The checkpoint entries a fit adds, as every earlier version wrote them: renaming one would
# leave existing checkpoints unreadable (a migration and its test would be needed first).
ENTRY_KEYS = {"fedcluster_client_state", "fedcluster_metadata", "fedcluster_server_optimizer"}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    digits = DigitsFederated(num_clients=6, concepts=2, seed=0)
    strategy = lf.FedRCStrategy(2, local_steps=2, server_optimizer="momentum")
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    trainer.fit(MLPClassifier(hidden=(16,)), datamodule=digits)
    path = tmp_path_factory.mktemp("ckpt") / "run.ckpt"
    trainer.save_checkpoint(path)
    return trainer.lightning_module, torch.load(path, weights_only=False)


def test_the_checkpoint_holds_the_entries_under_their_old_keys(fitted):
    module, checkpoint = fitted
    assert {CLIENT_STATE_KEY, METADATA_KEY, SERVER_OPTIMIZER_KEY} == ENTRY_KEYS
    assert {key for key in checkpoint if key.startswith("fedcluster")} - {HASH_KEY} == ENTRY_KEYS
    # The components are no nn.Modules: the weights are the K copies' alone, as before.
    assert {key.split(".")[0] for key in checkpoint["state_dict"]} == {"models"}
    assert set(module.federation.state_dict()) == ENTRY_KEYS
    assert (
        checkpoint[METADATA_KEY]["rounds_trained"] == 2 and checkpoint[METADATA_KEY]["algorithm"] == "FedRC"
    )


def test_load_state_dict_restores_the_store_the_server_optimizer_and_the_round_count(fitted):
    module, checkpoint = fitted
    restored = FederatedTraining()
    restored.plan = module.plan
    state = module.client_state
    restored.client_state = initial_client_state(module.plan, state.num_clients, state.label_sums.shape[1], 0)
    restored.load_state_dict(checkpoint)
    assert restored.rounds_trained == 2
    for key, value in state.state_dict().items():
        assert torch.equal(restored.client_state.state_dict()[key], value), key
    saved, loaded = module.server_optimizer.state, restored.server_optimizer.state
    assert saved and set(loaded) == set(saved)
    assert all(torch.equal(loaded[key], saved[key].cpu()) for key in saved)


def test_a_store_loaded_before_setup_waits_for_it(fitted):
    """``trainer.test(ckpt_path=...)`` of a fresh module: its store exists only from setup on."""
    module, checkpoint = fitted
    waiting = FederatedTraining()
    waiting.plan = module.plan
    waiting.load_state_dict(checkpoint)
    assert waiting.client_state is None and waiting.rounds_trained == 2
    assert waiting.server_optimizer.state.keys() == module.server_optimizer.state.keys()


def test_the_server_optimizer_follows_the_plan():
    training = FederatedTraining()
    assert training.server_optimizer is None  # no plan yet
    training.plan = lf.FedRCStrategy(2, server_optimizer="momentum").plan
    first = training.server_optimizer
    assert first is not None and training.server_optimizer is first  # one state for the run
    training.plan = lf.FedRCStrategy(2, server_optimizer="adam").plan
    assert training.server_optimizer is not first and training.server_optimizer.config.kind == "adam"
    training.plan = lf.FedRCStrategy(2).plan
    assert training.server_optimizer is None


def test_round_metrics_are_logged_per_epoch_and_returned():
    logged = []
    metrics = {"train/loss": 0.5, "clusters/active": 2.0}
    assert log_round_metrics(lambda *args, **options: logged.append((args, options)), metrics) is metrics
    assert [args for args, _ in logged] == [("train/loss", 0.5), ("clusters/active", 2.0)]
    assert [options["prog_bar"] for _, options in logged] == [True, False]
    assert all(o["on_epoch"] and not o["on_step"] and o["logger"] is False for _, o in logged)
