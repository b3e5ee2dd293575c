"""The deployment guide (docs/how-to/flower.md, "Deploying"), run as written: its shell blocks,
in order, with real processes on localhost: ``fedcluster flower new``, the certificates and keys,
a SuperLink with TLS and SuperNode authentication, two registered ``fedcluster flower supernode``
processes, ``flwr run``; then its security section: the registered nodes are listed, and a
SuperNode that holds the CA but whose key was never registered is refused. Registering a key
needs nothing but the public CA certificate (what the section says): checked with a connection
that has only the CA.

Each block is marked ``<!-- deploy: KIND -->``: ``setup`` and ``run`` blocks run with bash and must
exit 0, a ``refused`` block must fail naming the unregistered key, ``superlink`` and
``supernodes`` start one long-running process per command. The first
block runs in the test's directory, the others in the app's (``my_app``), as the guide says. The
text runs unchanged, except that a documented port already in use on this machine is replaced by
a free one everywhere."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from tests.docs.markdown_blocks import ROOT

GUIDE = ROOT / "docs" / "how-to" / "flower.md"
MARKED = re.compile(r"<!-- deploy: (?P<kind>\w+) -->\n```bash\n(?P<code>.*?)\n```", re.S)
PORTS = ("9091", "9094", "9095", "9096")


def guide_blocks() -> list[tuple[str, str]]:
    return [(m["kind"], m["code"]) for m in MARKED.finditer(GUIDE.read_text())]


def commands(code: str) -> list[str]:
    """A block's commands, one per line after joining ``\\`` continuations."""
    return [line for line in code.replace("\\\n", " ").split("\n") if line.strip()]


def remap(code: str, ports: dict[str, str]) -> str:
    for documented, free in ports.items():
        code = code.replace(documented, free)
    return code


def busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Terminals:
    """The guide's long-running commands, each in its own process group with its own log."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.processes = root, env, {}

    def start(self, name: str, command: str, cwd: Path) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.processes)

    def stop(self) -> None:
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


def wait_for(condition, timeout: float, what: str, terminals: Terminals) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s\n{terminals.logs()}"
        time.sleep(0.5)


def test_the_guides_deployment_runs_with_tls_and_authenticated_supernodes(tmp_path):
    blocks = guide_blocks()
    kinds = [kind for kind, _ in blocks]
    assert kinds == ["setup", "setup", "superlink", "setup", "supernodes", "run", "setup", "refused"], kinds
    text = "\n".join(code for _, code in blocks)
    assert "--insecure" not in text and "--enable-supernode-auth" in text and "--ssl-certfile" in text
    ports = {p: str(free_port()) for p in PORTS if busy(int(p))}
    home = tmp_path / "flwr-home"
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1",
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }  # fmt: skip
    app = tmp_path / "my_app"
    terminals = Terminals(tmp_path, env)
    try:
        for number, (kind, code) in enumerate(blocks):
            code = remap(code, ports)
            cwd = tmp_path if number == 0 else app
            if kind in ("setup", "run"):
                done = subprocess.run(["bash", "-ec", code], cwd=cwd, env=env, capture_output=True, text=True,
                                      timeout=600)  # fmt: skip
                assert done.returncode == 0, f"{code}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
                if kind == "run":
                    output = done.stdout + done.stderr
                elif "supernode list" in code:
                    assert (done.stdout + done.stderr).count("online") == 2, done.stdout + done.stderr
            elif kind == "refused":  # a SuperNode with the CA and an unregistered key exits, named
                done = subprocess.run(["bash", "-ec", code], cwd=cwd, env=env, capture_output=True, text=True,
                                      timeout=600)  # fmt: skip
                refused = done.stdout + done.stderr
                assert done.returncode != 0, refused[-3000:]
                assert "Failed to activate SuperNode" in refused and "it is not registered there" in refused
                assert "--root-certificates certificates/ca.crt" in code
            elif kind == "superlink":
                terminals.start("superlink", code, cwd)
                wait_for(lambda: "Uvicorn running on https://" in terminals.log("superlink"), 300,
                         "the SuperLink did not start with TLS", terminals)  # fmt: skip
            else:
                for i, command in enumerate(commands(code)):
                    terminals.start(f"supernode{i}", command, cwd)
                wait_for(lambda: terminals.log("superlink").count("Activated node_id") >= 2, 300,
                         "the SuperLink did not activate both SuperNodes", terminals)  # fmt: skip
        # `flwr run` returns once the run is submitted; --stream follows it to its end.
        assert output.count("fedcluster: round ") == 3, output[-5000:] + terminals.logs()
        assert re.search(
            r"round 3/3, \d+ clients, loss [\d.]+, acc [\d.]+, val/local_acc [\d.]+, [\d.]+ s", output
        )
        saved = torch.load(app / "run.pt")
        assert len(saved["metrics"]) == 3 and not saved["dropped"]
        assert 0.0 < saved["metrics"][-1]["val/local_acc"] <= 1.0
        assert all(bool(torch.isfinite(t).all()) for t in saved["state_dict"].values())

        assert terminals.log("superlink").count("Activated node_id") == 2

        # Registering a key takes only the public CA: a connection with the address and ca.crt.
        stranger_home = tmp_path / "stranger-home"
        stranger_home.mkdir()
        (stranger_home / "ca.crt").write_bytes((app / "certificates" / "ca.crt").read_bytes())
        address = re.search(r'address = "([^"]+)"', (home / "config.toml").read_text())[1]
        (stranger_home / "config.toml").write_text(
            f'[superlink]\ndefault = "link"\n\n[superlink.link]\naddress = "{address}"\n'
            f'root-certificates = "{stranger_home / "ca.crt"}"\n'
        )
        register = ["flwr", "supernode", "register", str(app / "keys" / "stranger.pub"), "link"]
        done = subprocess.run(register, env={**env, "FLWR_HOME": str(stranger_home)}, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        terminals.stop()
