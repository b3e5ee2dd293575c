"""flower/messaging.py: waiting for the nodes says how many are connected and how long is left,
returns once enough are, and fails naming both counts."""

from __future__ import annotations

import logging
import time

import pytest

from lightning_fedcluster.flower.messaging import wait_for_nodes


class ArrivingGrid:
    """A grid whose second node connects ``after`` seconds after the first call."""

    def __init__(self, after: float) -> None:
        self.start, self.after = None, after

    def get_node_ids(self) -> list[int]:
        self.start = self.start or time.monotonic()
        return [1, 2] if time.monotonic() - self.start >= self.after else [1]


def test_waiting_says_how_many_nodes_are_connected_until_enough_are(caplog):
    with caplog.at_level(logging.INFO, logger="lightning_fedcluster.flower"):
        assert wait_for_nodes(ArrivingGrid(after=0.5), min_nodes=2, node_wait=30, every=0.2) == [1, 2]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "1 of 2 nodes connected, waiting (30 s left)"
    assert 2 <= len(lines) <= 4 and all(line.startswith("1 of 2 nodes connected") for line in lines)


def test_waiting_too_long_fails_naming_both_counts():
    with pytest.raises(TimeoutError, match=r"^1 of min_nodes=2 Flower nodes connected within 0.3 s"):
        wait_for_nodes(ArrivingGrid(after=60), min_nodes=2, node_wait=0.3)
