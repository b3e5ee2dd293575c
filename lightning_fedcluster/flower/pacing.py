"""Shorter waits inside Flower's deployment runtime (flwr 1.41-1.42) for round-by-round traffic.

A message's objects (the K models) reach the SuperLink or SuperNode a moment after the message
itself; Flower's ``pull_objects`` then backs off 1 s, doubling to 10 s, before it asks again, so
every hop of a round would wait seconds for milliseconds of transfer. ``quick_pulls`` gives the
module that pulls (the SuperLink grid of the ServerApp, the SuperNode's loop) a pull that asks
again after 5 ms, doubling to ``cap`` seconds (20 ms: the objects of a message follow it within
tens of ms), and the same overall limits.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

INITIAL_BACKOFF, BACKOFF_CAP = 0.005, 0.02


def quick(name: str = "pull_objects", cap: float = BACKOFF_CAP) -> Any:
    """Flower's ``pull_objects`` (or ``pull_and_inflate_object_from_tree``) with a 5 ms first
    retry, growing to ``cap`` seconds."""
    from flwr.supercore.inflatable import inflatable_utils

    return functools.partial(
        getattr(inflatable_utils, name), initial_backoff=INITIAL_BACKOFF, backoff_cap=cap
    )


@contextmanager
def quick_pulls(module: ModuleType, name: str = "pull_objects", cap: float = BACKOFF_CAP) -> Iterator[None]:
    """Within the block, ``module.<name>`` (Flower's pull function that module calls) retries
    quickly; restored afterwards."""
    original = getattr(module, name)
    setattr(module, name, quick(name, cap))
    try:
        yield
    finally:
        setattr(module, name, original)
