"""Deploy the library's strategies on Flower (``flwr`` >= 1.41, Message API).

``FlowerApps`` builds a ``ServerApp`` that drives rounds with the library's own rules and server
hooks, and a ``ClientApp`` that runs each node's clients through the same client contract as
the Lightning loop executor; ``simulate`` runs both in Flower's simulation runtime and returns
the trained ``ClusteredModule``; ``load_run`` loads a run's ``save-path`` file back into one.
Needs the ``flower`` extra.
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'lightning_fedcluster.flower needs Flower: pip install "lightning-fedcluster[flower]"'
    ) from error

from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.flower.apps import FlowerApps
from lightning_fedcluster.flower.node import NodeConfigError
from lightning_fedcluster.flower.results import SavedRun, load_run, read_run
from lightning_fedcluster.flower.simulation import simulate
from lightning_fedcluster.flower.support import check_supported

__all__ = [
    "FlowerApps",
    "NodeConfigError",
    "SavedRun",
    "TrainingPlan",
    "check_supported",
    "load_run",
    "read_run",
    "simulate",
]
