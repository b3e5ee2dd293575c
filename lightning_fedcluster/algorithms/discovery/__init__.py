"""Concept discovery as components: each mechanism that finds the concepts (a grouping of the
clients, its hold and release, merging, retirement, removal, re-seeding, the ω weighting of the
copies) is one ``Component`` with one client-side hook, one server-side hook and its declared
client-store entries ([`protocol`][lightning_fedcluster.algorithms.discovery.protocol]); a rule
runs its components in a declared order ([`runner`][lightning_fedcluster.algorithms.discovery.runner]).
"""

from lightning_fedcluster.algorithms.discovery.protocol import (
    CLUSTER_SCORES,
    ClientTurn,
    Component,
    DiscoveryView,
    TurnReport,
)
from lightning_fedcluster.algorithms.discovery.runner import RunsComponents, run_client, run_server

__all__ = [
    "CLUSTER_SCORES",
    "ClientTurn",
    "Component",
    "DiscoveryView",
    "RunsComponents",
    "TurnReport",
    "run_client",
    "run_server",
]
