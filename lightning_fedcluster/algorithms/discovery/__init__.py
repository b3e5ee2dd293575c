"""Concept discovery as components: each mechanism that finds the concepts (a grouping of the
clients, its hold and release, merging, retirement, removal, re-seeding, the ω weighting of the
copies) is one ``Component`` with one client-side hook, one server-side hook and its declared
client-store entries ([`protocol`][lightning_fedcluster.algorithms.discovery.protocol]); a rule
runs its components in a declared order ([`runner`][lightning_fedcluster.algorithms.discovery.runner]).
FedRC and FedEM build theirs from their options (``FedRC.Config.components()``) or take them
(``FedRC(K, components=...)``); IFCA takes them (``IFCA(K, components=...)``).
"""

from lightning_fedcluster.algorithms.discovery.grouping import ConceptGrouping
from lightning_fedcluster.algorithms.discovery.merging import ClusterMerging
from lightning_fedcluster.algorithms.discovery.protocol import (
    CLUSTER_SCORES,
    ClientTurn,
    Component,
    DiscoveryView,
    TurnReport,
)
from lightning_fedcluster.algorithms.discovery.release import HoldRelease
from lightning_fedcluster.algorithms.discovery.removal import ClusterRemoval
from lightning_fedcluster.algorithms.discovery.reseed import ClusterReseed
from lightning_fedcluster.algorithms.discovery.retirement import ClusterRetirement
from lightning_fedcluster.algorithms.discovery.runner import RunsComponents, run_client, run_server
from lightning_fedcluster.algorithms.discovery.weighting import OmegaWeighting

__all__ = [
    "CLUSTER_SCORES",
    "ClientTurn",
    "ClusterMerging",
    "ClusterRemoval",
    "ClusterReseed",
    "ClusterRetirement",
    "Component",
    "ConceptGrouping",
    "DiscoveryView",
    "HoldRelease",
    "OmegaWeighting",
    "RunsComponents",
    "TurnReport",
    "run_client",
    "run_server",
]
