"""Every algorithm through the public API on real data (DigitsFederated), and the engine-level
edge cases: empty clusters, clusters removed or created mid-training, personal models, shared
layers, fine-tuning, and exact resume with algorithm-specific client state."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_fedcluster import (
    CFLStrategy,
    ClusteredModule,
    DFedEMStrategy,
    FedAvgStrategy,
    FedEMStrategy,
    FedProxStrategy,
    FedRCStrategy,
    FedSoftStrategy,
    FeSEMStrategy,
    IFCAStrategy,
    WeCFLStrategy,
)
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

STRATEGIES = {
    "fedrc": lambda: FedRCStrategy(3, clients_per_round=6, local_steps=3),
    "fedem": lambda: FedEMStrategy(3, clients_per_round=6, local_steps=3),
    "dfedem": lambda: DFedEMStrategy(3, local_steps=3),
    "ifca": lambda: IFCAStrategy(3, clients_per_round=6, local_steps=3),
    "fesem": lambda: FeSEMStrategy(3, clients_per_round=6, local_steps=3),
    "wecfl": lambda: WeCFLStrategy(3, clients_per_round=6, local_steps=3),
    "fedsoft": lambda: FedSoftStrategy(3, selection_size=2, local_steps=3),
    "cfl": lambda: CFLStrategy(3, local_steps=3),
    "fedavg": lambda: FedAvgStrategy(clients_per_round=6, local_steps=3),
    "fedprox": lambda: FedProxStrategy(mu=0.1, clients_per_round=6, local_steps=3),
}


@pytest.fixture(scope="module")
def digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


def _weights(module: ClusteredModule) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.models.parameters()]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_trains_through_the_public_api(digits, name):
    module = ClusteredModule(MLPClassifier(lr=0.2), STRATEGIES[name]().num_clusters, seed=0)
    before = _weights(module)
    trainer = make_trainer(STRATEGIES[name](), max_epochs=3, limit_val_batches=0)
    trainer.fit(module, datamodule=digits)
    results = trainer.test(module, datamodule=digits, verbose=False)[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, _weights(module), strict=True))
    assert 0.0 <= results["test/local_acc"] <= 1.0 and 0.0 <= results["test/global_acc"] <= 1.0
    assert -1.0 <= results["test/concept_ari"] <= 1.0
    state = module.client_state
    assert int(state.seen.sum()) >= 6
    assert torch.allclose(
        state.omega[state.seen].sum(1), torch.ones(int(state.seen.sum()), dtype=torch.float64)
    )
    assert module.round_metrics["train/loss"] > 0 and math.isfinite(module.round_metrics["train/loss"])


def test_ifca_cluster_without_members_keeps_its_model(digits):
    module = ClusteredModule(MLPClassifier(lr=0.2), 3, seed=0)
    with torch.no_grad():  # clusters 1 and 2 predict class 0 with certainty: nobody picks them
        for k in (1, 2):
            module.models[k].net[-1].bias.copy_(torch.tensor([1e3] + [0.0] * 9))
    frozen = [copy.deepcopy(module.models[k].state_dict()) for k in (1, 2)]
    trainer = make_trainer(
        IFCAStrategy(3, clients_per_round=6, local_steps=2), max_epochs=2, limit_val_batches=0
    )
    trainer.fit(module, datamodule=digits)
    seen = module.client_state.seen
    assert torch.equal(
        module.client_state.omega[seen].argmax(1), torch.zeros(int(seen.sum()), dtype=torch.long)
    )
    for k, state in zip((1, 2), frozen, strict=True):
        for key, value in module.models[k].state_dict().items():
            assert torch.equal(value, state[key]), (k, key)


def test_fedsoft_personal_models_are_kept_and_give_local_accuracy(digits):
    strategy = FedSoftStrategy(3, selection_size=2, local_steps=2)
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    module = trainer.lightning_module
    state = module.client_state
    assert set(state.personal) == set(state.seen.nonzero().flatten().tolist())
    assert all(v.device.type == "cpu" for v in state.personal.values())
    assert 2 <= len(state.personal) <= 12
    # Local accuracy is measured with the personal models: recompute it by hand.
    results = trainer.test(module, datamodule=digits, verbose=False)[0]
    correct = total = 0
    for client in range(digits.num_clients):
        x, y = digits.test_split(client)
        if client in state.personal:
            model = copy.deepcopy(module.models[0])
            torch.nn.utils.vector_to_parameters(state.personal[client].clone(), model.parameters())
            model.eval()
            with torch.no_grad():
                predicted = model(x).argmax(1)
        else:
            omega = state.omega[client]
            predicted = module.predict_proba(x, omega).argmax(1)
        correct += int((predicted == y).sum())
        total += len(y)
    assert results["test/local_acc"] == pytest.approx(correct / total, abs=1e-6)  # logged as float32


def test_cfl_split_creates_a_cluster_from_a_copy_of_its_parent(digits):
    module = ClusteredModule(MLPClassifier(lr=0.2), 3, seed=0)
    strategy = CFLStrategy(3, local_steps=2, eps1=1e6, eps2=1e-6)  # always split while there is room
    trainer = make_trainer(strategy, max_epochs=1, limit_val_batches=0)
    trainer.fit(module, datamodule=digits)
    state = module.client_state
    assert state.active.tolist() == [True, True, False]
    assert set(state.omega.argmax(1).tolist()) == {0, 1}
    for a, b in zip(module.models[0].parameters(), module.models[1].parameters(), strict=True):
        assert torch.equal(a, b)
    trainer = make_trainer(
        CFLStrategy(3, local_steps=2, eps1=1e6, eps2=1e-6), max_epochs=3, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    assert trainer.lightning_module.client_state.active.tolist() == [True, True, True]


def test_fedrc_removes_clusters_mid_training_and_freezes_them(digits):
    strategy = FedRCStrategy(4, clients_per_round=6, local_steps=2, removal_threshold=0.3)
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    module = trainer.lightning_module
    removed = (~module.client_state.active).nonzero().flatten().tolist()
    assert removed and module.round_metrics["clusters/active"] == 4 - len(removed)
    assert torch.all(module.client_state.omega[:, removed] == 0)
    frozen = {k: copy.deepcopy(module.models[k].state_dict()) for k in removed}
    trainer.fit_loop.max_epochs = 4
    trainer.fit(module, datamodule=digits)
    for k, state in frozen.items():
        for key, value in module.models[k].state_dict().items():
            assert torch.equal(value, state[key])
    results = trainer.test(module, datamodule=digits, verbose=False)[0]
    assert math.isfinite(results["test/global_acc"])


def test_shared_feature_extractor_is_one_module_trained_by_all_clusters(digits):
    strategy = FedRCStrategy(3, clients_per_round=6, local_steps=2, shared_layers=("net.0",))
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    model = MLPClassifier(lr=0.2)
    trainer.fit(model, datamodule=digits)
    module = trainer.lightning_module
    assert module.models[1].net[0] is module.models[0].net[0] is module.models[2].net[0]
    params = [p for group in trainer.optimizers[0].param_groups for p in group["params"]]
    assert len(params) == len({id(p) for p in params}) == 2 + 3 * 2
    assert not torch.equal(module.models[0].net[2].weight, module.models[1].net[2].weight)
    fresh = ClusteredModule(MLPClassifier(lr=0.2), 3, seed=0, shared_layers=("net.0",))
    assert not torch.equal(fresh.models[0].net[0].weight, module.models[0].net[0].weight)
    with pytest.raises(ValueError, match="shared_layers names 'trunk'"):
        ClusteredModule(MLPClassifier(), 3, shared_layers=("trunk",))


def test_finetuning_changes_local_accuracy_but_not_the_models(digits):
    results = {}
    for epochs in (0, 1):
        trainer = make_trainer(
            FedRCStrategy(
                3, clients_per_round=6, local_steps=2, finetune_epochs=epochs, shared_layers=("net.0",)
            ),
            max_epochs=2,
            limit_val_batches=0,
        )
        trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
        before = _weights(trainer.lightning_module)
        results[epochs] = trainer.test(trainer.lightning_module, datamodule=digits, verbose=False)[0]
        assert all(torch.equal(a, b) for a, b in zip(before, _weights(trainer.lightning_module), strict=True))
    assert results[1]["test/local_acc"] != results[0]["test/local_acc"]
    assert results[1]["test/global_acc"] == results[0]["test/global_acc"]


@pytest.mark.parametrize("name", ["fedsoft", "fedrc_adam", "cfl"])
def test_resume_is_exact_with_algorithm_state(digits, tmp_path, name):
    def strategy():
        return {
            "fedsoft": lambda: FedSoftStrategy(2, selection_size=3, local_steps=2, estimation_interval=3),
            "fedrc_adam": lambda: FedRCStrategy(3, clients_per_round=5, local_steps=2, adam_gamma=True),
            "cfl": lambda: CFLStrategy(3, local_steps=2, eps1=1e6, eps2=1e-6),
        }[name]()

    straight = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    straight.fit(MLPClassifier(lr=0.2), datamodule=digits)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = make_trainer(
        strategy(), max_epochs=2, limit_val_batches=0, enable_checkpointing=True, callbacks=[checkpoint]
    )
    first.fit(MLPClassifier(lr=0.2), datamodule=digits)
    resumed = make_trainer(strategy(), max_epochs=4, limit_val_batches=0)
    resumed.fit(MLPClassifier(lr=0.2), datamodule=digits, ckpt_path=str(tmp_path / "last.ckpt"))
    a, b = straight.lightning_module, resumed.lightning_module
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    state_a, state_b = a.client_state.state_dict(), b.client_state.state_dict()
    assert set(state_a) == set(state_b)
    for key, value in state_a.items():
        assert torch.equal(value, state_b[key]), key


def test_new_client_predictor_for_every_soft_method(digits):
    trainer = make_trainer(
        FedEMStrategy(3, clients_per_round=6, local_steps=2), max_epochs=2, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    module = trainer.lightning_module
    x, y = digits.global_split(0)
    before = _weights(module)
    predictor = module.new_client(x, y)
    assert predictor.omega.shape == (3,) and float(predictor.omega.sum()) == pytest.approx(1.0)
    probs = predictor.predict_proba(x)
    assert probs.shape == (len(y), 10) and torch.allclose(probs.sum(1), torch.ones(len(y), dtype=probs.dtype))
    assert torch.equal(predictor.predict(x), probs.argmax(1))
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(module), strict=True))


def test_strategy_arguments_are_checked():
    with pytest.raises(ValueError, match="selection_size"):
        FedSoftStrategy(2, selection_size=0)
    with pytest.raises(ValueError, match="clients_per_round"):
        FedSoftStrategy(2, clients_per_round=5)
    with pytest.raises(ValueError, match="removal_threshold"):
        FedRCStrategy(3, removal_threshold=1.5)
    with pytest.raises(ValueError, match="label_noise_std"):
        FedRCStrategy(3, label_noise_std=-1.0)
    with pytest.raises(ValueError, match="label_noise_std"):
        FedEMStrategy(3, label_noise_std=1.0)
    with pytest.raises(ValueError, match="mu"):
        FedProxStrategy(mu=-0.1)
    # A clustered configuration switched to FedAvg keeps its num_clusters: said, not an error.
    with pytest.warns(UserWarning, match="trains one model: num_clusters=3 from the configuration"):
        assert FedAvgStrategy(num_clusters=3).num_clusters == 1
    with pytest.raises(ValueError, match="eps1"):
        CFLStrategy(3, eps1=0.0)
    with pytest.raises(ValueError, match="finetune_epochs"):
        FedRCStrategy(3, finetune_epochs=-1)


def test_label_noise_needs_one_sigma_per_client(digits):
    trainer = make_trainer(FedRCStrategy(3, label_noise_std=[0.1, 0.2]), max_epochs=1)
    with pytest.raises(ValueError, match="label_noise_std has 2 values .* 12 clients"):
        trainer.fit(MLPClassifier(), datamodule=digits)


def test_dfedem_clients_keep_their_own_models_and_a_complete_graph_reaches_consensus(digits):
    trainer = make_trainer(
        DFedEMStrategy(3, local_steps=2, edge_probability=1.0), max_epochs=2, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    state = trainer.lightning_module.client_state
    assert sorted(state.personal) == list(range(12))
    size = sum(p.numel() for p in trainer.lightning_module.models.parameters())
    assert state.personal[0].numel() == size  # all K models of the client
    for vector in state.personal.values():  # complete graph: W = 1/M everywhere
        torch.testing.assert_close(vector, state.personal[0], rtol=0, atol=1e-6)
    sparse = make_trainer(
        DFedEMStrategy(3, local_steps=2, edge_probability=0.0), max_epochs=2, limit_val_batches=0
    )
    sparse.fit(MLPClassifier(lr=0.2), datamodule=digits)
    ring = sparse.lightning_module.client_state.personal
    assert not torch.allclose(ring[0], ring[6])  # a ring mixes only neighbours: no consensus yet


def test_fesem_initialises_centres_from_the_first_rounds_local_models(digits):
    trainer = make_trainer(
        FeSEMStrategy(3, clients_per_round=6, local_steps=2), max_epochs=1, limit_val_batches=0
    )
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    module = trainer.lightning_module
    state = module.client_state
    assert float(state.extra["centres_ready"]) == 1.0
    assigned = state.omega[state.seen]
    assert torch.equal(assigned.sum(1), torch.ones(6, dtype=torch.float64)) and assigned.max() == 1.0
    # The three centres are three different local models trained from the same start.
    flat = [torch.cat([p.flatten() for p in m.parameters()]) for m in module.models]
    assert not torch.equal(flat[0], flat[1]) and not torch.equal(flat[1], flat[2])
    assert len(set(assigned.argmax(1).tolist())) >= 2


def test_bad_representation_layers_and_graph_density_fail_before_training(digits):
    trainer = make_trainer(FeSEMStrategy(3, representation_layers=("trunk",)), max_epochs=1)
    with pytest.raises(ValueError, match="representation_layers=\\('trunk',\\) matches no parameter"):
        trainer.fit(MLPClassifier(), datamodule=digits)
    assert trainer.global_step == 0
    with pytest.raises(ValueError, match="edge_probability"):
        DFedEMStrategy(3, edge_probability=1.5)
    with pytest.raises(ValueError, match="clients_per_round"):
        DFedEMStrategy(3, clients_per_round=4)
