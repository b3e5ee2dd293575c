"""strategies/fedrc.py: FedRC end to end on real data: exactness against a plain PyTorch FedRC (K=1 is
FedAvg), concept separation, cluster removal mid-training, label noise, regression refused, and the
concept-discovery policy (``discovery=``; None: the paper's rule, bit for bit)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster import (
    ClusteredModule,
    ConceptDiscovery,
    FedRCStrategy,
)
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import LinearRegressor, MLPClassifier
from tests.conftest import make_trainer
from tests.helpers.reference_fedrc import reference_fedrc


@pytest.fixture(scope="module")
def small_digits():
    return DigitsFederated(num_clients=12, concepts=3, seed=0)


@pytest.mark.parametrize("num_clusters", [1, 3])
def test_engine_matches_plain_pytorch_fedrc(small_digits, num_clusters):
    """K=3: FedRC; K=1: FedAvg. Same seeds, same schedule: the weights must agree."""
    module = ClusteredModule(MLPClassifier(lr=0.2), num_clusters, seed=0)
    initial = [copy.deepcopy(m) for m in module.models]
    strategy = FedRCStrategy(num_clusters, clients_per_round=5, local_steps=3, seed=0)
    trainer = make_trainer(strategy, max_epochs=3, limit_val_batches=0)
    trainer.fit(module, datamodule=small_digits)
    expected, omega, sums = reference_fedrc(small_digits, initial, rounds=3, clients_per_round=5,
                                            local_steps=3, lr=0.2, seed=0)
    for got, want in zip(module.models, expected, strict=True):
        for p, q in zip(got.parameters(), want.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(module.client_state.omega, omega, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(module.client_state.label_sums, sums, rtol=1e-5, atol=1e-6)
    if num_clusters == 1:
        assert torch.all(module.client_state.omega == 1.0)


def test_fedrc_separates_three_concepts_that_fedavg_cannot_fit():
    """The issue's acceptance test: K=3 beats K=1 (FedAvg) by >= 25 points of global accuracy
    and recovers the concepts (ARI >= 0.8). Setting = the `fedcluster fit` main job."""
    dm = DigitsFederated(num_clients=30, concepts=3, seed=0)
    results = {}
    for k in (3, 1):
        strategy = FedRCStrategy(k, clients_per_round=10, local_steps=5, seed=0)
        trainer = make_trainer(strategy, max_epochs=150, limit_val_batches=0)
        trainer.fit(MLPClassifier(lr=0.2), datamodule=dm)
        results[k] = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    gap = results[3]["test/global_acc"] - results[1]["test/global_acc"]
    assert gap >= 0.25, results
    assert results[3]["test/concept_ari"] >= 0.8, results
    assert results[1]["test/concept_ari"] == pytest.approx(0.0)


def test_fedrc_removes_clusters_mid_training_and_freezes_them(digits):
    strategy = FedRCStrategy(
        4, clients_per_round=6, local_steps=2, config=FedRC.Config(removal_threshold=0.3),
    )
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


def test_removal_after_keeps_every_cluster_until_its_round(digits):
    # the same fit as above removes clusters within two rounds; removal_after=2 waits past them
    strategy = FedRCStrategy(
        4, clients_per_round=6, local_steps=2, config=FedRC.Config(removal_threshold=0.3, removal_after=2),
    )
    trainer = make_trainer(strategy, max_epochs=2, limit_val_batches=0)
    trainer.fit(MLPClassifier(lr=0.2), datamodule=digits)
    assert trainer.lightning_module.client_state.active.all()
    trainer.fit_loop.max_epochs = 3
    trainer.fit(trainer.lightning_module, datamodule=digits)
    assert not trainer.lightning_module.client_state.active.all()  # round index 2: removal acts


def test_label_noise_needs_one_sigma_per_client(digits):
    trainer = make_trainer(FedRCStrategy(3, config=FedRC.Config(label_noise_std=[0.1, 0.2])), max_epochs=1)
    with pytest.raises(ValueError, match="label_noise_std has 2 values .* 12 clients"):
        trainer.fit(MLPClassifier(), datamodule=digits)


def test_fedrc_refuses_regression_with_a_clear_message(synthetic):
    trainer = make_trainer(lf.FedRCStrategy(2), max_epochs=1)
    with pytest.raises(ValueError, match="use FedEMStrategy"):
        trainer.fit(LinearRegressor(10, 1), datamodule=synthetic)


def _fit(strategy, datamodule, rounds: int = 3) -> ClusteredModule:
    module = ClusteredModule(MLPClassifier(lr=0.2), strategy.num_clusters, seed=0)
    make_trainer(strategy, max_epochs=rounds, limit_val_batches=0).fit(module, datamodule=datamodule)
    return module


def test_discovery_none_is_the_paper_rule_bit_for_bit(small_digits):
    """``discovery=None`` (and ``config=None``) trains exactly what the paper's rule given to the
    plain FederatedStrategy trains: same weights, ω and label sums, compared with torch.equal."""
    schedule = dict(clients_per_round=5, local_steps=3, seed=0)
    strategy = FedRCStrategy(3, discovery=None, config=None, **schedule)
    assert strategy.algorithm.components == () and strategy.algorithm.config == FedRC.Config()
    ours = _fit(strategy, small_digits)
    paper = _fit(lf.FederatedStrategy(algorithm=FedRC(3, config=FedRC.Config()), **schedule), small_digits)
    for got, want in zip(ours.state_dict().values(), paper.state_dict().values(), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(ours.client_state.omega, paper.client_state.omega)
    assert torch.equal(ours.client_state.label_sums, paper.client_state.label_sums)


@pytest.mark.parametrize("cls", [lf.FedRCStrategy, lf.FedEMStrategy], ids=["fedrc", "fedem"])
def test_discovery_builds_the_rule_with_the_policys_components_and_trains(cls, small_digits):
    policy = ConceptDiscovery(min_share=0.1, gap=0.2)
    strategy = cls(4, discovery=policy, clients_per_round=6, local_steps=2, seed=0)
    rule = strategy.algorithm
    assert strategy.discovery is policy and isinstance(rule, FedRC)
    assert [type(c) for c in rule.components] == [type(c) for c in policy.components()]
    assert rule.config == FedRC.Config(use_label_stats=cls is lf.FedRCStrategy)  # the paper's options
    module = _fit(strategy, small_digits, rounds=2)
    state = module.client_state
    assert int(state.seen.sum()) >= 6 and math.isfinite(module.round_metrics["train/loss"])
    torch.testing.assert_close(
        state.omega[state.seen].sum(1), torch.ones(int(state.seen.sum()), dtype=torch.float64)
    )


def test_discovery_with_the_configs_mechanism_options_is_refused_naming_them():
    config = FedRC.Config(group_round=15, group_hold=5, merge_threshold=0.5, adam_gamma=False)
    with pytest.raises(ValueError, match=(
        r"discovery=ConceptDiscovery\(...\) and the config's mechanism options group_round, group_hold, "
        r"merge_threshold were both given: .* or pass discovery=None"
    )):  # fmt: skip
        FedRCStrategy(3, discovery=ConceptDiscovery(), config=config)
    paper_options = FedRC.Config(hard_prediction=True)
    rule = FedRCStrategy(3, discovery=ConceptDiscovery(), config=paper_options).algorithm
    assert rule.config.hard_prediction  # the paper's own options go with the policy
    with pytest.raises(TypeError, match="discovery must be a concept-discovery policy such as"):
        FedRCStrategy(3, discovery="ConceptDiscovery")
