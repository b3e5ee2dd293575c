"""``FlowerApps``: the ServerApp and ClientApp of one run, from the strategy, the user's
LightningModule and the datamodule (instances, or zero-argument factories that each side calls:
a deployment's app module builds them on the server and on every node)."""

from __future__ import annotations

import contextlib
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from lightning_fedcluster.arguments import check_positive_int, int_arg
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.setup_checks import check_rule_on_model
from lightning_fedcluster.flower.node import NodeFactory, NodeRuntime, built
from lightning_fedcluster.flower.server_host import FlowerServer
from lightning_fedcluster.flower.support import check_supported, clustered_module, flower_optimizer, plan_of

# The nodes' runtimes of this process, per (run, node): models, data and solver are built once
# per run (a simulation worker serves several nodes).
_RUNTIMES: dict[tuple[int, int], NodeRuntime] = {}


class FlowerApps:
    """The two Flower apps of a run.

    Args:
        strategy: a library strategy (FedRC, FedEM, IFCA, FedAvg, FedProx), or a factory of one.
        module: the user's LightningModule (or a ClusteredModule), or a factory of one.
        datamodule: the FederatedDataModule whose clients the nodes hold (a factory in a
            deployment: every node builds it and keeps its partition's clients), unused by the server.
        num_rounds: rounds to run (a run config ``num-server-rounds`` overrides it).
        round_timeout: seconds to wait for the nodes each round (run config ``round-timeout``);
            None waits for every node. A node that fails or misses it is dropped and logged.
        min_nodes: nodes to wait for before the first round (run config ``min-nodes``).
        node_wait: seconds to wait for them (run config ``node-wait``); the server says every few
            seconds how many are connected, and fails the run, naming both counts, when time is up.
        log_dir: TensorBoard directory of the round metrics (run config ``log-dir``).
        save_path: where the server saves the global models, its client store and the round
            metrics with ``torch.save`` after the last round (run config ``save-path``).
        eval_every: every this many rounds, and after the last, the nodes score their clients'
            validation rows and the server logs ``val/local_acc`` (``val/local_mse``) as the
            Lightning engine does (run config ``eval-every``; None or 0: never).
        collect_client_state: after the last round, copy the nodes' client stores into the
            returned module (``simulate`` does; a deployment keeps them on the nodes).
        checkpoint_path: where the server writes its state every ``checkpoint_every`` rounds and
            after the last (a verified file, written atomically; run config ``checkpoint-path``).
        checkpoint_every: rounds between those checkpoints (run config ``checkpoint-every``).
        resume: go on from the checkpoint at ``checkpoint_path`` when there is one, e.g. after the
            ServerApp or the SuperLink went down (run config ``resume``): ``flower/server_checkpoint.py``.
        fast_paths: on a deployment, the ServerApp pulls its replies' objects after 5 ms instead of
            Flower's 1 s, by patching a flwr internal (``flower/fast_paths.py``; run config
            ``fast-paths``). Off by default: Flower's public paths only.
    """

    def __init__(
        self,
        strategy: Any,
        module: Any,
        datamodule: Any = None,
        *,
        num_rounds: int = 1,
        round_timeout: float | None = None,
        min_nodes: int = 1,
        node_wait: float = 300.0,
        log_dir: str | None = None,
        save_path: str | None = None,
        collect_client_state: bool = False,
        eval_every: int | None = None,
        checkpoint_path: str | None = None,
        checkpoint_every: int = 1,
        resume: bool = False,
        fast_paths: bool = False,
    ) -> None:
        check_positive_int("num_rounds", num_rounds)
        check_positive_int("checkpoint_every", checkpoint_every)
        if eval_every is not None:
            int_arg("eval_every", eval_every, 0)
        check_positive_int("min_nodes", min_nodes)
        if not node_wait > 0:
            raise ValueError(f"node_wait must be > 0 seconds, got {node_wait!r}")
        if round_timeout is not None and not round_timeout > 0:
            raise ValueError(f"round_timeout must be > 0 seconds or None, got {round_timeout!r}")
        if not callable(strategy):
            check_supported(strategy)
        self.strategy, self.module, self.datamodule = strategy, module, datamodule
        self.num_rounds, self.round_timeout, self.min_nodes = num_rounds, round_timeout, min_nodes
        self.log_dir, self.save_path, self.collect_client_state = log_dir, save_path, collect_client_state
        self.eval_every, self.node_wait = eval_every, node_wait
        self.checkpoint_path, self.checkpoint_every, self.resume = checkpoint_path, checkpoint_every, resume
        self.fast_paths = fast_paths
        self.result: Any = None  # the trained ClusteredModule, once the ServerApp has run here
        self.server: FlowerServer | None = None  # the last run's server (metrics, round times)
        self.error: BaseException | None = None  # what stopped the last run's ServerApp here

    def _strategy(self) -> Any:
        from lightning_fedcluster.strategies.federated import FederatedStrategy

        return self.strategy if isinstance(self.strategy, FederatedStrategy) else self.strategy()

    def run_server(self, grid: Grid, context: Context) -> Any:
        """The ServerApp's main: every round, then the trained module (also in ``self.result``)."""
        config = dict(context.run_config)
        strategy = self._strategy()
        timeout = config.get("round-timeout", self.round_timeout)
        module = clustered_module(strategy.plan, built(self.module))
        flower_optimizer(module.models)  # a module without a usable local solver fails here
        check_rule_on_model(strategy.algorithm, module.models[0])
        server = FlowerServer(
            strategy,
            module,
            int(config.get("num-server-rounds", self.num_rounds)),
            round_timeout=None if timeout in (None, 0) else float(timeout),
            min_nodes=int(config.get("min-nodes", self.min_nodes)),
            node_wait=float(config.get("node-wait", self.node_wait)),
            log_dir=config.get("log-dir", self.log_dir) or None,
            collect_client_state=self.collect_client_state,
            save_path=config.get("save-path", self.save_path) or None,
            eval_every=int(config.get("eval-every", self.eval_every or 0)) or None,
            checkpoint_path=config.get("checkpoint-path", self.checkpoint_path) or None,
            checkpoint_every=int(config.get("checkpoint-every", self.checkpoint_every)),
            resume=bool(config.get("resume", self.resume)),
        )
        self.server = server
        try:
            with server_paths(bool(config.get("fast-paths", self.fast_paths))):
                self.result = server.run(grid)
        except BaseException as error:  # Flower's runtime logs it; simulate() raises it again
            self.error = error
            raise
        return self.result

    def server_app(self) -> ServerApp:
        app = ServerApp()

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            self.run_server(grid, context)

        return app

    def node_factory(self) -> NodeFactory:
        """What the ClientApp ships to the nodes: the plan (built on the node from a factory)."""
        from lightning_fedcluster.strategies.federated import FederatedStrategy

        if isinstance(self.strategy, FederatedStrategy):
            plan: Any = plan_of(self.strategy)
        else:
            factory = self.strategy

            def plan() -> TrainingPlan:
                return plan_of(factory())

        if self.datamodule is None:
            raise ValueError("FlowerApps needs a datamodule (or a factory of one) to build the ClientApp")
        return NodeFactory(plan, self.module, self.datamodule)

    def client_app(self) -> ClientApp:
        return client_app(self.node_factory())


def server_paths(fast: bool) -> contextlib.AbstractContextManager:
    """Flower's public paths, or with ``fast`` the fast paths' quick object pulls."""
    if not fast:
        return contextlib.nullcontext()
    from lightning_fedcluster.flower.fast_paths import quick_server_pulls

    return quick_server_pulls()


def node_runtime(factory: NodeFactory, context: Context) -> NodeRuntime:
    """This process's runtime of the context's node, built once per run. A module-level function,
    so that the ClientApp's handlers refer to it by name when Flower's simulation pickles them:
    the runtimes an earlier run in this process left behind never travel with the app."""
    key = (context.run_id, context.node_id)
    for stale in [k for k in _RUNTIMES if k[0] != context.run_id]:
        del _RUNTIMES[stale]  # one run at a time per process
    if key not in _RUNTIMES:
        _RUNTIMES[key] = factory.build(dict(context.node_config))
    return _RUNTIMES[key]


def client_app(factory: NodeFactory) -> ClientApp:
    """The ClientApp: ``query.describe`` (the node's clients), ``train`` (one round of its
    sampled clients), ``query.estimate`` (an estimation pass over its clients: FedSoft),
    ``query.restore`` (its clients' rows of the server's store, when it comes back),
    ``query.export`` (its client store, when the server collects it)."""
    app = ClientApp()

    def runtime(context: Context) -> NodeRuntime:
        return node_runtime(factory, context)

    @app.query("describe")
    def describe(message: Message, context: Context) -> Message:
        node = runtime(context)
        node.check_run(int(message.content["config"]["num-clusters"]))
        return Message(node.describe(), reply_to=message)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return Message(runtime(context).train(message.content, context), reply_to=message)

    @app.query("estimate")
    def estimate(message: Message, context: Context) -> Message:
        return Message(runtime(context).estimate(message.content, context), reply_to=message)

    @app.query("evaluate")
    def evaluate(message: Message, context: Context) -> Message:
        return Message(runtime(context).evaluate(message.content, context), reply_to=message)

    @app.query("restore")
    def restore(message: Message, context: Context) -> Message:
        return Message(runtime(context).restore(message.content, context), reply_to=message)

    @app.query("export")
    def export(message: Message, context: Context) -> Message:
        content: RecordDict = runtime(context).export(message.content, context)
        return Message(content, reply_to=message)

    return app
