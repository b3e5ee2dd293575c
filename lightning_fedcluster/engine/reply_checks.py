"""The server's checks of what comes back from the clients, written once.

Every update enters a round's sums only after these checks: on the Lightning engine each
client's trained copies before they are accumulated (so what a process puts into the round's
all-reduce is checked), on a Flower node the same for its own clients, and on the Flower server
each node's reply before it is merged. A reply is refused when it holds non-finite values, an ω
row off the simplex of the alive clusters, tensors of other shapes or dtypes than the round
declares, or (``max_update_norm``) an update longer than the bound. A refused reply is left
out of the round with its sender and clients named and counted (``train/rejected``); the round
is applied only when at least ``min_clients_per_round`` clients remain (``engine/federation.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# How far an ω row may be off the simplex (float64 rows computed by softmax and renormalisation
# are within ~1e-15; a flipped byte or a forged row is far outside).
SIMPLEX_TOLERANCE = 1e-6


def all_finite(t: Tensor) -> bool:
    """Whether every value of ``t`` is finite, from one float64 sum: a NaN or an infinity makes the
    sum non-finite (+inf and -inf give NaN), and a float64 sum of float32, bfloat16 or float16
    values cannot overflow, so the answer equals ``isfinite(t).all()`` at a quarter of its cost
    (no boolean mask). float64 tensors, whose sum could overflow, take the elementwise test."""
    if t.dtype == torch.float64 or not t.is_floating_point():
        return bool(torch.isfinite(t).all())
    return bool(torch.isfinite(t.sum(dtype=torch.float64)))


@dataclass(frozen=True)
class ReplyLimits:
    """``max_update_norm``: the longest client update ‖θ_local − θ_k‖ (L2 over a cluster's
    federated tensors, or the shared layers') a round accepts (None: no bound); a node's reply is
    held to it on its weighted mean update per cluster, which is no longer than its clients' longest.
    ``min_clients_per_round``: a round is applied only when this many of its clients' updates
    were accepted."""

    max_update_norm: float | None = None
    min_clients_per_round: int = 1


def difference_norm(local: Sequence[Tensor], reference: Sequence[Tensor]) -> float:
    """‖local − reference‖₂ over all the tensors: each tensor's norm in its own dtype (one
    difference tensor at a time), their squares summed in float64 (a bound check, not a sum the
    weights depend on)."""
    total = 0.0
    for new, old in zip(local, reference, strict=True):
        total += float(torch.linalg.vector_norm(new.detach() - old)) ** 2
    return total**0.5


def tensors_norm(tensors: Sequence[Tensor]) -> float:
    """‖tensors‖₂ over all the tensors, in float64."""
    total = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        total += t.to(torch.float64).square().sum().cpu()
    return float(total.sqrt())


def finite_problems(named: Mapping[str, Tensor]) -> list[str]:
    """Names of the floating-point tensors holding NaN or ±inf."""
    bad = [name for name, t in named.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    return [f"non-finite values in {', '.join(bad)}"] if bad else []


def simplex_problems(omega: Tensor, active: Tensor, clients: Sequence[int]) -> list[str]:
    """Rows of ``omega`` [n, K] (client ``clients[i]``'s ω) that are not a probability vector over
    the alive clusters ``active`` [K]: a negative or non-finite entry, weight on a removed cluster,
    or a sum other than 1."""
    rows = omega.detach().to(torch.float64).cpu()
    alive = active.to(torch.bool).cpu()
    problems = []
    for row, client in zip(rows, clients, strict=True):
        if not bool(torch.isfinite(row).all()):
            problems.append(f"client {client}'s ω holds non-finite values")
            continue
        smallest, total = float(row.min()), float(row.sum())
        removed = float(row[~alive].abs().sum()) if bool((~alive).any()) else 0.0
        if (
            smallest < -SIMPLEX_TOLERANCE
            or abs(total - 1.0) > SIMPLEX_TOLERANCE
            or removed > SIMPLEX_TOLERANCE
        ):
            problems.append(
                f"client {client}'s ω is not on the simplex of the alive clusters (sum {total:.6g}, "
                f"smallest {smallest:.3g}, on removed clusters {removed:.3g})"
            )
    return problems


def norm_problems(label: str, norm: float, weight: float, bound: float | None) -> list[str]:
    """``norm`` / ``weight`` (the mean update of a cluster) longer than ``bound``; a non-finite norm
    (an overflow of finite values) always."""
    if weight <= 0:
        return []
    mean = norm / weight
    if mean != mean or mean == float("inf"):
        return [f"{label}'s update norm overflows"]
    if bound is not None and mean > bound:
        return [f"{label}'s update norm {mean:.4g} exceeds max_update_norm={bound:g}"]
    return []


def shape_problems(
    named: Mapping[str, Tensor], declared: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
) -> list[str]:
    """Tensors missing from ``named``, or of another shape or dtype than ``declared``; tensors
    not declared."""
    problems = []
    missing = [name for name in declared if name not in named]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    unexpected = [name for name in named if name not in declared]
    if unexpected:
        problems.append(f"undeclared {', '.join(unexpected)}")
    for name, (shape, dtype) in declared.items():
        if name not in named:
            continue
        tensor = named[name]
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            problems.append(
                f"{name} is {str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}, declared "
                f"{str(dtype).removeprefix('torch.')} {tuple(shape)}"
            )
    return problems


def client_problems(
    client: int,
    updates: Sequence[tuple[str, Sequence[Tensor], Sequence[Tensor]]],
    omega: Tensor,
    active: Tensor,
    limits: ReplyLimits,
) -> list[str]:
    """One client's work before it enters the round's sums: ``updates`` (label, trained tensors,
    the global tensors they update) finite and within ``max_update_norm``, its ω on the simplex."""
    bad = [label for label, local, _ in updates if not all(all_finite(t) for t in local)]
    if bad:
        return [f"non-finite values in {', '.join(bad)}"]
    problems: list[str] = []
    if limits.max_update_norm is not None:
        for label, local, reference in updates:
            problems += norm_problems(label, difference_norm(local, reference), 1.0, limits.max_update_norm)
    return problems + simplex_problems(omega.reshape(1, -1), active, [client])


def summed_problems(
    deltas: Sequence[Sequence[Tensor]],
    shared: Sequence[Tensor],
    weights: Tensor,
    omega: Tensor,
    clients: Sequence[int],
    active: Tensor,
    limits: ReplyLimits,
) -> list[str]:
    """A reply that sums several clients' work (a Flower node's): the weighted update sums
    Σ w·(θ_local − θ_k) per cluster ``deltas`` (and ``shared``) with their weights [K + 1] finite,
    no update without weight, every mean update within ``max_update_norm``, and every client's ω
    row on the simplex."""
    groups = [(f"cluster {k}", list(ts), float(weights[k])) for k, ts in enumerate(deltas)]
    if shared:
        groups.append(("shared layers", list(shared), float(weights[-1])))
    named = {label: torch.cat([t.flatten() for t in ts]) for label, ts, _ in groups if ts}
    problems = finite_problems({**named, "weights": weights})
    if problems:
        return problems
    if bool((weights < 0).any()):
        problems.append(f"negative weights {weights.tolist()}")
    for label, tensors, weight in groups:
        norm = tensors_norm(tensors)
        if weight <= 0 and norm > 0:
            problems.append(f"{label} carries an update without weight")
        problems += norm_problems(label, norm, weight, limits.max_update_norm)
    return problems + simplex_problems(omega, active, clients)
