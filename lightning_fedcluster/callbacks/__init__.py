"""Callbacks: per-round TensorBoard monitoring of how clusters relate to concepts, a summary of
the data scenario at fit start, and a progress bar over rounds."""

from lightning_fedcluster.callbacks.cluster_monitor import ClusterMonitor
from lightning_fedcluster.callbacks.data_summary import DataSummary
from lightning_fedcluster.callbacks.progress import RoundProgressBar

__all__ = ["ClusterMonitor", "DataSummary", "RoundProgressBar"]
