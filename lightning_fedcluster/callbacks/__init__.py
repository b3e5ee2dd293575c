"""Callbacks: per-round TensorBoard monitoring of how clusters relate to concepts, a summary of
the data scenario at fit start, a progress bar over rounds, and diagnostics of how clusters form
(``TakeoffDiagnostics``, attached by hand for a study)."""

from lightning_fedcluster.callbacks.cluster_monitor import ClusterMonitor
from lightning_fedcluster.callbacks.data_summary import DataSummary
from lightning_fedcluster.callbacks.progress import RoundProgressBar
from lightning_fedcluster.callbacks.takeoff_diagnostics import TakeoffDiagnostics

__all__ = ["ClusterMonitor", "DataSummary", "RoundProgressBar", "TakeoffDiagnostics"]
