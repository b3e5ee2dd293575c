"""Pure tensor math of the algorithms: E-steps, weights, aggregation, client state, schedule."""

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.fedrc import ClientReport, FedRC
from lightning_fedcluster.algorithms.schedule import RoundSchedule

__all__ = ["ClientReport", "ClientState", "FedRC", "RoundSchedule"]
