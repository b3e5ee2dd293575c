"""The checks of a federated strategy's round arguments (local work, executor, server step),
each a clear error naming the argument, raised when the strategy is built."""

from __future__ import annotations

from typing import Any

from lightning_fedcluster.arguments import check_positive_int, check_seed
from lightning_fedcluster.engine.executors.select import EXECUTORS


def check_round_arguments(
    *,
    clients_per_round: Any,
    local_steps: Any,
    local_epochs: Any,
    drop_last: Any,
    seed: Any,
    executor: Any,
    clients_per_chunk: Any,
    server_lr: Any,
    finetune_epochs: Any,
) -> None:
    check_positive_int("clients_per_round", clients_per_round, allow_none=True)
    check_positive_int("local_steps", local_steps, allow_none=True)
    check_positive_int("local_epochs", local_epochs, allow_none=True)
    if local_steps is not None and local_epochs is not None:
        raise ValueError("give either local_steps or local_epochs, not both")
    if not isinstance(drop_last, bool):
        raise ValueError(f"drop_last must be True or False, got {drop_last!r}")
    if drop_last and local_epochs is None:
        raise ValueError("drop_last applies to local_epochs (passes over the data); give local_epochs")
    check_seed(seed)
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    check_positive_int("clients_per_chunk", clients_per_chunk, allow_none=True)
    if not server_lr > 0:
        raise ValueError(f"server_lr must be > 0, got {server_lr!r}")
    if isinstance(finetune_epochs, bool) or not isinstance(finetune_epochs, int) or finetune_epochs < 0:
        raise ValueError(f"finetune_epochs must be an integer >= 0, got {finetune_epochs!r}")
