"""Clustering diagnostics: how clusters relate to the true concepts (diagnostics only)."""

from lightning_fedcluster.metrics.clustering import concept_ari, concept_shares, misplaced_clients

__all__ = ["concept_ari", "concept_shares", "misplaced_clients"]
