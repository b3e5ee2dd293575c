"""A real localhost deployment: ``flower-superlink``, two ``flower-supernode`` processes (one
partition of the clients each, chosen by ``--node-config``) and ``flwr run`` of a generated
Flower app project that uses the library's apps. It finishes 3 rounds and matches the
simulation; a SuperNode killed in the middle of a round is dropped and the run completes.

The SuperNodes here are stock ``flower-supernode`` processes, on purpose: the library's apps must
also work on Flower's own SuperNode, which starts a ClientApp process for every message (its
subprocess isolation; a Python start with torch and Lightning per message and node). The
deployment the docs describe runs ``fedcluster flower supernode`` instead
(``lightning_fedcluster/flower/supernode.py``: Flower's SuperNode with a long-running ClientApp
runner in the same process, the library, model and clients loaded once per run), which
tests/flower/test_docs_deployment.py runs."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.flower import workload

ROOT = Path(__file__).resolve().parents[2]
STALL = "FEDCLUSTER_TEST_STALL"

APP = '''"""The Flower app of the deployment test: the library's apps on the test workload."""

import os
import time

import torch

from lightning_fedcluster.flower import FlowerApps
from tests.flower import workload


class StallingMLP(workload.MomentumMLP):
    """The workload's model; on a node started with {stall} set, training hangs once the file
    ``<value>.armed`` exists (so that the test can kill that node in the middle of a round)."""

    def forward(self, x):
        flag = os.environ.get("{stall}")
        if flag and torch.is_grad_enabled() and os.path.exists(flag + ".armed"):
            open(flag + ".stalled", "w").close()
            time.sleep(600)
        return super().forward(x)


apps = FlowerApps(workload.fedrc_strategy, StallingMLP, workload.make_datamodule, num_rounds=workload.ROUNDS)
server = apps.server_app()
client = apps.client_app()
'''.replace("{stall}", STALL)

PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedcluster-deployment-test"
version = "1.0.0"
description = "lightning-fedcluster's apps on a localhost Flower deployment"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "lightning-fedcluster"

[tool.flwr.app.components]
serverapp = "fedcluster_app:server"
clientapp = "fedcluster_app:client"

[tool.flwr.app.config]
num-server-rounds = 3
min-nodes = 2
node-wait = 300
round-timeout = 0
save-path = ""
eval-every = 0
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(name: str) -> str:
    return str(Path(sys.executable).parent / name)


class Deployment:
    """The processes of one localhost federation (each in its own process group)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "flwr-home"
        self.home.mkdir()
        self.link_port = free_port()
        self.env = {
            **os.environ, "FLWR_HOME": str(self.home), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }  # fmt: skip
        self.processes: dict[str, subprocess.Popen] = {}
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "localhost"\n\n[superlink.localhost]\n'
            f'address = "127.0.0.1:{self.link_port}"\ninsecure = true\n'
        )
        self.app = root / "app"
        self.app.mkdir()
        (self.app / "pyproject.toml").write_text(PYPROJECT)
        (self.app / "fedcluster_app.py").write_text(APP)

    def start(self, name: str, args: list[str], **env: str) -> None:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**self.env, **env}, start_new_session=True
        )

    def start_supernode(self, partition: int, **env: str) -> None:
        self.start(
            f"supernode{partition}",
            [
                command("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.link_port}",
                "--port", str(free_port()), "--node-config", f"partition-id={partition} num-partitions=2",
            ],
            **env,
        )  # fmt: skip

    def wait_until_ready(self, nodes: int, timeout: float = 300) -> None:
        """The SuperLink answers and has activated ``nodes`` SuperNodes."""
        log = self.root / "superlink.log"
        deadline = time.monotonic() + timeout
        while log.read_text(errors="replace").count("Activated node_id") < nodes:
            assert time.monotonic() < deadline, self.logs()
            time.sleep(0.5)

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def run(self, run_config: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [command("flwr"), "run", str(self.app), "localhost", "--stream", "--run-config", run_config],
            env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    deployment = Deployment(tmp_path_factory.mktemp("flower-deployment"))
    try:
        deployment.start(
            "superlink", [command("flower-superlink"), "--insecure", "--port", str(deployment.link_port)]
        )
        stall = str(deployment.root / "stall")
        deployment.start_supernode(0)
        deployment.start_supernode(1, **{STALL: stall})
        deployment.stall = stall
        deployment.wait_until_ready(nodes=2)
        yield deployment
    finally:
        for name in list(deployment.processes):
            deployment.kill(name)


def test_superlink_and_two_supernodes_run_three_rounds_matching_the_simulation(deployment, simulated_fedrc):
    saved = deployment.root / "run.pt"
    result = deployment.run(f'save-path="{saved}" eval-every=2')
    assert result.returncode == 0 and saved.exists(), (
        result.stdout[-3000:] + result.stderr[-3000:] + deployment.logs()
    )
    run = torch.load(saved)
    assert len(run["metrics"]) == workload.ROUNDS and not run["dropped"]
    # The nodes' validation pass ran after rounds 2 and 3 (the last), on the trained models.
    assert ["val/local_acc" in m for m in run["metrics"]] == [False, True, True]
    assert 0.0 < run["metrics"][-1]["val/local_acc"] <= 1.0
    for name, tensor in simulated_fedrc.state_dict().items():
        torch.testing.assert_close(run["state_dict"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    simulated = simulated_fedrc.client_state.state_dict()
    for name in ("omega", "label_sums", "seen", "active"):
        torch.testing.assert_close(run["client_state"][name], simulated[name], rtol=1e-6, atol=1e-7, msg=name)


def test_a_supernode_killed_mid_round_is_dropped_and_the_run_completes(deployment):
    saved = deployment.root / "killed.pt"
    Path(deployment.stall + ".armed").touch()
    run = subprocess.Popen(
        [command("flwr"), "run", str(deployment.app), "localhost", "--stream", "--run-config",
         f'save-path="{saved}" round-timeout=120 num-server-rounds=2'],
        env=deployment.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not Path(deployment.stall + ".stalled").exists():
            assert time.monotonic() < deadline and run.poll() is None, (
                run.communicate()[0] + deployment.logs()
            )
            time.sleep(0.5)
        deployment.kill("supernode1")  # partition 1 (clients 3, 4, 5), in the middle of local training
        output, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0 and saved.exists(), output[-5000:] + deployment.logs()
    result = torch.load(saved)
    assert len(result["metrics"]) == 2
    dropped = sorted({c for clients in result["dropped"].values() for c in clients})
    assert dropped and set(dropped) <= {3, 4, 5}
    first = min(result["dropped"])
    assert result["metrics"][first - 1]["train/clients"] < 4, "the killed node's clients left the round"
    assert all(bool(torch.isfinite(t).all()) for t in result["state_dict"].values())


def test_a_run_short_of_nodes_says_so_while_waiting_and_in_its_status(deployment):
    """Fewer SuperNodes connected than asked for (two, or one after the test above killed one):
    the stream shows the server waiting, and the run ends failed with the reason in its status
    (``flwr run`` itself exits 0: it only submits the run and follows its log)."""
    result = deployment.run("min-nodes=3 node-wait=3 num-server-rounds=1")
    output = result.stdout + result.stderr
    waiting = re.search(r"fedcluster: ([12]) of 3 nodes connected, waiting \(3 s left\)", output)
    assert waiting, output[-3000:] + deployment.logs()
    reason = f"{waiting.group(1)} of min_nodes=3 Flower nodes connected within 3 s (run config node-wait)"
    assert f"fedcluster: run failed: TimeoutError: {reason}" in output
    run_id = re.search(r"Successfully started run (\d+)", output).group(1)
    listed = subprocess.run(
        [command("flwr"), "ls", "localhost", "--run-id", run_id, "--format", "json"],
        env=deployment.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (run,) = json.loads(listed.stdout)["runs"]
    assert run["status"] == "finished:failed", run
    assert reason in run["status-details"], run


def test_the_server_keeps_flowers_object_pulls_unless_the_fast_paths_are_asked_for():
    """``fast-paths`` (run config) or ``FlowerApps(fast_paths=True)``: the SuperLink grid's object
    pulls retry after 5 ms within the run (flower/fast_paths.py) and are Flower's again after it;
    without it nothing of flwr is replaced."""
    import importlib

    from lightning_fedcluster.flower import fast_paths
    from lightning_fedcluster.flower.apps import server_paths

    grid = importlib.import_module(fast_paths.SERVER_GRID)
    flowers = grid.pull_objects
    with server_paths(False):
        assert grid.pull_objects is flowers
    with server_paths(True):
        assert grid.pull_objects.func is flowers
        assert grid.pull_objects.keywords["initial_backoff"] == fast_paths.INITIAL_BACKOFF
    assert grid.pull_objects is flowers
