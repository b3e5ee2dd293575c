"""A Flower run's ``save-path`` file loaded back (``load_run``) tests and predicts under the run's
strategy as the Lightning-trained module of the same run does; bad files, K and architectures
are refused by name."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.flower import FlowerApps, load_run, read_run
from lightning_fedcluster.models import MLPClassifier
from lightning_fedcluster.prediction import concat_predictions
from tests.conftest import make_trainer
from tests.flower import workload
from tests.flower.local_grid import partitions, run_local
from tests.flower.test_server_host import lightning_run


def saved_run(name: str, path, collect: bool):
    """The workload's run of ``name`` on an in-process grid of 2 nodes, saved at ``path`` as a
    deployment's server saves it (``collect``: with the nodes' client stores, as ``simulate``)."""
    apps = FlowerApps(
        workload.STRATEGIES[name], workload.make_module, workload.make_datamodule,
        num_rounds=workload.ROUNDS, save_path=str(path), collect_client_state=collect,
    )  # fmt: skip
    module, _ = run_local(apps, partitions(2))
    return module, apps.server


@pytest.fixture(scope="module")
def fedrc_run(tmp_path_factory):
    """FedRC with FedRC-Adam γ, label noise and cluster removal; the nodes keep their stores."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    path = tmp_path_factory.mktemp("fedrc") / "run.pt"
    try:
        module, server = saved_run("fedrc", path, collect=False)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    return path, module, server


def scores_of(module, name: str) -> dict[str, float]:
    trainer = make_trainer(workload.STRATEGIES[name](), max_epochs=1)
    return trainer.test(module, datamodule=workload.make_datamodule(), verbose=False)[0]


def test_a_saved_deployment_run_tests_and_predicts_like_the_lightning_trained_module(fedrc_run):
    path, _, server = fedrc_run
    loaded = load_run(path, workload.MomentumMLP, workload.fedrc_strategy())
    assert loaded.round_metrics == server.metrics[-1]
    lightning = lightning_run("fedrc")
    assert not bool(loaded.client_state.active.all()), "the run removed a cluster"
    scores = scores_of(loaded, "fedrc")
    assert scores == pytest.approx(scores_of(lightning, "fedrc"), rel=1e-5)
    assert "test/global_acc" in scores and "test/local_acc" in scores

    trainer = make_trainer(workload.fedrc_strategy(), max_epochs=1)
    out = concat_predictions(trainer.predict(loaded, datamodule=workload.make_datamodule()))
    local = out["client"] >= 0
    assert int(local.sum()) > 0 and int((out["global_client"] >= 0).sum()) > 0, "unseen clients predicted"
    accuracy = float((out["preds"][local] == out["target"][local]).double().mean())
    assert accuracy == pytest.approx(scores["test/local_acc"], abs=1e-6)
    assert out["probs"].shape == (out["preds"].shape[0], 10)
    # Plain rows from clients without labels: the mixture prior.
    rows = workload.make_datamodule().test_x[:5]
    plain = concat_predictions(trainer.predict(loaded, dataloaders=torch.utils.data.DataLoader(rows)))
    assert plain["preds"].shape == (5,) and bool((plain["client"] == -1).all())


def test_a_simulated_run_and_its_saved_file_test_alike(tmp_path, task_identity):
    """FedSoft's personal models come back with the nodes' stores: the module the run returns,
    its saved file and the Lightning-trained module score the same."""
    returned, _ = saved_run("fedsoft", tmp_path / "run.pt", collect=True)
    loaded = load_run(tmp_path / "run.pt", workload.make_module(), workload.STRATEGIES["fedsoft"]())
    assert loaded.client_state.personal, "the personal models are in the file"
    expected = scores_of(lightning_run("fedsoft"), "fedsoft")
    assert scores_of(loaded, "fedsoft") == pytest.approx(expected, rel=1e-5)
    assert scores_of(returned, "fedsoft") == pytest.approx(expected, rel=1e-5)


def test_a_deployed_fedsoft_run_warns_that_its_personal_models_stayed_on_the_nodes(tmp_path, task_identity):
    saved_run("fedsoft", tmp_path / "run.pt", collect=False)
    with pytest.warns(UserWarning, match="holds no personal models"):
        loaded = load_run(tmp_path / "run.pt", workload.make_module, workload.STRATEGIES["fedsoft"]())
    assert not loaded.client_state.personal


def test_the_file_holds_the_rounds(fedrc_run):
    path, _, server = fedrc_run
    run = read_run(path)
    assert run.metrics == server.metrics and len(run.metrics) == workload.ROUNDS
    assert run.dropped == {} and run.num_clusters == 3 and run.num_clients == 6


def test_another_k_is_refused_naming_both(fedrc_run):
    path = fedrc_run[0]
    with pytest.raises(
        ValueError, match=r"K=3 cluster models but the strategy has num_clusters=2.*num_clusters=3"
    ):
        load_run(path, workload.make_module(), lf.FedRCStrategy(2))
    other = lf.ClusteredModule(workload.make_module(), 2)
    with pytest.raises(
        ValueError, match="module is a ClusteredModule with 2 cluster models but the run has K=3"
    ):
        load_run(path, other, workload.fedrc_strategy())


def test_another_architecture_is_refused_naming_the_module(fedrc_run):
    wider = MLPClassifier(hidden=(32,))
    with pytest.raises(
        ValueError, match=r"module=MLPClassifier does not have the architecture.*shapes differ"
    ):
        load_run(fedrc_run[0], wider, workload.fedrc_strategy())
    deeper = MLPClassifier(hidden=(128, 64))
    with pytest.raises(ValueError, match=r"missing \['models.0.net.4"):
        load_run(fedrc_run[0], deeper, workload.fedrc_strategy())


def test_a_file_that_is_not_a_run_is_refused(tmp_path, fedrc_run):
    strategy, module = workload.fedrc_strategy(), workload.make_module
    with pytest.raises(FileNotFoundError, match="path='nowhere.pt' is not a file: give the save-path"):
        load_run("nowhere.pt", module, strategy)
    text = tmp_path / "notes.txt"
    text.write_text("not a run")
    with pytest.raises(ValueError, match="is not a Flower run: torch.load could not read it"):
        load_run(text, module, strategy)
    weights = tmp_path / "weights.pt"
    torch.save(fedrc_run[1].state_dict(), weights)  # the weights alone
    with pytest.raises(ValueError, match=r"is not a Flower run: it lacks \['state_dict', 'client_state'"):
        load_run(weights, module, strategy)
    with pytest.raises(TypeError, match="strategy must be the library strategy the run trained with"):
        load_run(fedrc_run[0], module, "FedRC")


def test_a_lightning_checkpoint_is_refused_with_the_way_to_test_it(tmp_path, fedrc_run):
    trainer = make_trainer(workload.fedrc_strategy(), max_epochs=1, limit_val_batches=0)
    trainer.fit(workload.make_module(), datamodule=workload.make_datamodule())
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    with pytest.raises(ValueError, match="ckpt_path=path"):
        load_run(tmp_path / "last.ckpt", workload.make_module, workload.fedrc_strategy())


def test_testing_without_the_strategy_says_to_pass_it(fedrc_run):
    loaded = load_run(fedrc_run[0], workload.make_module, workload.fedrc_strategy())
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(
        TypeError, match="tests and predicts under a federated strategy.*pass the one it trained"
    ):
        trainer.test(loaded, datamodule=workload.make_datamodule())


def test_a_run_file_with_a_changed_byte_or_cut_short_is_refused_by_name(tmp_path, fedrc_run):
    """The run file carries a content hash: a flipped byte in ω (the row no longer sums to 1) or a
    file cut short is refused, naming it, where torch.load alone would accept the first."""
    path, module, _ = fedrc_run
    omega = bytes(module.client_state.omega[2].numpy().tobytes())
    data = path.read_bytes()
    flipped = tmp_path / "flipped.pt"
    at = data.index(omega) + 3
    flipped.write_bytes(data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :])
    assert abs(float(torch.load(flipped)["client_state"]["omega"][2].sum()) - 1) > 1e-9
    with pytest.raises(ValueError, match="do not match the content hash") as error:
        load_run(flipped, workload.make_module, workload.fedrc_strategy())
    assert str(flipped) in str(error.value)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        ValueError, match="torch.load could not read it as one .*a run file cut short"
    ) as error:
        load_run(cut, workload.make_module, workload.fedrc_strategy())
    assert str(cut) in str(
        error.value
    ) and f"The last good checkpoint beside it is {tmp_path / 'flipped.pt'}" not in str(error.value), (
        "the flipped file is not good"
    )
