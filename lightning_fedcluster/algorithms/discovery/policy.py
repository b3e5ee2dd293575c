"""``ConceptDiscovery``: one policy for finding the concepts, from an upper bound on K, on any run.

Two numbers, each meaningful without knowing the run:

- ``min_share``: the smallest share of the rows a concept must hold to keep a model of its own
  (a cluster below it is removed);
- ``gap``: the log-likelihood gap, in nats per sample, below which two clusters hold one concept
  (their members fit both models within it, and no less closely than before: they merge). Where
  duplicates stay further apart (label skew, image models), a pair also merges when its gap is
  under a third of its gap to the nearest other cluster that has specialised, a ratio that does
  not depend on the data's scale (``settled_events.py``).

Every decision is fired by what the run measures, never by a round number: a client's placement
when its fit says so (``placement.py``), the K events when the assignments have settled and a
pair's gap is small and steady (``settled_events.py``). The only bound is a fraction of the run.
Where no signal fires the run is FedRC's with its copies weighed by ω at half strength.
``FedRCStrategy(num_clusters, discovery=ConceptDiscovery())``; ``discovery=None`` is
the paper's FedRC exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_fedcluster.algorithms.discovery.placement import Placement
from lightning_fedcluster.algorithms.discovery.protocol import Component
from lightning_fedcluster.algorithms.discovery.settled_events import SettledEvents


@dataclass(frozen=True)
class ConceptDiscovery:
    """Find the concepts from ``num_clusters`` as an upper bound (module docstring).

    Args:
        min_share: the share of the rows, in (0, 0.5), a concept needs for a model of its own.
        gap: nats per sample, > 0: two clusters whose members fit both within it, steadily, are
            one concept (as are two within a third of their gap to the nearest specialised
            other cluster, whatever ``gap``).
    """

    min_share: float = 0.05
    gap: float = 0.05

    def __post_init__(self) -> None:
        share = self.min_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 0.5:
            raise ValueError(f"min_share must be a share of the rows in (0, 0.5) (e.g. 0.05), got {share!r}")
        gap = self.gap
        if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not gap > 0:
            raise ValueError(f"gap must be > 0 (nats per sample, e.g. 0.05), got {gap!r}")

    def components(self) -> tuple[Component, ...]:
        """The mechanisms, in the order the server runs them after a round: placement (its
        bookkeeping every round), then the K events (one a round, when they fire)."""
        return (Placement(), SettledEvents(self.gap, self.min_share))
