"""``simulate`` enters Flower's simulation runtime directly, not through Flower's deprecated
``run_simulation`` wrapper, so no "DEPRECATED FEATURE" line is printed."""

from __future__ import annotations

import importlib
import inspect
import logging

import pytest

from lightning_fedcluster.flower import simulate, simulation
from tests.flower import workload

# flwr.simulation's __init__ rebinds the name run_simulation to the function: import the module itself.
flower_runtime = importlib.import_module("flwr.simulation.run_simulation")


def test_the_runtime_is_entered_below_the_deprecated_wrapper(monkeypatch) -> None:
    real = flower_runtime._run_simulation
    calls: list[dict] = []

    def deprecated(*args, **kwargs):
        raise AssertionError("Flower's deprecated run_simulation was called")

    monkeypatch.setattr(flower_runtime, "run_simulation", deprecated)
    monkeypatch.setattr(flower_runtime, "warn_deprecated_feature", deprecated)
    monkeypatch.setattr(flower_runtime, "_run_simulation", lambda **kwargs: calls.append(kwargs))
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 1}}
    simulation.run_in_simulation_runtime("server", "client", 3, backend)
    (call,) = calls
    inspect.signature(real).bind(**call)  # the installed flwr's runtime takes exactly these arguments
    assert (call["server_app"], call["client_app"], call["num_supernodes"]) == ("server", "client", 3)
    assert call["backend_config"] is backend and call["backend_name"] == "ray"
    assert "run_simulation(" not in inspect.getsource(simulation).replace("_run_simulation(", "")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.slow
def test_a_real_simulation_prints_no_deprecation() -> None:
    lines = Lines()
    logging.getLogger("flwr").addHandler(lines)
    try:
        module = simulate(
            workload.STRATEGIES["fedavg"](), workload.make_module(), workload.make_datamodule(),
            num_rounds=1, num_supernodes=2, num_cpus=1,
        )  # fmt: skip
    finally:
        logging.getLogger("flwr").removeHandler(lines)
    assert module.round_metrics["train/clients"] > 0
    assert lines.lines, "Flower's log was not captured"
    assert not [line for line in lines.lines if "DEPRECATED" in line], lines.lines


@pytest.mark.slow
def test_a_simulation_whose_rounds_train_no_client_fails_naming_the_cause() -> None:
    """Every reply is rejected (a norm bound no update meets): the ServerApp stops at round 1 and
    simulate raises with its reason instead of returning untrained weights."""
    import lightning_fedcluster as lf

    with pytest.raises(RuntimeError, match="round 1 trained no client"):  # NoClientsError, or chained
        simulate(
            lf.FedAvgStrategy(local_steps=2, max_update_norm=1e-9), workload.make_module(),
            workload.make_datamodule(), num_rounds=2, num_supernodes=2, num_cpus=1,
        )  # fmt: skip


def _simulate_on_local_grid(monkeypatch) -> None:
    """``simulate`` as written, with the apps run on the in-process grid instead of Ray."""
    from tests.flower.local_grid import partitions, run_local

    def local(apps, num_supernodes, **runtime_options):
        run_local(apps, partitions(num_supernodes))
        return apps.result

    monkeypatch.setattr(simulation, "simulate_apps", local)


@pytest.mark.parametrize("name", ["fesem", "wecfl"])
def test_simulate_runs_fesem_and_wecfl(monkeypatch, task_identity, name) -> None:
    """FeSEM/WeCFL's check of ``representation_layers`` needs the cluster models, which a strategy
    under ``simulate`` does not hold (it read ``strategy.lightning_module.models``: None)."""
    _simulate_on_local_grid(monkeypatch)
    module = simulate(
        workload.STRATEGIES[name](), workload.make_module(), workload.make_datamodule(),
        num_rounds=2, num_supernodes=2,
    )  # fmt: skip
    assert module.round_metrics["train/clients"] > 0
    assert float(module.client_state.extra["centres_ready"]) == 1.0  # the server's K-means start ran


def test_simulate_refuses_bad_representation_layers_before_any_round(monkeypatch, task_identity) -> None:
    import lightning_fedcluster as lf

    _simulate_on_local_grid(monkeypatch)
    strategy = lf.FeSEMStrategy(2, representation_layers=("trunk",), local_steps=1, executor="loop")
    with pytest.raises(ValueError, match="representation_layers=\\('trunk',\\) matches no parameter"):
        simulate(strategy, workload.make_module(), workload.make_datamodule(), num_rounds=1, num_supernodes=2)
