"""Honest evaluation: validation rows apart from test rows, and adapt rows apart from score rows.

Two rules, both enforced by how the rows are split here:

* Validation never looks at test rows. Each participating client's held-out rows (the ones not
  used for training) are split once into a validation part (`val_share` of them) and a test
  part; model selection, early stopping and checkpoint monitoring read the validation part only,
  and the test part is reported. The training rows are untouched.
* An unseen (global) client is never scored on the rows it adapts on. Its rows are split the same
  way into a validation and a test part, and each of those into an *adapt* part (`adapt_fraction`
  of it: the client's mixture weights are fitted there) and a *score* part (accuracy or MSE is
  measured there). Default 0.4: the FedRC authors' tabular (airline) loader splits 40/60; their
  FashionMNIST-C loader fits a test client's π on 90 % of its rows and scores the other 10 %
  (LINs-lab/FedRC, utils/utils.py, split_train_val_test).

Sizes (n = a client's rows in the part being split):

* validation: ``floor(val_share * n)``; the test part keeps the rest, so a client with one
  held-out row gives it to test, and test is never smaller than validation for val_share <= 0.5.
* adapt: ``round(adapt_fraction * n)`` (half up, `partition.held_out_count`) clamped to
  ``[1, n - 1]`` when n >= 2, so both parts are non-empty; a single row is scored (it adapts on
  nothing, i.e. the rule's prior), no rows give two empty parts.

Rows are drawn uniformly within each client (no stratification) from child streams of
``numpy.random.SeedSequence(seed, spawn_key=(EVALUATION_STREAM,))``, a stream no builder uses;
the participating clients' split has its own child, so adding or removing global clients never
changes it. Within a part, rows keep their original order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_fedcluster.datamodules.partition.counts import held_out_count

__all__ = [
    "EVALUATION_PARTS",
    "EvaluationRows",
    "carve_evaluation_rows",
    "EVALUATION_STAGES",
    "EVALUATION_STREAM",
    "EvaluationPlan",
    "adapt_count",
    "adapt_fraction_arg",
    "plan_evaluation",
    "val_count",
    "val_share_arg",
]

EVALUATION_STAGES = ("val", "test")
EVALUATION_PARTS = ("local", "global_adapt", "global_score")
EVALUATION_STREAM = 0xE7A1
"""Spawn key of the evaluation splits' seed stream (the builders use children 0-5 of the seed)."""


def val_share_arg(value: Any) -> float:
    """`value` as a float in (0, 1); ValueError naming val_share otherwise."""
    if isinstance(value, Real) and not isinstance(value, bool) and value == 0:
        raise ValueError(
            "val_share=0 leaves no validation rows, so validation would reuse the test rows (and "
            "pick models on the very rows that report their accuracy): pass val_share in (0, 1), "
            "e.g. the default 0.5"
        )
    if not _open_unit(value):
        raise ValueError(
            "val_share must be a number in (0, 1), the share of each client's held-out rows used "
            f"for validation (the rest are test rows; 1 would leave no test rows), got {value!r}"
        )
    return float(value)


def adapt_fraction_arg(value: Any) -> float:
    """`value` as a float in (0, 1); ValueError naming adapt_fraction otherwise."""
    if not _open_unit(value):
        raise ValueError(
            "adapt_fraction must be a number in (0, 1), the share of an unseen client's validation "
            f"or test rows its mixture weights are fitted on (the rest are scored), got {value!r}"
        )
    return float(value)


def _open_unit(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and 0 < value < 1


def val_count(n: int, val_share: float) -> int:
    """Validation rows of a client with n held-out rows: floor(val_share * n) (test keeps the
    rest; the tiny epsilon only absorbs float error such as 0.29 * 100 = 28.999...)."""
    return int(math.floor(val_share * n + 1e-9))


def adapt_count(n: int, adapt_fraction: float) -> int:
    """Adapt rows of an unseen client's part with n rows: round(adapt_fraction * n) half up,
    clamped to [1, n - 1] for n >= 2 (both parts non-empty); 0 for n <= 1 (a lone row is scored)."""
    if n <= 1:
        return 0
    return min(max(held_out_count(n, adapt_fraction), 1), n - 1)


@dataclass(frozen=True)
class EvaluationPlan:
    """Row indices of every evaluation part, as int64 numpy arrays.

    `local[stage]` indexes the concatenated held-out rows of the participating clients and
    `local_offsets[stage]` [M + 1] delimits each client's share of it; `global_rows[stage][part]`
    indexes the concatenated global client rows (`global_x`) with offsets [G + 1] in
    `global_offsets[stage][part]` (part "global_adapt" or "global_score"). Indices are sorted, so
    each client's rows are contiguous and in their original order.
    """

    local: dict[str, np.ndarray]
    local_offsets: dict[str, np.ndarray]
    global_rows: dict[str, dict[str, np.ndarray]]
    global_offsets: dict[str, dict[str, np.ndarray]]


def split_rows(
    offsets: np.ndarray, first_counts: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split every client's rows (client c owns offsets[c]:offsets[c+1]) into a random first part
    of first_counts[c] rows and a second part of the rest. Returns (first rows, first offsets,
    second rows, second offsets), the rows sorted. One vectorised draw for all clients."""
    sizes = np.diff(offsets)
    total = int(offsets[-1])
    owner = np.repeat(np.arange(sizes.size), sizes)
    order = np.lexsort((rng.random(total), owner))  # grouped by client, random within one
    rank = np.empty(total, dtype=np.int64)
    rank[order] = np.arange(total) - offsets[owner[order]]
    first = rank < first_counts[owner]
    zero = np.zeros(1, dtype=np.int64)
    first_offsets = np.concatenate([zero, np.cumsum(first_counts)]).astype(np.int64)
    second_offsets = np.concatenate([zero, np.cumsum(sizes - first_counts)]).astype(np.int64)
    return np.flatnonzero(first), first_offsets, np.flatnonzero(~first), second_offsets


def plan_evaluation(
    held_offsets: np.ndarray,
    global_offsets: np.ndarray,
    *,
    val_share: float,
    adapt_fraction: float,
    seed: int,
) -> EvaluationPlan:
    """The validation/test split of the participating clients' held-out rows and the
    validation/test x adapt/score split of the global clients' rows (see the module docstring)."""
    held_offsets = np.asarray(held_offsets, dtype=np.int64)
    global_offsets = np.asarray(global_offsets, dtype=np.int64)
    root = np.random.SeedSequence(seed, spawn_key=(EVALUATION_STREAM,))
    local_rng, stage_rng, *part_rngs = (np.random.default_rng(s) for s in root.spawn(4))

    held_sizes = np.diff(held_offsets)
    counts = np.array([val_count(int(n), val_share) for n in held_sizes], dtype=np.int64)
    val, val_offsets, test, test_offsets = split_rows(held_offsets, counts, local_rng)

    global_sizes = np.diff(global_offsets)
    counts = np.array([val_count(int(n), val_share) for n in global_sizes], dtype=np.int64)
    g_val, g_val_offsets, g_test, g_test_offsets = split_rows(global_offsets, counts, stage_rng)
    global_rows: dict[str, dict[str, np.ndarray]] = {}
    global_part_offsets: dict[str, dict[str, np.ndarray]] = {}
    for stage, rows, offsets, rng in (
        ("val", g_val, g_val_offsets, part_rngs[0]),
        ("test", g_test, g_test_offsets, part_rngs[1]),
    ):
        sizes = np.diff(offsets)
        counts = np.array([adapt_count(int(n), adapt_fraction) for n in sizes], dtype=np.int64)
        adapt, adapt_offsets, scored, score_offsets = split_rows(offsets, counts, rng)
        global_rows[stage] = {"global_adapt": rows[adapt], "global_score": rows[scored]}
        global_part_offsets[stage] = {"global_adapt": adapt_offsets, "global_score": score_offsets}
    return EvaluationPlan(
        local={"val": val, "test": test},
        local_offsets={"val": val_offsets, "test": test_offsets},
        global_rows=global_rows,
        global_offsets=global_part_offsets,
    )


@dataclass(frozen=True)
class EvaluationRows:
    """The held-out rows split for evaluation: ``val`` and ``test`` as (x, y, offsets), where
    each row came from (``positions``, per (stage, part)), and the global clients' adapt/score
    rows with their offsets (``global_parts``, per (stage, part))."""

    val: tuple[Tensor, Tensor, Tensor]
    test: tuple[Tensor, Tensor, Tensor]
    positions: dict[tuple[str, str], Tensor]
    global_parts: dict[tuple[str, str], tuple[Tensor, Tensor]]


def carve_evaluation_rows(
    held_x: Tensor,
    held_y: Tensor,
    held_offsets: Tensor,
    global_offsets: Tensor,
    val_share: float,
    adapt_fraction: float,
    seed: int,
) -> EvaluationRows:
    """Split every client's held-out rows into validation and test, and plan every global
    client's validation/test x adapt/score rows (``plan_evaluation``), as tensors."""
    plan = plan_evaluation(
        held_offsets.numpy(),
        global_offsets.numpy(),
        val_share=val_share,
        adapt_fraction=adapt_fraction,
        seed=seed,
    )
    owner = torch.repeat_interleave(torch.arange(held_offsets.numel() - 1), held_offsets.diff())
    positions = torch.arange(held_y.shape[0]) - held_offsets[owner]
    val_rows, test_rows = (torch.from_numpy(plan.local[stage]) for stage in EVALUATION_STAGES)
    located = {("val", "local"): positions[val_rows], ("test", "local"): positions[test_rows]}
    global_owner = torch.repeat_interleave(torch.arange(global_offsets.numel() - 1), global_offsets.diff())
    global_parts = {}
    for stage in EVALUATION_STAGES:
        for part in EVALUATION_PARTS[1:]:
            rows = torch.from_numpy(plan.global_rows[stage][part])
            global_parts[stage, part] = (rows, torch.from_numpy(plan.global_offsets[stage][part]))
            located[stage, part] = rows - global_offsets[global_owner[rows]]
    return EvaluationRows(
        val=(held_x[val_rows], held_y[val_rows], torch.from_numpy(plan.local_offsets["val"])),
        test=(held_x[test_rows], held_y[test_rows], torch.from_numpy(plan.local_offsets["test"])),
        positions=located,
        global_parts=global_parts,
    )
