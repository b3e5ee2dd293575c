"""The take-off measure the take-off studies share (standard library only, so that
``takeoff_runs.py summarize`` runs without torch): the first round whose concept ARI reaches
``TAKE_OFF_ARI``."""

from __future__ import annotations

from collections.abc import Iterable

TAKE_OFF_ARI = 0.8


def take_off_round(
    rounds_and_aris: Iterable[tuple[int, float]], threshold: float = TAKE_OFF_ARI
) -> int | None:
    """The first round whose ARI is >= ``threshold`` (pairs in round order), or None."""
    return next((round_ for round_, ari in rounds_and_aris if ari >= threshold), None)
