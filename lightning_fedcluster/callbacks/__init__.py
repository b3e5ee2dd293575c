"""Callbacks: per-round TensorBoard monitoring of how clusters relate to concepts."""

from lightning_fedcluster.callbacks.cluster_monitor import ClusterMonitor

__all__ = ["ClusterMonitor"]
