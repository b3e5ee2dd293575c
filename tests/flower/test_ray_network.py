"""``simulate`` keeps its Ray cluster on loopback: within ``ray_on_loopback`` every server Ray
starts (gcs_server, raylet, workers) listens on 127.0.0.1 only, where Ray's default on Linux
listens on every interface; the switch is put back afterwards."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from lightning_fedcluster.flower.ray_network import SWITCH, ray_on_loopback

LOOPBACK = ("127.0.0.1", "::ffff:7f00:1", "::1")


def descendants(pid: int) -> set[int]:
    found, frontier = set(), [pid]
    while frontier:
        for task in Path(f"/proc/{frontier.pop()}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            frontier += list(children - found)
            found |= children
    return found


def listening_addresses() -> list[str]:
    """The addresses the processes started by this one listen on (TCP, read from /proc)."""
    inodes = set()
    for pid in descendants(os.getpid()):
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    addresses = []
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))  # little-endian words
            addresses.append(str(ipaddress.ip_address(words)))
    return addresses


def test_a_ray_cluster_started_within_listens_on_loopback_only(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.delenv(SWITCH, raising=False)
    with ray_on_loopback():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        try:
            addresses = listening_addresses()
        finally:
            ray.shutdown()
    assert addresses and all(ip in LOOPBACK for ip in addresses), addresses
    from ray._private import ray_constants

    assert SWITCH not in os.environ and ray_constants.ENABLE_RAY_CLUSTER, "the switch is put back"
