"""A federated strategy's own settings, in four frozen groups, each checked once on construction
(``__post_init__``, errors naming the argument and the fix): ``Sampling`` (which clients train),
``LocalTraining`` (what a client does), ``ServerUpdate`` (how the server applies the round) and
``Execution`` (how the clients are simulated). The strategy takes them as flat keywords (Lightning's
and the CLI's convention), stores the groups, and builds its ``TrainingPlan`` from them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightning_fedcluster.algorithms.server_optimizer import ServerOptimizerConfig
from lightning_fedcluster.arguments import check_positive_int
from lightning_fedcluster.engine.gradient_clipping import check_gradient_clip_val
from lightning_fedcluster.engine.optimizer_state import (
    OptimizerStateMode,
    StoreDtypeName,
    check_optimizer_state,
)
from lightning_fedcluster.engine.plan import EXECUTORS, ExecutorName
from lightning_fedcluster.engine.state_file import check_state_directory

if TYPE_CHECKING:
    from lightning_fedcluster.algorithms.base import Algorithm

DEFAULT_LOCAL_STEPS = 5  # when neither local_steps nor local_epochs is given


@dataclass(frozen=True)
class Sampling:
    """Which clients train each round: ``clients_per_round`` sampled per round (seeded by the
    strategy's ``seed`` and the round; None = all), and the fewest accepted updates
    (``min_clients_per_round``) for a round to be applied."""

    clients_per_round: int | None = None
    min_clients_per_round: int = 1

    def __post_init__(self) -> None:
        check_positive_int("clients_per_round", self.clients_per_round, allow_none=True)
        check_positive_int("min_clients_per_round", self.min_clients_per_round)
        if self.clients_per_round is not None and self.min_clients_per_round > self.clients_per_round:
            raise ValueError(
                f"min_clients_per_round={self.min_clients_per_round} exceeds clients_per_round="
                f"{self.clients_per_round}: no round could ever be applied; lower min_clients_per_round"
            )


@dataclass(frozen=True)
class LocalTraining:
    """What a client does in a round: ``local_steps`` SGD steps (5 when ``local_epochs`` is not
    given either) or ``local_epochs`` passes (``drop_last``: without each pass's partial last
    batch); ``finetune_epochs`` of FedRC-FT before measuring local accuracy; its local optimizer's
    state ``optimizer_state`` ("reset" or "persist", stored as ``optimizer_state_dtype``, in
    memory or in a file under ``optimizer_state_dir``); ``gradient_clip_val``: the L2 norm each
    trained copy's gradient is clipped to before every local step (None: no clipping)."""

    local_steps: int | None = None
    local_epochs: int | None = None
    drop_last: bool = False
    finetune_epochs: int = 0
    optimizer_state: OptimizerStateMode = "reset"
    optimizer_state_dtype: StoreDtypeName = "float32"
    optimizer_state_dir: str | None = None
    gradient_clip_val: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "gradient_clip_val", check_gradient_clip_val(self.gradient_clip_val))
        check_positive_int("local_steps", self.local_steps, allow_none=True)
        check_positive_int("local_epochs", self.local_epochs, allow_none=True)
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError("give either local_steps or local_epochs, not both")
        if self.local_steps is None and self.local_epochs is None:
            object.__setattr__(self, "local_steps", DEFAULT_LOCAL_STEPS)
        if not isinstance(self.drop_last, bool):
            raise ValueError(f"drop_last must be True or False, got {self.drop_last!r}")
        if self.drop_last and self.local_epochs is None:
            raise ValueError("drop_last applies to local_epochs (passes over the data); give local_epochs")
        epochs = self.finetune_epochs
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"finetune_epochs must be an integer >= 0, got {epochs!r}")
        check_optimizer_state(self.optimizer_state, self.optimizer_state_dtype)
        check_state_directory(self.optimizer_state_dir, self.optimizer_state)
        if isinstance(self.optimizer_state_dir, os.PathLike):
            object.__setattr__(self, "optimizer_state_dir", str(self.optimizer_state_dir))


@dataclass(frozen=True)
class ServerUpdate:
    """How the server applies a round: the step ``server_lr`` (η_g) along the averaged update or
    the ``server_optimizer``'s direction (kind and hyperparameters, ``ServerOptimizerConfig``),
    and the longest client update it accepts (``max_update_norm``; None: no bound)."""

    server_lr: float = 1.0
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    max_update_norm: float | None = None

    def __post_init__(self) -> None:
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr!r}")
        norm = self.max_update_norm
        if norm is not None:
            if isinstance(norm, bool) or not isinstance(norm, (int, float)) or not norm > 0:
                raise ValueError(
                    f"max_update_norm must be a number > 0 (the longest client update ‖θ_local − θ_k‖ a "
                    f"round accepts) or None (no bound), got {norm!r}"
                )
            object.__setattr__(self, "max_update_norm", float(norm))


@dataclass(frozen=True)
class Execution:
    """How the clients are simulated: the ``executor`` ("auto", "loop" or "vectorized"), the
    clients the vectorised executor trains together (``clients_per_chunk``; None: chosen from
    the model's size), torch's intra-op threads during a fit (``num_threads``; None: the
    engine's choice, ``engine/threads.py``) and whether a client's E-step pass and first local
    step share one forward (``reuse_estep_forward``, ``engine/estep_reuse.py``)."""

    executor: ExecutorName = "auto"
    clients_per_chunk: int | None = None
    num_threads: int | None = None
    reuse_estep_forward: bool = False

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        check_positive_int("clients_per_chunk", self.clients_per_chunk, allow_none=True)
        check_positive_int("num_threads", self.num_threads, allow_none=True)
        if not isinstance(self.reuse_estep_forward, bool):
            raise TypeError(f"reuse_estep_forward must be True or False, got {self.reuse_estep_forward!r}")


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
