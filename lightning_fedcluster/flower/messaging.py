"""How the Flower server talks to its nodes: wait for them to connect (saying so), send messages
and collect the replies (polling a deployment's SuperLink with a short backoff instead of
Flower's fixed sleeps), and read a node's error."""

from __future__ import annotations

import logging
import math
import time

from flwr.app import Message
from flwr.serverapp import Grid

log = logging.getLogger("lightning_fedcluster.flower")

REPLY_POLL_CAP = 0.02  # seconds between the server's pulls of a round's replies, at most


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


def node_error(reply: Message) -> str:
    return reply.error.reason if reply.has_error() else ""


def exchange(grid: Grid, messages: list[Message], timeout: float | None) -> list[tuple[int, Message]]:
    """Send ``messages`` and return (node, reply) pairs. The node comes from the message a reply
    answers: the SuperLink itself signs the error reply of a node that went away."""
    if not messages:
        return []
    if is_deployment(grid):
        replies = poll_replies(grid, messages, timeout)
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


def poll_replies(grid: Grid, messages: list[Message], timeout: float | None) -> list[Message]:
    """``send_and_receive`` with pulls 5 ms apart, growing to ``REPLY_POLL_CAP``: a deployed round
    is not rounded up to Flower's 3 s pull interval, nor to a long backoff (the replies of a round
    come a few hundred ms after it is sent, when a doubling wait would already be that long)."""
    pending = set(grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    wait = 0.005
    while pending:
        found = list(grid.pull_messages(pending))
        replies.extend(found)
        pending -= {reply.metadata.reply_to_message_id for reply in found}
        if not pending or (deadline is not None and time.monotonic() > deadline):
            break
        time.sleep(wait)
        wait = min(2 * wait, REPLY_POLL_CAP)
    return replies
