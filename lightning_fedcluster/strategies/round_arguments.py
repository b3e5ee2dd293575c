"""The checks of a federated strategy's round arguments (local work, executor, server step),
each a clear error naming the argument, raised when the strategy is built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_fedcluster.arguments import check_positive_int, check_seed
from lightning_fedcluster.engine.executors.select import EXECUTORS

if TYPE_CHECKING:
    from lightning_fedcluster.algorithms.base import Algorithm


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


def check_reply_arguments(max_update_norm: Any, min_clients_per_round: Any, clients_per_round: Any) -> None:
    """The server's checks of the clients' replies (``engine/reply_checks.py``)."""
    if max_update_norm is not None and (
        isinstance(max_update_norm, bool)
        or not isinstance(max_update_norm, (int, float))
        or not max_update_norm > 0
    ):
        raise ValueError(
            f"max_update_norm must be a number > 0 (the longest client update ‖θ_local − θ_k‖ a round "
            f"accepts) or None (no bound), got {max_update_norm!r}"
        )
    check_positive_int("min_clients_per_round", min_clients_per_round)
    if (
        clients_per_round is not None
        and isinstance(clients_per_round, int)
        and min_clients_per_round > clients_per_round
    ):
        raise ValueError(
            f"min_clients_per_round={min_clients_per_round} exceeds clients_per_round={clients_per_round}: "
            "no round could ever be applied; lower min_clients_per_round"
        )


def algorithm_clusters(
    strategy: str, algorithm: Algorithm | None, num_clusters: int | None, builds_own: bool, base: bool
) -> int:
    """K of a strategy given ``algorithm=`` and/or ``num_clusters=``, refusing the combinations that
    cannot be meant: no rule for the plain FederatedStrategy (``base``), a rule for a strategy
    that builds its own, something that is not a rule, or a K that disagrees with the rule's."""
    from lightning_fedcluster.algorithms.base import Algorithm

    if algorithm is None:
        if base:  # a subclass builds its own (its ``algorithm``)
            raise TypeError(
                "FederatedStrategy needs the algorithm to run: FederatedStrategy(algorithm=FedRC(3), "
                "...) with a rule from lightning_fedcluster.algorithms (or your own), or a named "
                "strategy such as FedRCStrategy(num_clusters=3)"
            )
        return 1 if num_clusters is None else num_clusters
    if builds_own:
        raise TypeError(
            f"{strategy} builds its own algorithm from its arguments: pass algorithm= to "
            "FederatedStrategy instead, or drop it"
        )
    if not isinstance(algorithm, Algorithm):
        raise TypeError(
            f"algorithm must be a rule from lightning_fedcluster.algorithms (an Algorithm), got "
            f"{type(algorithm).__name__}"
        )
    if num_clusters is not None and num_clusters != algorithm.num_clusters:
        raise ValueError(
            f"num_clusters={num_clusters} but the algorithm has num_clusters={algorithm.num_clusters}: "
            "set K once, on the algorithm"
        )
    return algorithm.num_clusters
