"""The fault suite on a real localhost deployment: ``flower-superlink`` (with a state database)
and two ``fedcluster flower supernode`` processes, ``flwr run`` of a generated app. Each fault
either ends with the weights of an undisturbed run that dropped the same client-rounds (computed
in this process on an in-process grid, ``local_grid.py``) or fails by name; no run file is left
torn. Slow: every test starts real processes (minutes on 2 shared cores).

- a node sends NaN updates, then updates a million times too long: rejected, named, saved;
- a node is killed in the middle of a round and restarted: its clients are dropped while it is
  away and train again from the round after it is back;
- the ServerApp is killed after a checkpoint: ``flwr run ... resume=true`` goes on from it;
- the SuperLink is killed and restarted on its database: the nodes come back and the run
  resumes from the server's checkpoint;
- the same nodes serve two different apps in turn, each with its own code;
- with TLS and SuperNode authentication, as a user deploys (the guide's certificates and
  registered keys): the poisoned node and the killed SuperLink again.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.engine.verified_files import load_verified
from lightning_fedcluster.flower import FlowerApps, read_run
from lightning_fedcluster.flower.template import CERTIFICATES
from tests.flower import workload
from tests.flower.local_grid import partitions, run_local
from tests.flower.test_apps import ROOT, command, free_port

pytestmark = pytest.mark.slow

ROUNDS = 4
FAULTS = "FEDCLUSTER_TEST_FAULTS"  # a directory: its files switch faults on in node 1

APP = '''"""The fault suite's Flower app: FedRC (3 clusters, removal, a norm bound) on the workload."""

import os
import time
from pathlib import Path

import torch

import lightning_fedcluster as lf
from lightning_fedcluster.flower import FlowerApps, records
from lightning_fedcluster.flower import node as flower_node
from tests.flower import workload

FAULTS = os.environ.get("{faults}")


def strategy():
    return lf.FedRCStrategy(
        3, clients_per_round=5, local_steps=2, removal_threshold=0.33, max_update_norm=50.0, executor="loop"
    )


class StallingMLP(workload.MomentumMLP):
    """On a node started with the faults directory, training hangs while ``stall`` exists there."""

    def forward(self, x):
        if FAULTS and torch.is_grad_enabled() and os.path.exists(os.path.join(FAULTS, "stall")):
            Path(FAULTS, "stalled").touch()
            time.sleep(600)
        return super().forward(x)


if FAULTS:  # node 1 poisons its replies from round 1 on while "nan" or "scale" exists
    reply = flower_node.NodeRuntime.reply

    def poisoned(round_state, clients, send_vectors):
        content = reply(round_state, clients, send_vectors)
        late = round_state.round_index >= 1
        for mode in ("nan", "scale"):
            if late and os.path.exists(os.path.join(FAULTS, mode)):
                sections = records.unpack(content)
                for name, tensor in sections["update"].items():
                    sections["update"][name] = tensor * (float("nan") if mode == "nan" else 1e6)
                content = records.pack(sections)
        return content

    flower_node.NodeRuntime.reply = staticmethod(poisoned)

apps = FlowerApps(strategy, StallingMLP, workload.make_datamodule, num_rounds={rounds})
server = apps.server_app()
client = apps.client_app()
'''.replace("{faults}", FAULTS).replace("{rounds}", str(ROUNDS))

OTHER_APP = '''"""A second app with other code under the same module name: FedAvg on a narrower MLP."""

import lightning_fedcluster as lf
from lightning_fedcluster.flower import FlowerApps
from lightning_fedcluster.models import MLPClassifier
from tests.flower import workload


def narrow():
    return MLPClassifier(hidden=(32,))


apps = FlowerApps(lambda: lf.FedAvgStrategy(local_steps=2), narrow, workload.make_datamodule, num_rounds=2)
server = apps.server_app()
client = apps.client_app()
'''

PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "lightning-fedcluster's fault suite"
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
num-server-rounds = {rounds}
min-nodes = 2
round-timeout = 60
checkpoint-every = 1
save-path = ""
checkpoint-path = ""
resume = false
"""


def accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def reference_strategy() -> lf.FedRCStrategy:
    return lf.FedRCStrategy(
        3,
        clients_per_round=5,
        local_steps=2,
        config=FedRC.Config(removal_threshold=0.33),
        max_update_norm=50.0,
        executor="loop",
    )


def reference(dropped: dict[int, list[int]]):
    """The in-process run in which node 1 (clients 3, 4, 5) is left out of exactly the rounds the
    deployment dropped or rejected it."""
    rounds = {int(r) for r, clients in dropped.items() if clients}

    def away(node, message):
        train = message.metadata.message_type == "train"
        return "silent" if train and node == 101 and int(message.metadata.group_id) in rounds else None

    apps = FlowerApps(reference_strategy, workload.MomentumMLP, workload.make_datamodule, num_rounds=ROUNDS)
    return run_local(apps, partitions(2), away)[0]


def assert_weights(run: dict, expected) -> None:
    for name, tensor in expected.state_dict().items():
        torch.testing.assert_close(run["state_dict"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


class Deployment:
    """A SuperLink on a state database and two ``fedcluster flower supernode`` processes; with
    ``secure``, as the deployment guide sets them up: TLS from the generated app's
    ``certificates.sh`` (a CA, the SuperLink's certificate), SuperNode authentication, each node's
    public key registered with ``flwr supernode register`` and its private key on the node."""

    def __init__(self, root: Path, secure: bool = False) -> None:
        self.root, self.faults, self.secure = root, root / "faults", secure
        self.faults.mkdir()
        self.home = root / "flwr-home"
        self.home.mkdir()
        self.link_port = free_port()
        self.env = {
            **os.environ, "FLWR_HOME": str(self.home), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }  # fmt: skip
        self.processes: dict[str, subprocess.Popen] = {}
        self.starts = 0
        if secure:
            (root / "certificates.sh").write_text(CERTIFICATES)
            subprocess.run(["bash", str(root / "certificates.sh"), "localhost", "2"], check=True, timeout=120)
        trust = f'root-certificates = "{root / "certificates" / "ca.crt"}"' if secure else "insecure = true"
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "localhost"\n\n[superlink.localhost]\n'
            f'address = "127.0.0.1:{self.link_port}"\n{trust}\n'
        )
        self.apps = {"main": root / "app", "other": root / "other_app"}
        for (name, directory), code in zip(self.apps.items(), (APP, OTHER_APP), strict=True):
            directory.mkdir()
            rounds = str(ROUNDS if name == "main" else 2)
            pyproject = PYPROJECT.replace("{name}", f"fedcluster-faults-{name}").replace("{rounds}", rounds)
            (directory / "pyproject.toml").write_text(pyproject)
            (directory / "fedcluster_app.py").write_text(code)

    def start(self, name: str, args: list[str], **env: str) -> None:
        self.starts += 1
        log = open(self.root / f"{name}.{self.starts}.log", "w")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**self.env, **env}, start_new_session=True
        )

    def start_superlink(self) -> None:
        certificates = self.root / "certificates"
        security = [
            "--ssl-ca-certfile", str(certificates / "ca.crt"),
            "--ssl-certfile", str(certificates / "server.pem"),
            "--ssl-keyfile", str(certificates / "server.key"), "--enable-supernode-auth",
        ] if self.secure else ["--insecure"]  # fmt: skip
        self.start("superlink", [
            command("flower-superlink"), *security, "--port", str(self.link_port),
            "--database", str(self.root / "state.db"),
        ])  # fmt: skip

    def register_supernodes(self) -> None:
        """Each SuperNode's public key, registered on the SuperLink (kept in its database)."""
        for partition in (0, 1):
            key = str(self.root / "keys" / f"supernode-{partition}.pub")
            done = subprocess.run([command("flwr"), "supernode", "register", key, "localhost"], env=self.env,
                                  capture_output=True, text=True, timeout=300)  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr + self.logs()

    def start_supernode(self, partition: int) -> None:
        extra = {FAULTS: str(self.faults)} if partition == 1 else {}
        security = [
            "--root-certificates", str(self.root / "certificates" / "ca.crt"),
            "--auth-supernode-private-key", str(self.root / "keys" / f"supernode-{partition}"),
        ] if self.secure else ["--insecure"]  # fmt: skip
        self.start(f"supernode{partition}", [
            command("fedcluster"), "flower", "supernode", *security, "--superlink",
            f"127.0.0.1:{self.link_port}", "--port", str(free_port()),
            "--node-config", f"partition-id={partition} num-partitions=2",
        ], **extra)  # fmt: skip

    def activations(self) -> int:
        return sum(
            p.read_text(errors="replace").count("Activated node_id")
            for p in self.root.glob("superlink.*.log")
        )

    def wait_for(self, condition, what: str, timeout: float = 300) -> float:
        started = time.monotonic()
        while not condition():
            assert time.monotonic() - started < timeout, f"{what} within {timeout:.0f} s\n{self.logs()}"
            time.sleep(0.5)
        return time.monotonic() - started

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def serverapp_pids(self) -> list[int]:
        """The ServerApp processes the SuperLink started (its descendants), by id."""
        found, frontier = [], [self.processes["superlink"].pid]
        while frontier:
            pid = frontier.pop()
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                frontier.append(child)
                try:
                    cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "flwr-serverapp" in cmdline:
                    found.append(child)
        return found

    def submit(self, run_config: str, app: str = "main") -> subprocess.Popen:
        arguments = ["run", str(self.apps[app]), "localhost", "--stream", "--run-config", run_config]
        return subprocess.Popen(
            [command("flwr"), *arguments], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip

    def run(self, run_config: str, app: str = "main", timeout: float = 900) -> str:
        process = self.submit(run_config, app)
        try:
            output, _ = process.communicate(timeout=timeout)
        finally:
            if process.poll() is None:
                process.kill()
        return output

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.root.glob("*.log"))
        )


def started(root: Path, secure: bool = False):
    """A deployment with both SuperNodes activated (keys registered first when ``secure``); its
    processes killed when the generator ends."""
    deployment = Deployment(root, secure)
    try:
        deployment.start_superlink()
        if secure:
            deployment.wait_for(lambda: accepts(deployment.link_port), "the SuperLink starts")
            deployment.register_supernodes()
        deployment.start_supernode(0)
        deployment.start_supernode(1)
        deployment.wait_for(lambda: deployment.activations() >= 2, "the SuperLink activates both SuperNodes")
        yield deployment
    finally:
        for name in list(deployment.processes):
            deployment.kill(name)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    yield from started(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def secure_deployment(tmp_path_factory):
    """The deployment as a user runs it: TLS and SuperNode authentication."""
    yield from started(tmp_path_factory.mktemp("secure-faults"), secure=True)


def test_two_apps_in_turn_from_the_same_nodes_each_run_their_own_code(deployment):
    first, second = deployment.root / "first.pt", deployment.root / "second.pt"
    output = deployment.run(f'save-path="{first}" num-server-rounds=1')
    assert first.exists(), output[-3000:] + deployment.logs()
    output = deployment.run(f'save-path="{second}"', app="other")
    assert second.exists(), output[-3000:] + deployment.logs()
    narrow = read_run(second)
    assert narrow.state_dict["models.0.net.0.weight"].shape[0] == 32 and len(narrow.metrics) == 2
    assert read_run(first).state_dict["models.0.net.0.weight"].shape[0] != 32


@pytest.mark.parametrize("mode", ["nan", "scale"])
def test_a_node_sending_poisoned_replies_is_rejected_and_the_run_equals_one_without_them(
    deployment, mode, task_identity
):
    poisoned_run_equals_one_without_them(deployment, mode)


def test_with_tls_and_node_authentication_a_poisoned_node_is_rejected(secure_deployment, task_identity):
    poisoned_run_equals_one_without_them(secure_deployment, "nan")


def poisoned_run_equals_one_without_them(deployment: Deployment, mode: str) -> None:
    """Node 1 poisons its replies (``mode``) from round 2 on: each is rejected, named and saved,
    and the run ends with the weights of the in-process run that left them out."""
    saved = deployment.root / f"poisoned-{mode}.pt"
    (deployment.faults / mode).touch()
    try:
        output = deployment.run(f'save-path="{saved}"')
    finally:
        (deployment.faults / mode).unlink()
    assert saved.exists(), output[-3000:] + deployment.logs()
    assert "is rejected and left out of the round" in output
    run = read_run(saved)
    assert set(run.rejected) == set(range(1, ROUNDS)) and not run.dropped
    assert all(set(clients) <= {3, 4, 5} for clients in run.rejected.values())
    assert_weights(torch.load(saved, weights_only=True), reference(run.rejected))


def test_a_node_killed_mid_round_and_restarted_trains_again(deployment, task_identity):
    saved = deployment.root / "killed.pt"
    (deployment.faults / "stall").touch()
    run = deployment.submit(f'save-path="{saved}" round-timeout=30')
    deployment.wait_for(lambda: (deployment.faults / "stalled").exists(), "node 1 stalls in training")
    deployment.kill("supernode1")
    killed = time.monotonic()
    (deployment.faults / "stall").unlink()
    (deployment.faults / "stalled").unlink()
    deployment.start_supernode(1)
    output, _ = run.communicate(timeout=900)
    assert saved.exists(), output[-3000:] + deployment.logs()
    result = read_run(saved)
    dropped = sorted(result.dropped)
    assert dropped and all(set(c) <= {3, 4, 5} for c in result.dropped.values())
    assert max(dropped) < ROUNDS - 1 and "is back" in output, "node 1 is used again once it is back"
    assert result.metrics[-1]["train/clients"] == 5
    assert_weights(torch.load(saved, weights_only=True), reference(result.dropped))
    print(f"node killed: run done {time.monotonic() - killed:.0f} s after the kill, dropped rounds {dropped}")


def test_a_killed_serverapp_resumes_from_its_checkpoint(deployment, task_identity):
    saved, checkpoint = deployment.root / "resumed.pt", deployment.root / "server.ckpt"
    config = f'save-path="{saved}" checkpoint-path="{checkpoint}"'
    run = deployment.submit(config)
    deployment.wait_for(lambda: checkpoint.exists() and load_verified(checkpoint)[0]["round"] >= 1,
                        "the server checkpoints round 2")  # fmt: skip
    for pid in deployment.serverapp_pids():
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    run.communicate(timeout=300)
    assert not saved.exists(), "the killed run saved nothing"
    output = deployment.run(config + " resume=true")
    assert saved.exists(), output[-3000:] + deployment.logs()
    assert "resuming from" in output
    result = read_run(saved)
    assert len(result.metrics) == ROUNDS and not result.dropped
    assert_weights(torch.load(saved, weights_only=True), reference({}))
    print(f"ServerApp killed: run done {time.monotonic() - killed:.0f} s after the kill")


def test_a_superlink_killed_and_restarted_on_its_database_resumes(deployment, task_identity):
    killed_superlink_resumes(deployment)


def test_with_tls_and_node_authentication_a_killed_superlink_resumes(secure_deployment, task_identity):
    """The restarted SuperLink knows the registered keys from its database: the authenticated
    SuperNodes carry on over TLS and the run resumes."""
    killed_superlink_resumes(secure_deployment)


def killed_superlink_resumes(deployment: Deployment) -> None:
    """The SuperLink killed after the server's round-2 checkpoint and restarted on its database:
    ``resume=true`` ends with the weights of the run that never stopped."""
    saved, checkpoint = deployment.root / "relinked.pt", deployment.root / "relinked.ckpt"
    config = f'save-path="{saved}" checkpoint-path="{checkpoint}"'
    run = deployment.submit(config)
    deployment.wait_for(lambda: checkpoint.exists() and load_verified(checkpoint)[0]["round"] >= 1,
                        "the server checkpoints round 2")  # fmt: skip
    deployment.kill("superlink")
    killed = time.monotonic()
    run.communicate(timeout=300)
    deployment.start_superlink()
    deployment.wait_for(lambda: accepts(deployment.link_port), "the SuperLink is back")
    output = deployment.run(config + " resume=true")
    assert saved.exists(), output[-3000:] + deployment.logs()
    result = read_run(saved)
    assert len(result.metrics) == ROUNDS and not result.dropped
    assert_weights(torch.load(saved, weights_only=True), reference({}))
    print(f"SuperLink killed: run done {time.monotonic() - killed:.0f} s after the kill")
