"""Strategies reject keyword arguments they do not read (a typo must not train with the default),
naming the nearest valid one; Lightning's DDP process arguments still pass."""

from __future__ import annotations

from datetime import timedelta

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment

import lightning_fedcluster.strategies as strategies
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.strategies.federated import FederatedStrategy
from lightning_fedcluster.strategies.keywords import init_parameters

CLASSES = [getattr(strategies, name) for name in strategies.__all__]

# A typo of one argument that only this class has, and the name it should suggest.
OWN_TYPOS = {
    "CFLStrategy": ("eps_1", "eps1"),
    "DFedEMStrategy": ("edge_prob", "edge_probability"),
    "FedProxStrategy": ("mu_", "mu"),
    "FedRCStrategy": ("removal_treshold", "removal_threshold"),
    "FedEMStrategy": ("hard_predictions", "hard_prediction"),
    "FedSoftStrategy": ("selection_sizes", "selection_size"),
    "FeSEMStrategy": ("representation_layer", "representation_layers"),
    "WeCFLStrategy": ("representation_layer", "representation_layers"),
}


def test_every_strategy_class_is_covered():
    assert len(CLASSES) == 11 and FederatedStrategy in CLASSES


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_typo_is_a_type_error_that_suggests_the_name_and_lists_the_valid_ones(cls):
    with pytest.raises(TypeError) as error:
        cls(num_cluster=5)
    message = str(error.value)
    assert cls.__name__ in message and "'num_cluster' (did you mean 'num_clusters'?)" in message
    assert "Valid arguments:" in message and "local_steps" in message and "start_method" in message
    for fixed in cls.fixed_arguments:  # arguments the class sets itself are not offered
        assert f" {fixed}," not in message.split("Valid arguments:")[1]
    if cls.__name__ in OWN_TYPOS:
        typo, meant = OWN_TYPOS[cls.__name__]
        with pytest.raises(TypeError, match=rf"'{typo}' \(did you mean '{meant}'\?\)"):
            cls(**{typo: 1})


def test_clients_per_round_typo_no_longer_trains_every_client():
    with pytest.raises(TypeError, match=r"'clients_per_rnd' \(did you mean 'clients_per_round'\?\)"):
        strategies.FedRCStrategy(num_clusters=3, clients_per_rnd=10)


def test_all_unknown_names_are_reported_at_once_and_ddp_wrapper_arguments_are_explained():
    with pytest.raises(TypeError) as error:
        strategies.IFCAStrategy(3, find_unused_parameters=True, zzz=1)
    message = str(error.value)
    assert "unexpected keyword arguments 'find_unused_parameters' (an argument of DDP's gradient" in message
    assert "'zzz'" in message


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_ddp_process_arguments_still_reach_lightning(cls):
    environment = LightningEnvironment()
    own = {"algorithm": FedRC(3)} if cls is FederatedStrategy else {}  # the plain one runs a given rule
    strategy = cls(
        **own,
        start_method="spawn",
        process_group_backend="gloo",
        timeout=timedelta(minutes=3),
        cluster_environment=environment,
    )
    assert strategy.process_group_backend == "gloo"
    assert strategy.cluster_environment is environment
    assert strategy._start_method == "spawn" and strategy._timeout == timedelta(minutes=3)


def test_valid_names_come_from_the_signatures_subclass_first():
    names = init_parameters(strategies.FedRCStrategy, FederatedStrategy)
    assert names[:2] == ["num_clusters", "hard_prediction"]
    assert "clients_per_round" in names and "timeout" in names and len(names) == len(set(names))
