"""Lightning's ``global_step`` as the engine counts it: client-steps run so far, summed over
all processes, so that step counts, ``max_steps`` and step-named checkpoints mean the same on 1
and N processes and on both executors. A work item carries how many client-steps it counts
(``step_count``: those all processes run at its position); a step without an update here (a
padding item, the other processes' steps) is counted through Lightning's public path: a step of
the optimizer whose gradients were cleared first, which torch's optimizers skip (no parameter,
momentum or weight-decay change) and Lightning counts."""

from __future__ import annotations

from typing import Any


def count_steps(optimizer: Any, steps: int) -> None:
    """Advance ``global_step`` by ``steps`` client-steps that run no update on this process.

    The gradients are cleared first: a client's last backward pass must not be applied again
    (the next local step recomputes them from zero anyway)."""
    if steps <= 0:
        return
    solver = getattr(optimizer, "optimizer", optimizer)  # Lightning's wrapper or the optimizer
    for group in solver.param_groups:
        for parameter in group["params"]:
            parameter.grad = None
    for _ in range(steps):
        optimizer.step()
