"""Callbacks: per-round TensorBoard monitoring of how clusters relate to concepts, and a summary
of the data scenario at fit start."""

from lightning_fedcluster.callbacks.cluster_monitor import ClusterMonitor
from lightning_fedcluster.callbacks.data_summary import DataSummary

__all__ = ["ClusterMonitor", "DataSummary"]
