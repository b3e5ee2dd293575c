"""Flower tests skip only when the ``flower`` extra is missing."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr", reason='needs the flower extra: pip install -e ".[flower]" (or ".[all]")')
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


@pytest.fixture
def task_identity():
    """Flower's process identity, which messages created outside a Flower runtime need."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


@pytest.fixture(scope="package")
def simulated_fedrc():
    """FedRC with every client-side state, in Flower's simulation runtime on 2 nodes."""
    from lightning_fedcluster.flower import simulate
    from tests.flower import workload

    return simulate(
        workload.fedrc_strategy(), workload.make_module(), workload.make_datamodule(),
        num_rounds=workload.ROUNDS, num_supernodes=2, num_cpus=1,
    )  # fmt: skip
