"""Lightning's ``global_step`` as the engine counts it: client-steps run so far, summed over
all processes, so that step counts, ``max_steps`` and step-named checkpoints mean the same on 1
and N processes and on both executors. A work item carries how many client-steps it counts
(``step_count``: those all processes run at its position); a step without an optimizer update
(a padding item, the other processes' steps) is counted here."""

from __future__ import annotations

from typing import Any


def count_steps(trainer: Any, steps: int) -> None:
    """Advance ``trainer.global_step`` by ``steps`` client-steps that ran no optimizer step here."""
    if steps > 0:
        trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.increment_by(steps)
