"""strategies/round_arguments.py: every round argument and reply setting is checked when the
strategy is built, each error naming the argument (and the fix where there is one)."""

from __future__ import annotations

import pytest

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.strategies.round_arguments import (
    algorithm_clusters,
    check_reply_arguments,
    check_round_arguments,
)

VALID = {
    "clients_per_round": None,
    "local_steps": 5,
    "local_epochs": None,
    "drop_last": False,
    "seed": 0,
    "executor": "auto",
    "clients_per_chunk": None,
    "server_lr": 1.0,
    "finetune_epochs": 0,
}


def test_valid_round_arguments_pass() -> None:
    check_round_arguments(**VALID)
    check_round_arguments(**VALID | {"local_steps": None, "local_epochs": 2, "drop_last": True})
    check_round_arguments(
        **VALID | {"clients_per_round": 3, "executor": "vectorized", "clients_per_chunk": 8}
    )
    check_round_arguments(**VALID | {"seed": 2**32 - 1, "server_lr": 0.01, "finetune_epochs": 3})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"clients_per_round": 0}, "clients_per_round"),
        ({"local_steps": 2.5}, "local_steps"),
        ({"local_steps": None, "local_epochs": 0}, "local_epochs"),
        ({"local_epochs": 1}, "give either local_steps or local_epochs, not both"),
        ({"drop_last": 1}, "drop_last must be True or False, got 1"),
        ({"drop_last": True}, "drop_last applies to local_epochs .*give local_epochs"),
        ({"seed": 2**32}, r"seed must be an integer in \[0, 2\*\*32\)"),
        ({"executor": "gpu"}, r"executor must be one of \('auto', 'loop', 'vectorized'\), got 'gpu'"),
        ({"clients_per_chunk": 0}, "clients_per_chunk"),
        ({"server_lr": 0.0}, "server_lr must be > 0, got 0.0"),
        ({"finetune_epochs": -1}, "finetune_epochs must be an integer >= 0, got -1"),
        ({"finetune_epochs": True}, "finetune_epochs must be an integer >= 0, got True"),
    ],
)
def test_a_bad_round_argument_is_refused_by_name(change, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_round_arguments(**VALID | change)


def test_drop_last_needs_local_epochs():
    with pytest.raises(ValueError, match="drop_last applies to local_epochs"):
        lf.FedRCStrategy(2, local_steps=3, drop_last=True)


def test_valid_reply_settings_pass() -> None:
    check_reply_arguments(None, 1, None)
    check_reply_arguments(0.5, 3, 3)
    check_reply_arguments(10, 7, None)  # no clients_per_round: every client takes part


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_update_norm": 0}, "max_update_norm must be a number > 0"),
        ({"max_update_norm": "big"}, "max_update_norm must be a number > 0"),
        ({"min_clients_per_round": 0}, "min_clients_per_round"),
        (
            {"clients_per_round": 3, "min_clients_per_round": 4},
            "min_clients_per_round=4 exceeds clients_per_round=3",
        ),
    ],
)
def test_bad_reply_settings_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        lf.FedAvgStrategy(**options)


def test_algorithm_clusters_takes_k_from_the_rule_and_refuses_what_cannot_be_meant() -> None:
    assert algorithm_clusters("S", FedRC(4), None, builds_own=False, base=True) == 4
    assert algorithm_clusters("S", None, 3, builds_own=True, base=False) == 3
    assert algorithm_clusters("S", None, None, builds_own=True, base=False) == 1
    with pytest.raises(ValueError, match="num_clusters=2 but the algorithm has num_clusters=4: set K once"):
        algorithm_clusters("S", FedRC(4), 2, builds_own=False, base=True)
    with pytest.raises(TypeError, match="FederatedStrategy needs the algorithm to run"):
        algorithm_clusters("FederatedStrategy", None, 3, builds_own=False, base=True)
    with pytest.raises(TypeError, match="FedRCStrategy builds its own algorithm"):
        algorithm_clusters("FedRCStrategy", FedRC(3), None, builds_own=True, base=False)
    with pytest.raises(TypeError, match="an Algorithm\\), got str"):
        algorithm_clusters("S", "fedrc", None, builds_own=False, base=True)
