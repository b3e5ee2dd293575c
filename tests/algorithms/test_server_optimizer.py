"""algorithms/server_optimizer.py: FedAvgM's and FedAdam's step directions (Reddi et al. 2021)
computed by hand, the state each keeps, and the configuration's checks by argument name."""

from __future__ import annotations

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms.server_optimizer import (
    ServerOptimizerConfig,
    adam_direction,
    direction,
    momentum_direction,
)


def test_momentum_adds_the_update_to_the_decayed_velocity_in_place() -> None:
    velocity = torch.tensor([1.0, 2.0])
    step = momentum_direction(torch.tensor([1.0, -1.0]), velocity, beta=0.5)
    assert step.tolist() == [1.5, 0.0]  # 0.5 * [1, 2] + [1, -1]
    assert step.data_ptr() == velocity.data_ptr()  # the state is updated in place


def test_adam_direction_is_m_over_root_v_plus_tau() -> None:
    m, v = torch.tensor([0.0, 2.0]), torch.tensor([0.0, 4.0])
    step = adam_direction(torch.tensor([2.0, 0.0]), m, v, betas=(0.5, 0.75), tau=1.0)
    assert m.tolist() == [1.0, 1.0]  # 0.5 m + 0.5 Δ
    assert v.tolist() == [1.0, 3.0]  # 0.75 v + 0.25 Δ²
    torch.testing.assert_close(step, torch.tensor([1.0 / 2.0, 1.0 / (3.0**0.5 + 1.0)]))


def test_direction_dispatches_on_the_kind_and_none_is_the_plain_average() -> None:
    update = torch.tensor([0.25, -4.0])
    assert direction(ServerOptimizerConfig(), update, {}) is update
    state = {"velocity": torch.tensor([2.0, 2.0])}
    assert direction(ServerOptimizerConfig("momentum", momentum=0.5), update, state).tolist() == [1.25, -3.0]


def test_each_kind_names_its_state_and_adams_v_starts_at_tau_squared() -> None:
    assert ServerOptimizerConfig().state_names() == ()
    assert ServerOptimizerConfig("momentum").state_names() == ("velocity",)
    adam = ServerOptimizerConfig("adam", tau=0.1)
    assert adam.state_names() == ("m", "v")
    assert adam.initial("m") == 0.0 and adam.initial("v") == pytest.approx(0.01)


def test_unset_hyperparameters_take_reddi_et_als_defaults() -> None:
    config = ServerOptimizerConfig.from_arguments("adam", None, None, None)
    assert (config.momentum, config.betas, config.tau) == (0.9, (0.9, 0.99), 1e-3)
    assert ServerOptimizerConfig.from_arguments("adam", None, [0.5, 0.6], None).betas == (0.5, 0.6)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"server_optimizer": "sgd"}, "server_optimizer must be one of"),
        ({"server_optimizer": "momentum", "server_momentum": 1.0}, "server_momentum"),
        ({"server_optimizer": "adam", "server_betas": (0.9,)}, "server_betas"),
        ({"server_optimizer": "adam", "server_tau": 0.0}, "server_tau"),
        ({"server_momentum": 0.9}, "server_momentum applies to another server optimizer"),
        ({"server_optimizer": "momentum", "server_tau": 1e-3}, "server_tau applies"),
    ],
)
def test_bad_server_optimizer_arguments_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        lf.FedRCStrategy(2, **options)
