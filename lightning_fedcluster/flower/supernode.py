"""``fedcluster flower supernode``: Flower's SuperNode whose ClientApp stays loaded between messages.

A stock ``flower-supernode`` starts a new ``flwr-clientapp`` process for every message (a Python
start that imports torch and Lightning, seconds per round and node). This command runs the same
SuperNode (``flower-supernode``'s options, with ``--isolation process``) and, in the same process,
a long-running ClientApp runner: it takes the node's tasks from the SuperNode's Runtime API, as
Flower's SuperExec does, and runs them with ``flwr-clientapp``'s own steps
(``flwr.supernode.runtime.run_clientapp``: pull the task, push the reply and the context) and the
app loaded once per FAB. So the library, the user's model and each node's clients stay in memory
across rounds (``apps._RUNTIMES``). The runner asks for a task every ``--poll-interval`` seconds
while messages flow (the last one less than ``--busy-window`` seconds ago), every second when idle.

By default nothing of Flower is patched, so the SuperNode keeps Flower's own waits (a 3 s poll of
the SuperLink while idle, 0.5 s checks for the reply, 1 s before asking again for objects that
have not arrived). ``--fast-paths`` shortens them by patching flwr internals
(``flower/fast_paths.py``, checked against the installed flwr before it patches anything): the
SuperNode then polls every ``--poll-interval`` seconds while busy, and the two sides wake each
other instead of polling.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("lightning_fedcluster.flower")
IDLE_POLL = 1.0  # seconds between the runner's requests for a task while no message flows
PULL_WAIT = 120.0  # seconds a task may take to receive its message before the runner gives it up


@dataclass
class Polling:
    """The runner's wait between its requests for a task: ``interval`` within ``busy_window``
    seconds of the last task, ``IDLE_POLL`` otherwise."""

    interval: float = 0.02
    busy_window: float = 30.0
    last_task: float = -math.inf  # idle until the first task

    def wait(self) -> None:
        busy = time.monotonic() - self.last_task < self.busy_window
        time.sleep(self.interval if busy else IDLE_POLL)

    def touch(self) -> None:
        self.last_task = time.monotonic()


class ClientAppRunner:
    """Runs the ClientApp tasks of one SuperNode in this process (a long-running SuperExec).

    ``wait`` is its wait between requests for a task, ``done`` is called after each task, and
    ``pull`` takes a task's message, context, run and FAB (flwr-clientapp's ``pull_task_input``,
    or the fast paths' quicker one). A task whose message has not arrived after ``pull_wait``
    seconds is given up as failed (``pull_within``): the runner takes one task at a time, so a
    message that never arrives must not hold every later one back."""

    def __init__(
        self,
        runtime_api_address: str,
        root_certificates: bytes | None = None,
        *,
        wait: Callable[[], None],
        done: Callable[[], None],
        pull: Callable[[Any], tuple[Any, Any, Any, Any]],
        pull_wait: float = PULL_WAIT,
    ) -> None:
        self.address, self.root_certificates = runtime_api_address, root_certificates
        self.wait, self.done, self.pull, self.pull_wait = wait, done, pull, pull_wait
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
                self.done()
                continue
            self.wait()

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
            message, context, run, fab = pull_within(self.pull, client, self.pull_wait)
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


def pull_within(pull: Callable[[Any], Any], client: Any, seconds: float) -> Any:
    """``pull(client)``, or a TimeoutError after ``seconds``. Flower's SuperNode creates a task
    before it receives the message's objects, and when the run ends meanwhile (a SuperLink that
    restarted) it drops the message but leaves the task, whose pull then retries for up to two
    hours: that pull is left behind (its client is closed after the task) and the task fails."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = pull(client)
        except BaseException as error:  # handed to the runner's thread below
            result["error"] = error

    thread = threading.Thread(target=run, name="fedcluster-pull", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(
            f"the task's message did not arrive within {seconds:g} s (its run may have ended while the "
            "SuperNode received it): the task is given up"
        )
    if "error" in result:
        raise result["error"]
    return result["value"]


def forget_apps(app_dirs: list[Path]) -> None:
    """Take the modules loaded from ``app_dirs`` out of ``sys.modules`` and the directories out of
    ``sys.path``, so that the next app's modules of the same names are imported from its own
    directory. The ClientApps already loaded keep working: their functions hold their modules."""
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and any(Path(origin).absolute().is_relative_to(d) for d in app_dirs):
            del sys.modules[name]
    sys.path[:] = [entry for entry in sys.path if not entry or Path(entry).absolute() not in app_dirs]


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
    parser.add_argument(
        "--fast-paths", action="store_true", help="shorten Flower's waits by patching flwr internals"
    )
    parser.add_argument(
        "--pull-wait", type=float, default=PULL_WAIT, help="seconds a task may take to receive its message"
    )
    ours, rest = parser.parse_known_args(argv)
    if not ours.poll_interval > 0 or ours.busy_window < 0:
        parser.error("--poll-interval must be > 0 seconds and --busy-window >= 0 seconds")
    if not ours.pull_wait > 0:
        parser.error("--pull-wait must be > 0 seconds (raise it for messages that take long to download)")
    return ours, rest


def node_options(rest: list[str]) -> argparse.Namespace:
    """The ``flower-supernode`` options this command reads itself (with Flower's defaults); Flower's
    SuperNode parses and checks them all again when it starts."""
    from flwr.common.constant import ISOLATION_MODE_PROCESS
    from flwr.supercore.constant import (
        SUPERLINK_DEFAULT_CLIENT_ADDRESS,
        SUPERNODE_UVICORN_DEFAULT_PORT,
        UVICORN_DEFAULT_HOST,
    )

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--superlink", default=SUPERLINK_DEFAULT_CLIENT_ADDRESS)
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--root-certificates")
    parser.add_argument("--ssl-certfile")
    parser.add_argument("--ssl-ca-certfile")
    parser.add_argument("--auth-supernode-private-key")
    parser.add_argument("--isolation", default=ISOLATION_MODE_PROCESS)
    parser.add_argument("--host", default=UVICORN_DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=SUPERNODE_UVICORN_DEFAULT_PORT)
    return parser.parse_known_args(rest)[0]


def main(argv: list[str]) -> None:
    """Start the SuperNode (``flower-supernode`` with ``argv``) and its ClientApp runner."""
    from flwr.common.constant import ISOLATION_MODE_PROCESS
    from flwr.supernode.cli import flower_supernode

    if "-h" in argv or "--help" in argv:
        print(__doc__)
        print(
            "Own options: --poll-interval SECONDS (0.02), --busy-window SECONDS (30), --fast-paths, "
            f"--pull-wait SECONDS ({PULL_WAIT:g}).\n"
        )
        sys.argv = ["flower-supernode", "--help"]
        flower_supernode()  # prints Flower's options and exits
    ours, rest = parse(argv)
    node = node_options(rest)
    if node.isolation != ISOLATION_MODE_PROCESS:
        raise SystemExit(
            f"fedcluster flower supernode runs the ClientApp itself (--isolation process); drop "
            f"--isolation {node.isolation} or use flower-supernode"
        )
    root_certificates = None
    if node.ssl_certfile:
        ca = node.ssl_ca_certfile or node.root_certificates
        root_certificates = open(ca, "rb").read() if ca else None  # noqa: SIM115 - read at once
    from lightning_fedcluster.flower.reporting import console_logging
    from lightning_fedcluster.flower.supernode_checks import explain_activation_failures, watch_tls

    console_logging()
    watch_tls(node.superlink, insecure=bool(node.insecure))
    explain_activation_failures(node.auth_supernode_private_key)
    address = f"{node.host}:{node.port}"
    if ours.fast_paths:
        from lightning_fedcluster.flower import fast_paths

        pace = fast_paths.Pace(ours.poll_interval, ours.busy_window)
        fast_paths.speed_up_supernode(pace)
        waits: dict[str, Any] = {"wait": lambda: pace.wait_for_message(IDLE_POLL), "done": pace.touch}
        runner = ClientAppRunner(
            address, root_certificates, **waits, pull=fast_paths.pull_task_input, pull_wait=ours.pull_wait
        )
    else:
        from flwr.supernode.runtime.run_clientapp import pull_task_input

        polling = Polling(ours.poll_interval, ours.busy_window)
        runner = ClientAppRunner(
            address, root_certificates, wait=polling.wait, done=polling.touch, pull=pull_task_input,
            pull_wait=ours.pull_wait,
        )  # fmt: skip
    threading.Thread(target=runner.serve, name="fedcluster-clientapp", daemon=True).start()
    sys.argv = ["flower-supernode", *rest, "--isolation", ISOLATION_MODE_PROCESS]
    flower_supernode()
