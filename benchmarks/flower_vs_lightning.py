"""Rounds per second of the Flower simulation (``lightning_fedcluster.flower``) against the
Lightning engine (loop executor) on the same workload, which both train to the same weights.

Workload: DigitsFederated, 30 clients (3 concepts), FedRC K=3, 10 clients per round, 5 local
steps of batch 32, the library's MLP. The Flower run uses ``--supernodes`` simulated nodes in
Flower's Ray runtime with ``--cpus`` CPUs. Steady-state rounds/s excludes the first round;
"start + end" is the rest of the wall time (process start-up, Ray, the nodes' describe/export).

``--deployed`` adds a localhost deployment of the same workload, as docs/how-to/flower.md deploys
it: ``flower-superlink`` with TLS and SuperNode authentication, two registered ``fedcluster flower
supernode`` processes and ``flwr run --stream`` (``--insecure``: without TLS and keys, a local
try); its seconds per round are the server's progress lines. The deployment uses Flower's public
paths only; ``--fast-paths`` runs it a second time with the opt-in fast paths
(``flower/fast_paths.py``: ``fedcluster flower supernode --fast-paths`` and run config
``fast-paths=true``), side by side.

    OMP_NUM_THREADS=1 python benchmarks/flower_vs_lightning.py --rounds 10 --deployed --fast-paths
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _common import RoundTimer, command_line, machine_line, make_trainer, quiet, set_threads

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier


def strategy() -> lf.FedRCStrategy:
    return lf.FedRCStrategy(3, clients_per_round=10, local_steps=5, executor="loop", seed=0)


def datamodule() -> DigitsFederated:
    return DigitsFederated(num_clients=30, concepts=3, seed=0, batch_size=32)


def lightning(rounds: int) -> tuple[list[float], float, dict]:
    timer = RoundTimer()
    start = time.perf_counter()
    trainer = make_trainer(strategy(), rounds, validate=False, callbacks=[timer])
    trainer.fit(MLPClassifier(lr=0.2), datamodule=datamodule())
    total = time.perf_counter() - start
    return [r["round"] for r in timer.rounds], total, trainer.lightning_module.state_dict()


def flower(rounds: int, supernodes: int, cpus: int) -> tuple[list[float], float, dict]:
    from lightning_fedcluster.flower import FlowerApps
    from lightning_fedcluster.flower.simulation import simulate_apps

    apps = FlowerApps(
        strategy(), MLPClassifier(lr=0.2), datamodule(), num_rounds=rounds, min_nodes=supernodes
    )
    start = time.perf_counter()
    module = simulate_apps(apps, supernodes, num_cpus=cpus)
    total = time.perf_counter() - start
    assert apps.server is not None
    return apps.server.round_seconds, total, module.state_dict()


APP = """
import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.flower import FlowerApps
from lightning_fedcluster.models import MLPClassifier

apps = FlowerApps(
    lambda: lf.FedRCStrategy(3, clients_per_round=10, local_steps=5, executor="loop", seed=0),
    lambda: MLPClassifier(lr=0.2),
    lambda: DigitsFederated(num_clients=30, concepts=3, seed=0, batch_size=32),
)
server = apps.server_app()
client = apps.client_app()
"""


def deployed(rounds: int, secure: bool, fast: bool = False) -> tuple[list[float], float, dict]:
    """The workload on a localhost SuperLink and two ``fedcluster flower supernode`` processes,
    as docs/how-to/flower.md deploys it: TLS from the app's ``certificates.sh`` and SuperNode
    authentication with registered keys (``secure``), or ``--insecure`` (a local try); ``fast``:
    with the opt-in fast paths on the SuperNodes and the ServerApp."""
    import re
    import signal
    import socket
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from lightning_fedcluster.flower.template import write_app

    def port() -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return str(s.getsockname()[1])

    root = Path(tempfile.mkdtemp(prefix="fedcluster-deployed-"))
    app, link = root / "bench_app", port()
    write_app(app)
    (app / "fedcluster_app.py").write_text(APP)
    (root / "home").mkdir()
    here = Path(__file__).resolve().parents[1]
    env = {**os.environ, "FLWR_HOME": str(root / "home"), "FLWR_TELEMETRY_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    bin_dir = Path(sys.executable).parent
    superlink = [
        str(bin_dir / "flower-superlink"),
        "--port",
        link,
        "--disable-runtime-dependency-installation",
    ]
    supernode = [str(bin_dir / "fedcluster"), "flower", "supernode", "--superlink", f"127.0.0.1:{link}"]
    supernode += ["--fast-paths"] if fast else []
    if secure:
        subprocess.run(
            ["./certificates.sh", "localhost", "2"], cwd=app, env=env, check=True, capture_output=True
        )
        connection = f'root-certificates = "{app / "certificates" / "ca.crt"}"'
        superlink += ["--ssl-ca-certfile", "certificates/ca.crt", "--ssl-certfile", "certificates/server.pem",
                      "--ssl-keyfile", "certificates/server.key", "--enable-supernode-auth"]  # fmt: skip
        nodes = [[*supernode, "--root-certificates", "certificates/ca.crt", "--auth-supernode-private-key",
                  f"keys/supernode-{i}"] for i in range(2)]  # fmt: skip
    else:
        connection = "insecure = true"
        superlink.append("--insecure")
        nodes = [[*supernode, "--insecure"] for _ in range(2)]
    (root / "home" / "config.toml").write_text(
        f'[superlink.bench]\naddress = "127.0.0.1:{link}"\n{connection}\n'
    )
    commands = [superlink] + [
        [*node, "--port", port(), "--node-config", f"partition-id={i} num-partitions=2"]
        for i, node in enumerate(nodes)
    ]
    processes = []

    def start(n: int) -> None:
        log = open(root / f"{n}.log", "w")  # noqa: SIM115 - the process keeps it
        processes.append(subprocess.Popen(commands[n], cwd=app, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip

    try:
        start(0)
        deadline = time.monotonic() + 300
        for i in range(2 if secure else 0):  # the SuperLink admits registered keys only
            register = [str(bin_dir / "flwr"), "supernode", "register", f"keys/supernode-{i}.pub", "bench"]
            while subprocess.run(register, cwd=app, env=env, capture_output=True).returncode != 0:
                assert time.monotonic() < deadline, (root / "0.log").read_text()[-3000:]
                time.sleep(0.5)
        start(1)
        start(2)
        while (root / "0.log").read_text().count("Activated node_id") < 2:
            assert time.monotonic() < deadline, (root / "0.log").read_text()[-3000:]
            time.sleep(0.5)
        started = time.perf_counter()
        done = subprocess.run(
            [str(bin_dir / "flwr"), "run", ".", "bench", "--stream", "--run-config",
             f"num-server-rounds={rounds} eval-every=0 round-timeout=0 fast-paths={str(fast).lower()}"],
            cwd=app, env=env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        total = time.perf_counter() - started
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    seconds = [float(s) for s in re.findall(r"fedcluster: round \d+/\d+, .*, ([\d.]+) s", done.stdout)]
    assert len(seconds) == rounds, done.stdout[-3000:] + done.stderr[-3000:]
    weights = torch.load(app / "run.pt")["state_dict"]
    return seconds, total, weights


def steady_mean(seconds: list[float]) -> float:
    """Seconds per round without the first round."""
    return statistics.mean(seconds[1:] or seconds)


def row(name: str, seconds: list[float], total: float) -> str:
    mean = steady_mean(seconds)
    overhead = total - sum(seconds)
    return f"{name:<44}{1 / mean:>10.2f}{mean:>10.3f}{seconds[0]:>10.2f}{overhead:>14.1f}{total:>10.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--supernodes", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--deployed", action="store_true", help="also a localhost Flower deployment")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="deployed without TLS and SuperNode authentication (a local try)",
    )
    parser.add_argument(
        "--fast-paths",
        action="store_true",
        help="also deployed with the opt-in fast paths that patch flwr internals (a second row)",
    )
    args = parser.parse_args()
    set_threads(1)
    quiet()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    light_rounds, light_total, light_weights = lightning(args.rounds)
    flower_rounds, flower_total, flower_weights = flower(args.rounds, args.supernodes, args.cpus)
    gap = max(float((flower_weights[k] - v).abs().max()) for k, v in light_weights.items())
    if args.deployed:
        deployed_rounds, deployed_total, deployed_weights = deployed(args.rounds, secure=not args.insecure)
        deployed_gap = max(float((deployed_weights[k] - v).abs().max()) for k, v in light_weights.items())
    if args.deployed and args.fast_paths:
        fast_rounds, fast_total, fast_weights = deployed(args.rounds, secure=not args.insecure, fast=True)
        fast_gap = max(float((fast_weights[k] - v).abs().max()) for k, v in light_weights.items())
    print(machine_line())
    print(f"command: {command_line()}")
    print(f"{'':<44}{'rounds/s':>10}{'s/round':>10}{'round 1':>10}{'start + end':>14}{'total':>10}")
    print(row("Lightning engine (loop)", light_rounds, light_total))
    print(row(f"Flower simulation ({args.supernodes} nodes, {args.cpus} CPUs)", flower_rounds, flower_total))
    if args.deployed:
        how = "insecure" if args.insecure else "TLS + auth"
        print(row(f"Flower deployed (2 supernodes, {how})", deployed_rounds, deployed_total))
        if args.fast_paths:
            print(row(f"Flower deployed ({how}, fast paths)", fast_rounds, fast_total))
        ratios = [("public paths", deployed_rounds)]
        ratios += [("fast paths", fast_rounds)] if args.fast_paths else []
        for name, seconds in ratios:
            ratio = steady_mean(seconds) / steady_mean(flower_rounds)
            print(f"deployed/simulated s/round, {name}: {ratio:.2f}")
    print(f"max |weight difference| after {args.rounds} rounds: {gap:.2e}")
    if args.deployed:
        print(f"max |weight difference|, deployed vs Lightning: {deployed_gap:.2e}")
    if args.deployed and args.fast_paths:
        print(f"max |weight difference|, deployed with fast paths vs Lightning: {fast_gap:.2e}")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
