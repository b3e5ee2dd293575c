"""FederatedStrategy: Lightning's DDP process machinery without the DDP model wrapper.

DDP would all-reduce the gradients of different clients and broadcast buffers every step;
federated learning instead averages whole client updates once per round, which the
ClusteredModule does through ``strategy.reduce``. One class serves 1..N processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.server_optimizer import ServerOptimizerConfig, ServerOptimizerKind
from lightning_fedcluster.arguments import check_positive_int, check_seed
from lightning_fedcluster.engine.checkpoint import resume_hint
from lightning_fedcluster.engine.client_sampling import RoundSchedule, schedule_for
from lightning_fedcluster.engine.copies import attached_trainer
from lightning_fedcluster.engine.gradient_clipping import (
    check_clip_with_shared_layers,
    check_trainer_clipping,
)
from lightning_fedcluster.engine.optimizer_state import (
    OptimizerStateMode,
    StoreDtypeName,
    check_persist_with_shared_layers,
)
from lightning_fedcluster.engine.outputs import LogitsFrom
from lightning_fedcluster.engine.plan import ExecutorName, TrainingPlan
from lightning_fedcluster.engine.threads import restore_threads
from lightning_fedcluster.strategies.batch_limits import apply_batch_limits
from lightning_fedcluster.strategies.checkpoint_io import VerifiedCheckpointIO
from lightning_fedcluster.strategies.keywords import init_parameters, reject_unknown
from lightning_fedcluster.strategies.launchers import EnvironmentKeepingLaunch
from lightning_fedcluster.strategies.module_options import ModuleOptions, clustered_module
from lightning_fedcluster.strategies.precision import check_precision
from lightning_fedcluster.strategies.process_faults import (
    destroy_process_group_at_exit,
    exit_status_on_sigterm,
    process_group_timeout,
)
from lightning_fedcluster.strategies.round_arguments import (
    Execution,
    LocalTraining,
    Sampling,
    ServerUpdate,
    algorithm_clusters,
)

if TYPE_CHECKING:
    from lightning_fedcluster.algorithms.client_state import ClientState

class FederatedStrategy(EnvironmentKeepingLaunch, DDPStrategy):
    """Base of every clustered-FL strategy: the round schedule and the engine's process setup.

    The keywords are flat (Lightning's strategies and the CLI take them so); the strategy keeps its
    own settings in four frozen, once-checked groups (``strategies/round_arguments.py``):
    ``sampling`` (``Sampling``: clients_per_round, min_clients_per_round), ``local_training``
    (``LocalTraining``: local_steps, local_epochs, drop_last, finetune_epochs, optimizer_state,
    optimizer_state_dtype, optimizer_state_dir, gradient_clip_val), ``server_update``
    (``ServerUpdate``: server_lr, the server optimizer, max_update_norm) and ``execution``
    (``Execution``: executor, clients_per_chunk, reuse_estep_forward), and builds its ``plan``.
    ``shared_layers`` and ``logits_from`` are kept as ``module_options`` for the ClusteredModule it
    builds around a plain module (they are the module's settings); ``seed`` is the strategy's own.
    A named strategy's rule options live in its rule's ``Config``.

    Args:
        num_clusters: K, the number of cluster models: a named strategy builds its rule with it;
            with ``algorithm=`` it may be left out (K is the rule's, its one home:
            ``strategy.num_clusters`` and the plan's read it from the rule).
        clients_per_round: clients sampled per round (seeded by ``seed`` and the round); None = all.
        local_steps: local SGD steps per client and round (default 5 when ``local_epochs`` is None).
        local_epochs: alternatively, passes over each client's data per round, in shuffled
            minibatches of the datamodule's batch_size with a partial last batch (a DataLoader's
            epoch), reshuffled every pass.
        drop_last: with local_epochs, drop each pass's partial last batch (the FedRC authors'
            loader does).
        server_lr: η_g, the server step applied to the averaged update (or to the server
            optimizer's direction).
        server_optimizer: "none" (θ ← θ + η_g Δ, FedAvg's server), "momentum" (FedAvgM:
            v ← β v + Δ, θ ← θ + η_g v) or "adam" (FedAdam, Reddi et al. 2021: θ ← θ + η_g m / (√v + τ);
            takes a small ``server_lr``, e.g. 0.01–0.1), per cluster on its averaged update Δ.
            Its state (one or two float64 tensors per parameter and cluster) is checkpointed.
        server_momentum: β of "momentum" (default 0.9).
        server_betas: (β₁, β₂) of "adam" (default (0.9, 0.99)).
        server_tau: τ of "adam", its adaptivity (default 1e-3).
        max_update_norm: the longest client update ‖θ_local − θ_k‖ (L2 over a cluster's tensors)
            the server accepts; a longer one is rejected and left out of the round, named and
            counted in ``train/rejected`` (None: no bound). Non-finite updates and ω off the
            simplex are always rejected (``engine/reply_checks.py``).
        min_clients_per_round: a round is applied only when at least this many of its clients'
            updates were accepted (otherwise the models stay and a warning says why); a round
            with none stops the run.
        gradient_clip_val: before every local step (and FedRC-FT's fine-tuning steps), each trained
            cluster copy's gradient is rescaled to this L2 norm where it is longer (per copy, over
            all its parameters; None: no clipping). The clients' steps run in the engine, so this
            takes the place of ``Trainer(gradient_clip_val=...)``, which is refused. Keeps a
            model from blowing up when its step is large (``docs/how-clusters-form.md``).
        seed: the run's seed, its one home: drives client sampling, the rule's seeded draws and
            local minibatch order (the plan carries it), and initialises the copies of a module it wraps.
        finetune_epochs: before measuring a participating client's local accuracy, fine-tune copies
            of the cluster models on its training data for this many epochs (FedRC-FT); 0 = off.
        shared_layers: submodule names shared by the K copies (one feature extractor, K clustered
            heads) of the ClusteredModule the strategy builds around a plain LightningModule (the
            module's setting: refused with a ClusteredModule, ``module_options.py``).
        executor: how clients are simulated: "loop" (one client at a time, any model and
            optimizer), "vectorized" (chunks of clients at once with ``torch.func``: plain SGD,
            models without random layers or running statistics, not for FedSoft, D-FedEM,
            FeSEM/WeCFL, CFL or shared layers), or "auto" (vectorised where supported and the
            model is all ``nn.Linear`` layers, where it is measured faster; else the loop).
        clients_per_chunk: clients the vectorised executor trains together (default 64, fewer
            for large models).
        num_threads: torch's intra-op threads during a fit (restored after it). None: the
            engine's choice, said at the fit's start: ``OMP_NUM_THREADS`` or a
            ``torch.set_num_threads`` count when you set one, else one thread when a client's
            local step is too small to split (the quick start's MLP), else torch's count
            (``engine/threads.py``). With several processes, None keeps Lightning's count (the
            cores divided by the processes, the same in each).
        reuse_estep_forward: True: the first local step's forward of its batch (with gradients)
            also gives the E-step those rows' losses: one batch forward less per client and
            cluster, results within float rounding of False (the default); pays most on the loop
            executor. Refused with dropout, BatchNorm, FedSoft, D-FedEM (``engine/estep_reuse.py``).
        optimizer_state: "reset" (every client's local optimizer starts afresh each round) or
            "persist" (each (client, cluster) optimizer state, e.g. SGD momentum, is kept across
            rounds on the CPU, as the FedRC authors' code does; memory clients × K × parameters
            per state tensor).
        optimizer_state_dtype: the dtype of that store between rounds: "float32" (exact) or
            "bfloat16" / "float16" (half the memory; the state is rounded once per round).
        optimizer_state_dir: keep that store in a temporary file in this existing directory instead
            of in memory (None, the default): a client's state is read when it trains and written
            back after, so one process holds one client's state at a time. Bit-identical results;
            costs a file read and write per client and round. Choose a disk, not a tmpfs.
        logits_from: where the logits are in a forward that returns a dict or tuple (a key, an
            index, or a callable output -> logits) of the ClusteredModule the strategy builds around
            a plain LightningModule (as ``shared_layers``).
        process arguments: ``accelerator``, ``parallel_devices``, ``cluster_environment``,
            ``checkpoint_io``, ``precision_plugin``, ``process_group_backend``, ``timeout``,
            ``start_method``: Lightning's DDPStrategy arguments for the processes. DDP's
            model-wrapper arguments (``ddp_comm_hook``, ``find_unused_parameters``, ...) do not
            apply: no DistributedDataParallel is built. ``timeout`` (a ``timedelta`` or seconds;
            Lightning's default 30 minutes) is how long a process waits for the others in a
            collective (a round's all-reduce) before the fit fails: a stopped or hung peer fails
            the others after it. ``checkpoint_io`` defaults to
            ``VerifiedCheckpointIO`` (atomic writes beside the target, a content hash checked on
            load).

    Any other keyword is a TypeError listing the valid ones (a typo such as ``num_cluster=5`` must
    not train with the default).
    """

    strategy_name = "federated"
    # Arguments a subclass fixes itself (hidden from the list of valid arguments in errors);
    # "algorithm" for a named strategy, which builds its rule from its own arguments.
    fixed_arguments: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        num_clusters: int | None = None,
        *,
        algorithm: Algorithm | None = None,
        clients_per_round: int | None = None,
        local_steps: int | None = None,
        local_epochs: int | None = None,
        server_lr: float = 1.0,
        seed: int = 0,
        finetune_epochs: int = 0,
        shared_layers: Sequence[str] = (),
        executor: ExecutorName = "auto",
        clients_per_chunk: int | None = None,
        num_threads: int | None = None,
        reuse_estep_forward: bool = False,
        optimizer_state: OptimizerStateMode = "reset",
        optimizer_state_dtype: StoreDtypeName = "float32",
        optimizer_state_dir: str | os.PathLike[str] | None = None,
        drop_last: bool = False,
        logits_from: LogitsFrom = None,
        server_optimizer: ServerOptimizerKind = "none",
        server_momentum: float | None = None,
        server_betas: tuple[float, float] | None = None,
        server_tau: float | None = None,
        max_update_norm: float | None = None,
        min_clients_per_round: int = 1,
        gradient_clip_val: float | None = None,
        accelerator: pl.accelerators.Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        **unknown: Any,
    ) -> None:
        builds_own = "algorithm" in self.fixed_arguments
        valid = [
            name
            for name in init_parameters(type(self), FederatedStrategy)
            if name not in self.fixed_arguments
        ]
        reject_unknown(type(self).__name__, unknown, valid)
        num_clusters = algorithm_clusters(
            type(self).__name__, algorithm, num_clusters, builds_own, base=type(self) is FederatedStrategy
        )
        self._algorithm = algorithm
        check_positive_int("num_clusters", num_clusters)
        check_seed(seed)
        self.sampling = Sampling(clients_per_round, min_clients_per_round)
        self.local_training = LocalTraining(
            local_steps, local_epochs, drop_last, finetune_epochs,
            optimizer_state, optimizer_state_dtype, optimizer_state_dir, gradient_clip_val,
        )  # fmt: skip
        server_optimizer_config = ServerOptimizerConfig.from_arguments(
            server_optimizer, server_momentum, server_betas, server_tau
        )
        self.server_update = ServerUpdate(server_lr, server_optimizer_config, max_update_norm)
        self.execution = Execution(executor, clients_per_chunk, num_threads, reuse_estep_forward)
        self.module_options = ModuleOptions(shared_layers, logits_from)
        check_persist_with_shared_layers(optimizer_state, self.module_options.shared_layers)
        clip = self.local_training.gradient_clip_val
        check_clip_with_shared_layers(clip, self.module_options.shared_layers)
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io or VerifiedCheckpointIO(),
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=process_group_timeout(timeout),
            start_method=start_method,
        )
        self.seed = seed
        self._schedule: tuple[int, RoundSchedule] | None = None
        # The plain module last wrapped by ``connect`` and its ClusteredModule (reused for that module;
        # references, not a weakref, so that the strategy stays picklable for spawned processes).
        self._wrapped: tuple[pl.LightningModule, pl.LightningModule] | None = None

    @property
    def algorithm(self) -> Any:
        """The algorithm's rule object (pure tensor math from ``lightning_fedcluster.algorithms``):
        the one given as ``algorithm=``, or the one a named strategy builds from its arguments."""
        if self._algorithm is None:
            raise TypeError(
                f"{type(self).__name__} has no algorithm: a subclass of FederatedStrategy passes "
                "algorithm= to it or overrides the algorithm property with the rule it builds"
            )
        return self._algorithm

    @property
    def num_clusters(self) -> int:
        """K, read from the algorithm's rule (its one home)."""
        return self.algorithm.num_clusters

    @property
    def algorithm_name(self) -> str:
        """The algorithm as the user chose it: the strategy's name without "Strategy" (FedEM and
        FedRC share a rule class, WeCFL and FeSEM too), or the rule's class given as ``algorithm=``."""
        if self._algorithm is not None:
            return type(self._algorithm).__name__
        return type(self).__name__.removesuffix("Strategy")

    @property
    def plan(self) -> TrainingPlan:
        """The run's configuration as the engine reads it: a frozen ``TrainingPlan`` of this
        strategy's settings, built when a fit starts (and for every Flower node)."""
        return TrainingPlan.of(
            self.algorithm_name,
            self.algorithm,
            (self.sampling, self.local_training, self.server_update, self.execution),
            seed=self.seed,
            shared_layers=self.module_options.shared_layers,
            logits_from=self.module_options.logits_from,
            precision=self.precision_plugin.precision,
        )

    def round_schedule(
        self, datamodule: Any, client_state: Callable[[], ClientState] | None = None
    ) -> RoundSchedule:
        """The round schedule for ``datamodule`` (cached per datamodule). A server that selects
        clients from the client store (FedSoft) reads ``client_state()``: the trained module's by
        default, the Flower server's own otherwise."""
        key = id(datamodule)
        if self._schedule is None or self._schedule[0] != key:
            state = client_state or (lambda: self.lightning_module.client_state)
            local = self.local_training
            schedule = schedule_for(
                self.algorithm, datamodule, self.sampling.clients_per_round, local.local_steps,
                local.local_epochs, local.drop_last, self.seed, state,
            )  # fmt: skip
            self._schedule = (key, schedule)
        return self._schedule[1]

    def check_datamodule(self, datamodule: Any) -> None:
        """Validate algorithm options that depend on the data (called before training starts)."""
        self.algorithm.check_clients(datamodule.num_clients)

    def connect(self, model: pl.LightningModule) -> None:
        """Wrap a plain LightningModule into K cluster copies (with this strategy's seed and
        ``module_options``); use a ClusteredModule as it is (``module_options.py``: the module
        owns shared_layers and logits_from, so a strategy that sets them too is refused)."""
        model = self._wrap(model)
        check_persist_with_shared_layers(self.local_training.optimizer_state, model.shared_layers)
        check_clip_with_shared_layers(self.local_training.gradient_clip_val, model.shared_layers)
        check_trainer_clipping(attached_trainer(model))
        model.federated = self  # what the module reads of this strategy (engine/host.py FederatedRun)
        super().connect(model)

    def teardown(self) -> None:
        """DDPStrategy's teardown; the module no longer runs under this strategy, and torch's
        threads are back to what they were before a fit set them (``engine/threads.py``)."""
        module = self.lightning_module
        restore_threads()
        super().teardown()
        if module is not None and getattr(module, "federated", None) is self:
            module.federated = None

    def _wrap(self, model: pl.LightningModule) -> pl.LightningModule:
        """The ClusteredModule around a plain LightningModule: the one this strategy built for that
        very object before, if any, so that ``trainer.predict(my_module, ...)`` (or test, or another
        fit) after ``trainer.fit(my_module, ...)`` uses the trained cluster models, as a Lightning
        module is trained in place; else a new one (K fresh copies). A ClusteredModule as it is."""
        if self._wrapped is not None and model in self._wrapped:  # the plain module, or its wrapper
            return self._wrapped[1]
        clustered = clustered_module(
            model, self.num_clusters, self.seed, self.module_options, type(self).__name__
        )
        if clustered is not model:
            clustered.trainer = attached_trainer(model)  # attached by the trainer before connect
            self._wrapped = (model, clustered)
        return clustered

    def setup_distributed(self) -> None:
        """Lightning's process-group setup, plus its orderly teardown at interpreter exit; no
        process group for a single process.

        One process has nothing to communicate: ``reduce``, ``broadcast`` and ``barrier`` are
        identities without a group, so none is created (and no "Starting with 1 processes" banner
        is printed). Lightning registers the teardown only for NCCL. A gloo group left alive at exit
        can abort the process with "terminate called without an active exception" while the
        interpreter shuts down (pytorch/pytorch#190489), after training finished correctly.
        """
        if self.num_nodes * self.num_processes == 1 and not (dist.is_available() and dist.is_initialized()):
            reset_seed()  # as DDPStrategy.setup_distributed does, so 1 process seeds as N processes do
            self.set_world_ranks()
            return
        super().setup_distributed()
        destroy_process_group_at_exit()

    def on_exception(self, exception: BaseException) -> None:
        """Ctrl-C (KeyboardInterrupt) or SIGTERM during a fit: say how to resume
        (``engine/checkpoint.py``); a fit stopped by SIGTERM exits with status 143
        (``process_faults.py``)."""
        super().on_exception(exception)
        exit_status_on_sigterm(exception)
        module = self.lightning_module
        if isinstance(exception, (KeyboardInterrupt, SIGTERMException)) and module is not None:
            trainer = module.trainer  # attached: the interrupt came through one of its entry points
            if trainer.state.fn == TrainerFn.FITTING:
                rank_zero_info(resume_hint(trainer))

    def setup(self, trainer: pl.Trainer) -> None:
        """DDPStrategy's setup; with one process and no group, evaluation skips its cross-process
        weight sync (there is no other process to sync with). Batch limits are checked first
        (``batch_limits``: rounds are never cut), and the precision (``strategies/precision.py``)."""
        check_precision(trainer)
        apply_batch_limits(trainer)
        if trainer.state.fn == TrainerFn.FITTING or (dist.is_available() and dist.is_initialized()):
            super().setup(trainer)
            return
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.setup_precision_plugin()

    def configure_ddp(self) -> None:
        """Keep the plain module (no DistributedDataParallel) and start all ranks from rank 0's weights."""
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            with torch.no_grad():
                for tensor in self.model.state_dict().values():
                    dist.broadcast(tensor, src=0)
