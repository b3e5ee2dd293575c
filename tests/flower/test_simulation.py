"""``simulate`` enters Flower's simulation runtime through Flower's public ``run_simulation``,
whose "DEPRECATED FEATURE" line (Flower prefers ``flwr run``, which takes no live objects) is
filtered out, so none is printed."""

from __future__ import annotations

import inspect
import logging
import os
import time

import pytest

from lightning_fedcluster.flower import simulate, simulation
from tests.flower import workload


def test_the_runtime_is_entered_through_flowers_public_run_simulation(monkeypatch) -> None:
    import flwr.simulation

    real = flwr.simulation.run_simulation
    calls: list[dict] = []
    monkeypatch.setattr(flwr.simulation, "run_simulation", lambda **kwargs: calls.append(kwargs))
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 1}}
    simulation.run_in_simulation_runtime("server", "client", 3, backend)
    (call,) = calls
    inspect.signature(real).bind(**call)  # the installed flwr's public function takes these arguments
    assert (call["server_app"], call["client_app"], call["num_supernodes"]) == ("server", "client", 3)
    assert call["backend_config"] is backend and call["backend_name"] == "ray"
    assert "_run_simulation" not in inspect.getsource(simulation)


def test_only_flowers_deprecation_of_run_simulation_is_filtered() -> None:
    from flwr.supercore.logger import warn_deprecated_feature

    lines = Lines()
    logging.getLogger("flwr").addHandler(lines)
    quiet = simulation.WithoutDeprecation()
    logging.getLogger("flwr").addFilter(quiet)
    try:
        warn_deprecated_feature(f"{simulation.DEPRECATED} and will be removed")  # as run_simulation says
        warn_deprecated_feature("another feature")
    finally:
        logging.getLogger("flwr").removeFilter(quiet)
        logging.getLogger("flwr").removeHandler(lines)
    assert len(lines.lines) == 1 and "another feature" in lines.lines[0]


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


DRIVER = "FEDCLUSTER_TEST_DRIVER"  # the test's process id: the node processes (Ray's) start slowly


class SlowStartMLP(workload.MomentumMLP):
    """The workload's model, built 8 s late in every process but the test's: each simulated
    node answers the describe step late (a busy machine)."""

    def __init__(self) -> None:
        if os.environ.get(DRIVER) not in (None, str(os.getpid())):
            time.sleep(8.0)
        super().__init__()


@pytest.mark.slow
def test_a_simulation_whose_nodes_start_late_names_node_wait_and_a_longer_wait_trains(monkeypatch) -> None:
    monkeypatch.setenv(DRIVER, str(os.getpid()))
    data = workload.make_datamodule()
    late = r"did not describe their clients within node_wait=2 s \(load .*simulate\(\.\.\., node_wait=900\)"
    with pytest.raises(TimeoutError, match=late):  # the ServerApp's error, raised again by simulate
        simulate(workload.STRATEGIES["fedavg"](), SlowStartMLP, data, 1, 2, num_cpus=1, node_wait=2.0)
    module = simulate(workload.STRATEGIES["fedavg"](), SlowStartMLP, data, 1, 2, num_cpus=1, node_wait=300.0)
    assert module.round_metrics["train/clients"] > 0


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


def test_simulate_sizes_its_node_wait_from_the_nodes_it_starts(monkeypatch) -> None:
    """300 s for every wave of nodes that start together, one node per CPU Ray may use (4 nodes on
    2 CPU cores: two waves); ``node_wait`` given: that."""
    waits: list[float] = []
    monkeypatch.setattr(
        simulation, "simulate_apps", lambda apps, *args, **kwargs: waits.append(apps.node_wait)
    )

    def run(num_supernodes: int, **options) -> float:
        strategy = workload.STRATEGIES["fedavg"]()
        simulate(strategy, workload.make_module(), workload.make_datamodule(), 1, num_supernodes, **options)
        return waits.pop()

    assert run(4, num_cpus=2) == 600.0 and run(5, num_cpus=2) == 900.0
    assert run(2, num_cpus=1) == 600.0 and run(2, num_cpus=8) == 300.0 and run(1) == 300.0
    assert run(4, num_cpus=2, node_wait=42.0) == 42.0
    with pytest.raises(ValueError, match="node_wait must be > 0 seconds"):
        run(2, node_wait=0.0)
