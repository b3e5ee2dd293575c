"""``fedcluster flower new DIR``: a complete Flower app that runs the library's apps, secured.

It writes ``pyproject.toml`` (the app's components, run config defaults; no dependencies, see
below), ``fedcluster_app.py`` (the strategy, model and data factories and the two apps, each on
its own line: Flower reads the module's plain assignments), ``certificates.sh`` (a CA, the
SuperLink's TLS certificate and one authentication key pair per SuperNode) and a README whose
commands ``docs/how-to/flower.md`` shows and ``tests/flower/test_docs_deployment.py`` runs.

Why ``dependencies = []``: for each run Flower's SuperLink installs the app's dependencies with
``uv sync`` into a new environment under ``$FLWR_HOME/runtime-envs`` (a failure there is exit
code 608 on the ServerApp while ``flwr run`` has already returned 0). ``lightning-fedcluster`` is
not on PyPI, so that resolution fails; and a resolvable spec would download torch, Lightning and
Ray again for every run. The library goes onto each machine once, into the environment that
runs its SuperLink or SuperNode, before they start; the SuperLink runs with
``--disable-runtime-dependency-installation``.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "Clustered federated learning (lightning-fedcluster) deployed on Flower"
license = "Apache-2.0"
# Empty on purpose: install lightning-fedcluster[flower] (with torch) into the environment of
# every machine that runs the SuperLink or a SuperNode before starting it. Flower would install
# what is listed here into a new environment for every run (`uv sync`, from PyPI).
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedcluster"

[tool.flwr.app.components]
serverapp = "fedcluster_app:server"
clientapp = "fedcluster_app:client"

# Override any of these with `flwr run . fedcluster --run-config 'key=value ...'`.
[tool.flwr.app.config]
num-server-rounds = 20
min-nodes = 2          # SuperNodes to wait for: one per partition
node-wait = 300        # seconds to wait for them before the run fails (saying how many came)
round-timeout = 300    # seconds to wait for a node each round (0: wait for every node)
eval-every = 10        # the nodes' validation pass every this many rounds and after the last
log-dir = ""           # TensorBoard directory on the SuperLink's machine ("" : none)
save-path = "run.pt"   # the trained models, relative to the SuperLink's working directory
checkpoint-path = "server-state.pt"  # the server's state after every round ("": none); one per save-path
resume = false         # true: go on from checkpoint-path (after the ServerApp or SuperLink went down)
fast-paths = false     # true: shorter waits that patch flwr internals (the guide's "Fast paths")
"""

APP = '''\
"""The Flower app: FedRC with 3 clusters on the shipped digits data set, 30 clients.

Edit the three factories. The SuperLink and every SuperNode call them: the data set is built on
every node, which keeps its partition's clients (its --node-config partition-id).
"""

from lightning_fedcluster import FedRCStrategy
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.flower import FlowerApps
from lightning_fedcluster.models import MLPClassifier


def strategy() -> FedRCStrategy:
    return FedRCStrategy(3, clients_per_round=10, local_steps=5, seed=0)


def model() -> MLPClassifier:
    return MLPClassifier()


def data() -> DigitsFederated:
    return DigitsFederated(num_clients=30, seed=0)
    # A Hugging Face data set split by a Flower Datasets partitioner (the `hf` extra): client i
    # holds partition i; node partition-id=p of num-partitions=30 holds load_partition(p).
    #   from flwr_datasets.partitioner import DirichletPartitioner
    #   from lightning_fedcluster import FederatedDataModule
    #   return FederatedDataModule.from_hugging_face(
    #       "train.parquet", features="image", label="label", seed=0,
    #       partitioner=DirichletPartitioner(30, "label", alpha=0.5, seed=0))


apps = FlowerApps(strategy, model, data)
# One plain assignment per line: Flower finds `server` and `client` without importing the module.
server = apps.server_app()
client = apps.client_app()
'''

CERTIFICATES = """\
#!/usr/bin/env bash
# Creates certificates/ (a CA, the SuperLink's TLS certificate and key) and keys/ (an ECDSA
# key pair per SuperNode, for node authentication).
# Usage: ./certificates.sh [SUPERLINK_HOST] [NUM_SUPERNODES]   (default: localhost 2)
set -euo pipefail
cd "$(dirname "$0")"
host="${1:-localhost}"
nodes="${2:-2}"
mkdir -p certificates keys
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \\
    -subj "/CN=fedcluster CA" -keyout certificates/ca.key -out certificates/ca.crt 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$host" \\
    -keyout certificates/server.key -out certificates/server.csr 2>/dev/null
if [[ "$host" =~ ^[0-9.]+$ ]]; then names="IP:$host"; else names="DNS:$host"; fi
printf 'subjectAltName=%s,DNS:localhost,IP:127.0.0.1,IP:::1\\n' "$names" > certificates/server.ext
openssl x509 -req -in certificates/server.csr -CA certificates/ca.crt -CAkey certificates/ca.key \\
    -CAcreateserial -days 365 -extfile certificates/server.ext -out certificates/server.pem 2>/dev/null
for ((i = 0; i < nodes; i++)); do
    rm -f "keys/supernode-$i" "keys/supernode-$i.pub"
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode-$i" -f "keys/supernode-$i"
done
chmod 600 certificates/*.key
echo "certificates/: ca.crt (give it to every machine), server.pem + server.key (SuperLink only)"
echo "keys/: supernode-<i> (SuperNode i only) and supernode-<i>.pub (register on the SuperLink)"
"""

README = """\
# {name}: clustered federated learning on Flower

A Flower app (`fedcluster_app.py`, `pyproject.toml`) that runs lightning-fedcluster's FedRC on
a SuperLink and two SuperNodes, with TLS and SuperNode authentication. The steps are those of
lightning-fedcluster's `docs/how-to/flower.md`, "Deploying".

1. On every machine: install lightning-fedcluster with its `flower` extra (and torch) into the
   Python environment that will run the SuperLink or the SuperNode. The app lists no
   dependencies, so Flower installs nothing per run.
2. `./certificates.sh` (on localhost as is; for a SuperLink on another host:
   `./certificates.sh superlink.example.org 2`). Copy `certificates/ca.crt` to every machine,
   `keys/supernode-<i>` to SuperNode i only.
3. Follow the commands of the guide: a `fedcluster` connection in `$FLWR_HOME/config.toml`, the
   SuperLink, registering each SuperNode's public key, the SuperNodes, `flwr run`.

The trained models land in `run.pt` beside the SuperLink (`torch.load`: the global models'
`state_dict`, the server's client store and the round metrics).
For a local try without certificates, start everything with `--insecure` (and
`insecure = true` in the connection) instead of the TLS and key options.
"""

GITIGNORE = """\
# Private keys and certificates stay out of version control (Flower's app bundle skips them too).
certificates/
keys/
run.pt
server-state.pt
superlink.db*
"""

FILES = {
    ".gitignore": GITIGNORE,
    "pyproject.toml": PYPROJECT,
    "fedcluster_app.py": APP,
    "certificates.sh": CERTIFICATES,
    "README.md": README,
}


def project_name(directory: Path) -> str:
    """The app's distribution name, from the directory's name (``my_app`` -> ``my-app``)."""
    name = re.sub(r"[^a-z0-9]+", "-", directory.resolve().name.lower()).strip("-")
    if not name or not name[0].isalpha():
        raise ValueError(
            f"the app directory {str(directory)!r} needs a name that starts with a letter "
            "(it becomes the app's package name), e.g. my_app"
        )
    return name


def write_app(directory: str | Path) -> list[Path]:
    """Write the app's files into ``directory`` (created; it must not hold any of them yet)."""
    directory = Path(directory)
    name = project_name(directory)
    existing = [f for f in FILES if (directory / f).exists()]
    if existing:
        raise FileExistsError(
            f"{directory} already has {', '.join(existing)}: choose a new directory for "
            "`fedcluster flower new`"
        )
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for file, text in FILES.items():
        path = directory / file
        path.write_text(text.replace("{name}", name))
        written.append(path)
    script = directory / "certificates.sh"
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return written
