"""How the Flower server talks to its nodes: wait for them to connect (saying so), send messages
and collect the replies (polling a deployment's SuperLink with a short backoff instead of
Flower's fixed sleeps), and read a node's error."""

from __future__ import annotations

import logging
import math
import os
import time

from flwr.app import Message
from flwr.serverapp import Grid

log = logging.getLogger("lightning_fedcluster.flower")

REPLY_POLL_CAP = 0.02  # seconds between the server's pulls of a round's replies, at most
WAIT_POLL_CAP = 0.2  # the same while waiting for nodes that start first (the describe step)


def wait_for_nodes(grid: Grid, min_nodes: int, node_wait: float, every: float = 5.0) -> list[int]:
    """The connected nodes once ``min_nodes`` are; while fewer are, a line every ``every`` seconds
    (and whenever the count changes) says how many and how long is left. After ``node_wait``
    seconds a TimeoutError names both counts (Flower puts it in the run's status)."""
    deadline = time.monotonic() + node_wait
    said: tuple[int, float] | None = None
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= min_nodes:
            return nodes
        left = deadline - time.monotonic()
        if left < 0:
            raise TimeoutError(
                f"{len(nodes)} of min_nodes={min_nodes} Flower nodes connected within {node_wait:g} s "
                "(run config node-wait): start the missing SuperNodes or lower min-nodes"
            )
        if said is None or said[0] != len(nodes) or said[1] - left >= every:
            log.info("%d of %d nodes connected, waiting (%d s left)", len(nodes), min_nodes, math.ceil(left))
            said = (len(nodes), left)
        time.sleep(0.2)


def undescribed_error(missing: int, nodes: int, node_wait: float) -> TimeoutError:
    """The describe step's end when ``missing`` of ``nodes`` nodes have not answered within
    ``node_wait`` seconds: the wait, the machine's load and the remedy, by name."""
    return TimeoutError(
        f"{missing} of {nodes} Flower node(s) did not describe their clients within "
        f"node_wait={node_wait:g} s ({machine_load()}): a node answers once its ClientApp has started "
        "(imported its packages, built its data and model), which takes longer on a busy machine. Raise "
        "node_wait: run config node-wait (flwr run . --run-config 'node-wait=900'), or "
        "simulate(..., node_wait=900)"
    )


def machine_load() -> str:
    """The 1-minute load average and the CPU count, in words (where the system reports a load)."""
    cpus = os.cpu_count() or 1
    try:
        return f"load {os.getloadavg()[0]:.1f} on {cpus} CPU cores"
    except (AttributeError, OSError):  # no load average on this system
        return f"{cpus} CPU cores, load not reported"


def node_error(reply: Message) -> str:
    return reply.error.reason if reply.has_error() else ""


def exchange(
    grid: Grid, messages: list[Message], timeout: float | None, waiting_for: str | None = None
) -> list[tuple[int, Message]]:
    """Send ``messages`` and return (node, reply) pairs. The node comes from the message a reply
    answers: the SuperLink itself signs the error reply of a node that went away. With
    ``waiting_for`` (what the replies are, e.g. "described their clients") the server says every
    few seconds how many nodes have replied and how long is left (``poll_replies``)."""
    if not messages:
        return []
    if waiting_for is not None or is_deployment(grid):
        replies = poll_replies(grid, messages, timeout, waiting_for)
    else:
        replies = list(grid.send_and_receive(messages, timeout=timeout))
    node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}  # ids set when pushed
    return [(node_of.get(r.metadata.reply_to_message_id, r.metadata.src_node_id), r) for r in replies]


def is_deployment(grid: Grid) -> bool:
    """A SuperLink's grid (``flwr run`` on a deployment), whose ``send_and_receive`` waits 3 s
    between its pulls: ``exchange`` polls it itself, through the public ``Grid.push_messages`` and
    ``Grid.pull_messages``."""
    try:
        from flwr.superlink.grid.http_grid import HttpGrid
    except ImportError:  # pragma: no cover - another flwr layout: its own send_and_receive
        return False
    return isinstance(grid, HttpGrid)


def poll_replies(
    grid: Grid,
    messages: list[Message],
    timeout: float | None,
    waiting_for: str | None = None,
    every: float = 5.0,
) -> list[Message]:
    """``send_and_receive`` with pulls 5 ms apart, growing to ``REPLY_POLL_CAP``: a deployed round
    is not rounded up to Flower's 3 s pull interval, nor to a long backoff (the replies of a round
    come a few hundred ms after it is sent, when a doubling wait would already be that long).
    With ``waiting_for``, once the wait has lasted ``every`` seconds, a line every ``every`` seconds
    (and whenever the count changes) says how many nodes have replied and how long is left; pulls
    then grow to ``WAIT_POLL_CAP``."""
    pending = set(grid.push_messages(messages))
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    cap = REPLY_POLL_CAP if waiting_for is None else WAIT_POLL_CAP
    replies: list[Message] = []
    wait = 0.005
    said: tuple[int, float] | None = None  # (replies, when) of the last line
    while pending:
        found = list(grid.pull_messages(pending))
        replies.extend(found)
        pending -= {reply.metadata.reply_to_message_id for reply in found}
        now = time.monotonic()
        if not pending or (deadline is not None and now > deadline):
            break
        if (
            waiting_for is not None
            and now - start >= every
            and (said is None or said[0] != len(replies) or now - said[1] >= every)
        ):
            left = "" if deadline is None else f" ({math.ceil(deadline - now)} s left)"
            log.info("%d of %d nodes %s, waiting%s", len(replies), len(messages), waiting_for, left)
            said = (len(replies), now)
        time.sleep(wait)
        wait = min(2 * wait, cap)
    return replies
