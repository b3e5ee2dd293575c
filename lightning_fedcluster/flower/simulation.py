"""``simulate``: a run in Flower's own simulation runtime on this machine."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Any

from lightning_fedcluster.arguments import check_positive_int
from lightning_fedcluster.flower.apps import FlowerApps
from lightning_fedcluster.flower.ray_network import ray_on_loopback


def simulate(
    strategy: Any,
    module: Any,
    datamodule: Any,
    num_rounds: int,
    num_supernodes: int,
    *,
    log_dir: str | None = None,
    num_cpus: int | None = None,
    eval_every: int | None = None,
    save_path: str | None = None,
    ray_on_all_interfaces: bool = False,
    node_wait: float | None = None,
) -> Any:
    """Train ``module`` with ``strategy`` for ``num_rounds`` rounds on ``num_supernodes`` simulated
    Flower nodes, each holding one block of the datamodule's clients, and return the trained
    ``ClusteredModule`` with every client's state. With the same seed and schedule its weights
    equal the Lightning engine's (``executor="loop"``) to float summation order.

    ``num_cpus``: CPUs Flower's Ray backend may use (default: all); each node's ClientApp takes one.
    ``eval_every``: the nodes' validation pass every this many rounds and after the last
    (``val/local_acc`` in the round metrics and ``log_dir``), as ``FlowerApps``.
    ``save_path``: the server saves the run there after the last round, every client's state
    included (``load_run`` loads it back).
    ``ray_on_all_interfaces``: Ray's own default, its servers listening on every network
    interface; by default they listen on 127.0.0.1 only (``ray_network.py``).
    ``node_wait``: seconds the server waits for the nodes to describe their clients (each node's
    ClientApp starts first: imports, its data and model). Default: sized from the nodes it starts,
    ``NODE_START_WAIT`` seconds for every wave of nodes that start together (one per CPU Ray may
    use: ``simulation_node_wait``); raise it on a busy machine.

    Test or predict with the returned module under the same strategy:
    ``Trainer(strategy=strategy).test(module, datamodule=datamodule)``.
    """
    check_positive_int("num_rounds", num_rounds)
    check_positive_int("num_supernodes", num_supernodes)
    if num_supernodes > datamodule.num_clients:
        raise ValueError(
            f"num_supernodes={num_supernodes} exceeds the datamodule's {datamodule.num_clients} clients: "
            "every node must hold at least one client"
        )
    strategy.check_datamodule(datamodule)
    if node_wait is None:
        node_wait = simulation_node_wait(num_supernodes, num_cpus)
    apps = FlowerApps(
        strategy, module, datamodule, num_rounds=num_rounds, min_nodes=num_supernodes, log_dir=log_dir,
        collect_client_state=True, eval_every=eval_every, save_path=save_path, node_wait=node_wait,
    )  # fmt: skip
    return simulate_apps(apps, num_supernodes, num_cpus=num_cpus, ray_on_all_interfaces=ray_on_all_interfaces)


NODE_START_WAIT = 300.0  # seconds for one wave of simulated nodes to start and describe their clients


def simulation_node_wait(num_supernodes: int, num_cpus: int | None = None) -> float:
    """``simulate``'s default ``node_wait``: Ray runs one node's ClientApp per CPU it may use
    (``num_cpus``, default all), so the nodes start in ceil(nodes / CPUs) waves, each given
    ``NODE_START_WAIT`` seconds (4 nodes on 2 CPU cores: 600 s)."""
    cpus = ray_cpus(num_cpus)
    return NODE_START_WAIT * math.ceil(num_supernodes / min(cpus, num_supernodes))


def ray_cpus(num_cpus: int | None) -> int:
    """The CPUs Ray may use for the nodes: ``num_cpus``, default all of the machine's."""
    return num_cpus or os.cpu_count() or 1


def simulate_apps(
    apps: FlowerApps, num_supernodes: int, *, num_cpus: int | None = None, ray_on_all_interfaces: bool = False
) -> Any:
    """Run the ServerApp and ClientApp of ``apps`` in Flower's simulation runtime (Ray) on
    ``num_supernodes`` nodes, Ray on loopback unless ``ray_on_all_interfaces``; the trained module
    (``apps.server`` keeps the run's metrics)."""
    init_args: dict[str, Any] = {"num_cpus": ray_cpus(num_cpus), "log_to_driver": False}
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": init_args}
    network = contextlib.nullcontext() if ray_on_all_interfaces else ray_on_loopback()
    with network:
        run_in_simulation_runtime(apps.server_app(), apps.client_app(), num_supernodes, backend)
    if apps.result is None:
        cause = "" if apps.error is None else f": {type(apps.error).__name__}: {apps.error}"
        raise RuntimeError(
            f"the Flower simulation ended before its ServerApp returned a model{cause}"
        ) from apps.error
    return apps.result


class WithoutDeprecation(logging.Filter):
    """Drops Flower's "DEPRECATED FEATURE" line about ``run_simulation`` (see below)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(isinstance(arg, str) and DEPRECATED in arg for arg in record.args or ())


DEPRECATED = "The `run_simulation` function is deprecated"


def run_in_simulation_runtime(server_app: Any, client_app: Any, num_supernodes: int, backend: dict) -> None:
    """Run in-memory apps in Flower's simulation runtime through Flower's public
    ``flwr.simulation.run_simulation``.

    Flower deprecates that Python entry point in favour of ``flwr run``, which loads the apps
    from a packaged app directory in another process; ``simulate`` takes live objects and returns
    the trained module, so it keeps the Python entry point, and Flower's deprecation line (which
    would tell the user to change code they did not write) is filtered out of Flower's log.
    """
    from flwr.simulation import run_simulation

    quiet = WithoutDeprecation()
    flower_log = logging.getLogger("flwr")
    flower_log.addFilter(quiet)
    try:
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=num_supernodes,
            backend_name="ray",
            backend_config=backend,
        )
    finally:
        flower_log.removeFilter(quiet)
