"""Opt-in speed-ups of a Flower deployment that patch flwr internals (flwr 1.41-1.42).

This is the one module of the library that touches flwr's ``_``-prefixed names or replaces
functions inside flwr. It is off by default: ``fedcluster flower supernode --fast-paths`` turns
it on for a SuperNode, the run config ``fast-paths = true`` (``FlowerApps(fast_paths=True)``) for
the ServerApp. Without it a deployment waits on Flower's fixed intervals: the SuperNode polls the
SuperLink every 3 s while idle and checks for its ClientApp's reply every 0.5 s, and a message's
objects that have not arrived yet are asked for again after 1 s, then 2 s, ...
(``benchmarks/results/flower_vs_lightning.md`` measures both). With it:

- the SuperNode's loop (``flwr.supernode.start_client_internal``) gets a ``time`` module whose
  ``sleep`` lasts at most ``--poll-interval`` while messages flow and ends as soon as the
  in-process runner has pushed a reply (``Pace``); its ``pull_objects`` asks again after 5 ms
  (``quick``); its ``_pull_and_store_message`` wakes the runner when it stored a message
  (``signalling``);
- the runner pulls a task as ``flwr-clientapp`` does, with the quick object pulls
  (``pull_task_input``, which sets the message's ``_message_id`` as flwr's own does);
- the ServerApp's SuperLink grid (``flwr.superlink.grid.http_grid``) pulls a reply's objects
  quickly too (``quick_server_pulls``).

``INTERNALS`` names every flwr internal used here with the parameters it is called with;
``check_internals`` runs before any patch and fails naming the installed flwr version and the
missing name (``tests/flower/test_fast_paths.py`` checks it per supported release).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

SUPPORTED_FLWR = ("1.41", "1.42")
INITIAL_BACKOFF, BACKOFF_CAP = 0.005, 0.02  # the objects of a message follow it within tens of ms

SUPERNODE_LOOP = "flwr.supernode.start_client_internal"
OBJECT_PULLS = "flwr.supercore.inflatable.inflatable_utils"
SERVER_GRID = "flwr.superlink.grid.http_grid"
# (module, name, parameters it must accept): every flwr internal this module reads or replaces.
INTERNALS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (SUPERNODE_LOOP, "time", ()),
    (SUPERNODE_LOOP, "pull_objects", ()),
    (
        SUPERNODE_LOOP,
        "_pull_and_store_message",
        (
            "state",
            "object_store",
            "node_config",
            "receive",
            "get_run",
            "get_fab",
            "pull_object",
            "confirm_message_received",
            "trusted_entities",
        ),
    ),  # fmt: skip
    (OBJECT_PULLS, "pull_objects", ("object_ids", "pull_object_fn", "initial_backoff", "backoff_cap")),
    (
        OBJECT_PULLS,
        "pull_and_inflate_object_from_tree",
        (
            "object_tree",
            "pull_object_fn",
            "confirm_object_received_fn",
            "return_type",
            "initial_backoff",
            "backoff_cap",
        ),
    ),  # fmt: skip
    (SERVER_GRID, "pull_objects", ()),
    ("flwr.app", "Metadata", ("message_id",)),  # its instances keep the id in __dict__["_message_id"]
)


def flwr_version() -> str:
    from flwr import __version__

    return __version__


def internals_problems() -> list[str]:
    """What of ``INTERNALS`` the installed flwr lacks (empty: the fast paths can run)."""
    problems = []
    for module_name, name, parameters in INTERNALS:
        try:
            target = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            problems.append(f"{module_name}.{name} is missing")
            continue
        if parameters:
            accepted = inspect.signature(target).parameters
            missing = [p for p in parameters if p not in accepted]
            if missing:
                problems.append(f"{module_name}.{name} takes no {', '.join(missing)}")
    if not problems and "_message_id" not in vars(_metadata()):
        problems.append("flwr.app.Metadata keeps no _message_id")
    return problems


def _metadata() -> Any:
    from flwr.app import Metadata

    return Metadata(
        run_id=0, message_id="", src_node_id=0, dst_node_id=0, reply_to_message_id="", group_id="",
        created_at=0.0, ttl=0.0, message_type="train",
    )  # fmt: skip


def check_internals() -> None:
    """Fail, naming the flwr version, where the installed flwr lacks an internal the fast paths use."""
    problems = internals_problems()
    if problems:
        raise RuntimeError(
            f"the Flower fast paths (--fast-paths, run config fast-paths) patch flwr internals of flwr "
            f"{' and '.join(SUPPORTED_FLWR)}, but the installed flwr {flwr_version()} differs: "
            f"{'; '.join(problems)}. Run without the fast paths (Flower's public paths)"
        )


def quick(name: str = "pull_objects", cap: float = BACKOFF_CAP) -> Any:
    """Flower's ``pull_objects`` (or ``pull_and_inflate_object_from_tree``) with a 5 ms first
    retry, growing to ``cap`` seconds, and Flower's overall limits."""
    module = importlib.import_module(OBJECT_PULLS)
    return functools.partial(getattr(module, name), initial_backoff=INITIAL_BACKOFF, backoff_cap=cap)


@contextlib.contextmanager
def quick_pulls(module: ModuleType, name: str = "pull_objects", cap: float = BACKOFF_CAP) -> Iterator[None]:
    """Within the block, ``module.<name>`` (the pull function that module calls) retries
    quickly; restored afterwards."""
    original = getattr(module, name)
    setattr(module, name, quick(name, cap))
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def quick_server_pulls() -> Iterator[None]:
    """The ServerApp's side: its SuperLink grid pulls a reply's objects quickly."""
    check_internals()
    with quick_pulls(importlib.import_module(SERVER_GRID)):
        yield


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


def speed_up_supernode(pace: Pace) -> None:
    """Patch this process's SuperNode loop: ``pace``'s waits, quick object pulls, and a signal to
    the runner when a message is stored."""
    check_internals()
    loop = importlib.import_module(SUPERNODE_LOOP)
    loop.time = pace.clock()  # Flower's fixed 3 s / 0.5 s waits, while busy
    loop.pull_objects = quick()  # the message's objects from the SuperLink
    loop._pull_and_store_message = signalling(loop._pull_and_store_message, pace.stored)


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

    task = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id = task.task_id, task.run.run_id
    TaskIdentity.node_id = task.context.node_id
    context, run, fab = context_from_proto(task.context), run_from_proto(task.run), fab_from_proto(task.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("the SuperNode's Runtime API sent no message for this task")
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = quick("pull_and_inflate_object_from_tree")(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as flwr-clientapp sets it
    return message, context, run, fab
