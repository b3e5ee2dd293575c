"""An in-process Flower ``Grid`` for fast tests: it hands each message straight to the
ClientApp of its node (one ``Context`` per node, kept across rounds, as a SuperNode keeps it;
pushed messages in a background thread, so a node slow to answer holds only its own reply back),
turns a ClientApp exception into an error reply as Flower does, and can make a node fail:
``"silent"`` (a disconnect: no reply) or ``"unavailable"`` (the error reply the SuperLink itself
signs when a node stops sending heartbeats)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

RUN_IDS = itertools.count(1)


class LocalGrid(Grid):
    def __init__(
        self,
        client_app: Callable[[Message, Context], Message],
        node_configs: list[dict],
        fault: Callable[[int, Message], str | None] | None = None,
    ) -> None:
        self.app = client_app
        self.run_id = next(RUN_IDS)
        self.contexts = {
            100 + i: Context(
                run_id=self.run_id, node_id=100 + i, node_config=config, state=RecordDict(), run_config={}
            )
            for i, config in enumerate(node_configs)
        }
        self.fault = fault or (lambda node, message: None)
        self._run = None
        self.lock = threading.Lock()
        self.ready: list[Message] = []  # replies to pushed messages, not pulled yet

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Hand the messages to their nodes' ClientApps one after the other in a background thread,
        as a SuperLink does while the server goes on (a node slow to start holds its reply back);
        ``pull_messages`` returns the replies that are ready."""
        messages = list(messages)
        ids = [self.set_id(number, message) for number, message in enumerate(messages)]

        def answer_all() -> None:
            for message in messages:
                reply = self.answer(message)
                with self.lock:
                    if reply is not None:
                        self.ready.append(reply)

        threading.Thread(target=answer_all, daemon=True).start()
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        wanted = set(message_ids)
        with self.lock:
            found = [r for r in self.ready if r.metadata.reply_to_message_id in wanted]
            self.ready = [r for r in self.ready if r.metadata.reply_to_message_id not in wanted]
        return found

    def set_id(self, number: int, message: Message) -> str:
        message.metadata.__dict__["_message_id"] = f"{self.run_id}.{id(message)}.{number}"  # as a push does
        return message.metadata.message_id

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for number, message in enumerate(messages):
            self.set_id(number, message)
            reply = self.answer(message)
            if reply is not None:
                replies.append(reply)
        return replies

    def answer(self, message: Message) -> Message | None:
        """The node's reply to ``message`` (None: a silent node)."""
        node = message.metadata.dst_node_id
        fault = self.fault(node, message)
        if fault == "silent":
            return None
        if fault == "unavailable":
            reply = Message(Error(code=3, reason="node unavailable"), reply_to=message)
            reply.metadata.__dict__["_src_node_id"] = 0  # SUPERLINK_NODE_ID
            return reply
        try:
            return self.app(message, self.contexts[node])
        except Exception as error:  # Flower reports a ClientApp's exception as an error reply
            return Message(Error(code=0, reason=f"{type(error).__name__}: {error}"), reply_to=message)


def run_local(apps, node_configs: list[dict], fault=None, replies=None):
    """Run ``apps``'s server on a LocalGrid with one node per config; the trained module.
    ``replies``: wraps the ClientApp (``app -> app``), e.g. to corrupt what a node sends back."""
    client_app = apps.client_app()
    grid = LocalGrid(client_app if replies is None else replies(client_app), node_configs, fault)
    context = Context(run_id=grid.run_id, node_id=0, node_config={}, state=RecordDict(), run_config={})
    return apps.run_server(grid, context), grid


def partitions(n: int) -> list[dict]:
    return [{"partition-id": i, "num-partitions": n} for i in range(n)]
