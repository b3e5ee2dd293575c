"""``fedcluster flower supernode``: Flower's SuperNode whose ClientApp stays loaded between messages.

A stock ``flower-supernode`` starts a new ``flwr-clientapp`` process for every message (a Python
start that imports torch and Lightning, seconds per round and node) and polls the SuperLink
every 3 s when idle. This command runs the same SuperNode (``flower-supernode``'s options, with
``--isolation process``) and, in the same process, a long-running ClientApp runner: it takes
the node's tasks from the SuperNode's Runtime API, as Flower's SuperExec does, and runs them
with the app loaded once per FAB. So the library, the user's model and each node's clients stay
in memory across rounds (``apps._RUNTIMES``), and while messages flow (the last one less than
``--busy-window`` seconds ago) the SuperNode polls the SuperLink every ``--poll-interval``
seconds. Within the process the two sides wake each other instead of polling: the runner asks
for a task when the SuperNode has stored a message, and the SuperNode sends the reply as soon as
the runner has pushed it (a 1 s poll stays as a fallback), so an idle node's CPU goes to the
SuperLink traffic and the training, not to HTTP requests to itself.

Built on flwr 1.41-1.42's runtime (the versions the ``flower`` extra allows):
``flwr.supernode.runtime.run_clientapp`` gives the task's pull and push steps.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

log = logging.getLogger("lightning_fedcluster.flower")


@dataclass
class Pace:
    """Flower's SuperNode waits with ``time.sleep``: 3 s between polls when idle, 0.5 s while a
    reply is pending. Within ``busy_window`` seconds of the last task it waits ``interval``."""

    interval: float = 0.02
    busy_window: float = 30.0
    last_task: float = -math.inf  # idle until the first task
    replied: threading.Event = field(default_factory=threading.Event)  # the runner pushed a reply
    stored: threading.Event = field(default_factory=threading.Event)  # the SuperNode stored a message

    def sleep(self, seconds: float) -> None:
        """The SuperNode's wait: cut short when the runner pushes a reply."""
        if time.monotonic() - self.last_task < self.busy_window:
            seconds = min(seconds, self.interval)
        if self.replied.wait(seconds):
            self.replied.clear()

    def touch(self) -> None:
        self.last_task = time.monotonic()
        self.replied.set()

    def wait_for_message(self, seconds: float) -> None:
        """The runner's wait for a task: until the SuperNode stores a message (or ``seconds``)."""
        if self.stored.wait(seconds):
            self.stored.clear()

    def clock(self) -> Any:
        """A stand-in for the ``time`` module inside Flower's SuperNode loop."""
        names = {n: getattr(time, n) for n in dir(time) if not n.startswith("_")}
        return SimpleNamespace(**{**names, "sleep": self.sleep})


class ClientAppRunner:
    """Runs the ClientApp tasks of one SuperNode in this process (a long-running SuperExec)."""

    def __init__(self, runtime_api_address: str, pace: Pace, root_certificates: bytes | None = None) -> None:
        self.address, self.pace, self.root_certificates = runtime_api_address, pace, root_certificates
        self.apps: dict[str, Any] = {}  # FAB hash -> the loaded ClientApp
        self.app_dirs: list[Path] = []  # where the loaded apps were installed
        self.tasks = 0

    def client(self, *interceptors: Any) -> Any:
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient

        return RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=self.root_certificates is None,
            root_certificates=self.root_certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec"), *interceptors],
            retry_invoker=make_simple_http_retry_invoker(),
        )

    def serve(self) -> None:
        """Take and run tasks until the process ends."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        client = self.client()
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        while True:
            try:
                response = client.AcquireTask(request)
            except Exception as error:  # the SuperNode's Runtime API is not up yet, or restarting
                log.debug("acquiring a task failed: %s", error)
                time.sleep(0.5)
                continue
            if response.HasField("task") and response.token:
                self.run_task(response.token)
                self.pace.touch()
                continue
            self.pace.wait_for_message(1.0)

    def load(self, fab: Any, run: Any) -> Any:
        """The run's ClientApp, installed from its FAB and imported once per FAB hash. Flower's
        loader reuses a module already in ``sys.modules``, so the modules of the apps loaded
        before (all named e.g. ``fedcluster_app``) are forgotten first: each FAB runs its own code."""
        if fab.hash_str not in self.apps:
            from flwr.cli.install import install_from_fab
            from flwr.clientapp.utils import get_load_client_app_fn
            from flwr.common.config import get_project_dir

            install_from_fab(fab.content, skip_prompt=True)
            forget_apps(self.app_dirs)
            self.app_dirs.append(get_project_dir(run.fab_id, run.fab_version, fab.hash_str).absolute())
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            self.apps[fab.hash_str] = load(run.fab_id, run.fab_version, fab.hash_str)
        return self.apps[fab.hash_str]

    def run_task(self, token: str) -> None:
        """One message, as ``flwr-clientapp`` runs it: pull the message, context, run and FAB,
        call the ClientApp, push the reply and the context (an exception becomes an error reply)."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor
        from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

        started = time.perf_counter()
        client = self.client(RuntimeTokenHttpInterceptor(token))
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        message = context = reply = None
        status, details = SubStatus.FAILED, "ClientApp task failed"
        try:
            message, context, run, fab = pull_task_input(client)
            pulled = time.perf_counter()
            reply = self.load(fab, run)(message=message, context=context)
            log.debug("task: pull %.3f s, app %.3f s", pulled - started, time.perf_counter() - pulled)
            status, details = SubStatus.COMPLETED, ""
        except Exception as error:  # reported to the server as the node's error reply
            log.exception("the ClientApp raised an exception")
            details = f"{type(error)}:<'{error}'>"
            if message is not None:
                reply = Message(
                    Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message
                )
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
                push_task_output(client=client, context=context, sub_status=status, details=details)
            finally:
                heartbeat.stop()
                client.close()
                self.tasks += 1
                log.debug("task done in %.3f s", time.perf_counter() - started)


def forget_apps(app_dirs: list[Path]) -> None:
    """Take the modules loaded from ``app_dirs`` out of ``sys.modules`` and the directories out of
    ``sys.path``, so that the next app's modules of the same names are imported from its own
    directory. The ClientApps already loaded keep working: their functions hold their modules."""
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and any(Path(origin).absolute().is_relative_to(d) for d in app_dirs):
            del sys.modules[name]
    sys.path[:] = [entry for entry in sys.path if not entry or Path(entry).absolute() not in app_dirs]


def pull_task_input(client: Any) -> tuple[Any, Any, Any, Any]:
    """``flwr-clientapp``'s first step (flwr's ``run_clientapp.pull_task_input``): the task's
    context, run and FAB, then its message, whose objects the SuperNode may still be fetching
    (asked again after 5 ms, not Flower's 1 s)."""
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.task_identity import TaskIdentity

    from lightning_fedcluster.flower.pacing import quick

    t0 = time.perf_counter()
    task = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id = task.task_id, task.run.run_id
    TaskIdentity.node_id = task.context.node_id
    context, run, fab = context_from_proto(task.context), run_from_proto(task.run), fab_from_proto(task.fab)
    t1 = time.perf_counter()
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("the SuperNode's Runtime API sent no message for this task")
    t2 = time.perf_counter()
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = quick("pull_and_inflate_object_from_tree")(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as flwr-clientapp sets it
    log.debug("pull: input %.3f, messages %.3f, objects %.3f", t1 - t0, t2 - t1, time.perf_counter() - t2)
    return message, context, run, fab


def signalling(pull_and_store: Any, stored: threading.Event) -> Any:
    """Flower's ``_pull_and_store_message`` (the SuperNode pulls a message from the SuperLink and
    stores it, with its objects, as a task for its ClientApp), then wakes the runner when it
    stored one (it returns the message's run ID; None when there was none)."""

    @functools.wraps(pull_and_store)
    def pull_store_and_signal(*args: Any, **kwargs: Any) -> Any:
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:
            stored.set()
        return run_id

    return pull_store_and_signal


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This command's own options; the rest go to ``flower-supernode``."""
    parser = argparse.ArgumentParser(
        prog="fedcluster flower supernode",
        description="flower-supernode (same options) with the ClientApp kept loaded between messages",
        add_help=False,
    )
    parser.add_argument("--poll-interval", type=float, default=0.02, help="seconds between polls while busy")
    parser.add_argument(
        "--busy-window", type=float, default=30.0, help="seconds a node stays busy after a task"
    )
    ours, rest = parser.parse_known_args(argv)
    if not ours.poll_interval > 0 or ours.busy_window < 0:
        parser.error("--poll-interval must be > 0 seconds and --busy-window >= 0 seconds")
    return ours, rest


def main(argv: list[str]) -> None:
    """Start the SuperNode (``flower-supernode`` with ``argv``) and its ClientApp runner."""
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        print("Own options: --poll-interval SECONDS (0.02), --busy-window SECONDS (30).\n")
    ours, rest = parse(argv)
    import importlib

    from flwr.common.constant import ISOLATION_MODE_PROCESS

    # The modules (``flwr.supernode.cli`` re-exports a function under the module's name).
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    start_client_internal = importlib.import_module("flwr.supernode.start_client_internal")

    flower_args = cli._parse_args_run_supernode().parse_args(rest)  # validates, prints --help
    if flower_args.isolation != ISOLATION_MODE_PROCESS and "--isolation" in " ".join(rest):
        raise SystemExit(
            f"fedcluster flower supernode runs the ClientApp itself (--isolation process); drop "
            f"--isolation {flower_args.isolation} or use flower-supernode"
        )
    root_certificates = None
    if flower_args.ssl_certfile:
        ca = flower_args.ssl_ca_certfile or flower_args.root_certificates
        root_certificates = open(ca, "rb").read() if ca else None  # noqa: SIM115 - read at once
    from lightning_fedcluster.flower.pacing import quick
    from lightning_fedcluster.flower.reporting import console_logging
    from lightning_fedcluster.flower.supernode_checks import explain_activation_failures, watch_tls

    console_logging()
    watch_tls(flower_args.superlink, insecure=bool(flower_args.insecure))
    explain_activation_failures(
        importlib.import_module("flwr.supernode.fleet_http_connection"),
        flower_args.auth_supernode_private_key,
    )
    pace = Pace(ours.poll_interval, ours.busy_window)
    start_client_internal.time = pace.clock()  # Flower's fixed 3 s / 0.5 s waits, while busy
    start_client_internal.pull_objects = quick()  # the message's objects from the SuperLink
    pull_and_store = start_client_internal._pull_and_store_message
    start_client_internal._pull_and_store_message = signalling(pull_and_store, pace.stored)
    runner = ClientAppRunner(f"{flower_args.host}:{flower_args.port}", pace, root_certificates)
    threading.Thread(target=runner.serve, name="fedcluster-clientapp", daemon=True).start()
    sys.argv = ["flower-supernode", *rest, "--isolation", ISOLATION_MODE_PROCESS]
    cli.flower_supernode()
