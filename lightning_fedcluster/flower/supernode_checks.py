"""What ``fedcluster flower supernode`` says when it cannot join, instead of Flower's retries and
generic exit: a TLS mismatch with the SuperLink names TLS as the cause, and a refused activation
says that the node's key is not registered (or still active from a SuperNode that just stopped).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time

log = logging.getLogger("lightning_fedcluster.flower")
TLS_MISMATCH_EXIT = 2
ACTIVATION_FAILED = "Failed to activate SuperNode"


def speaks_tls(host: str, port: int, timeout: float = 5.0) -> bool | None:
    """Whether the server at ``host:port`` answers a TLS handshake (its certificate unchecked: only
    the protocol matters here); None when nothing accepts a connection there yet."""
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with raw:
        try:
            with context.wrap_socket(raw, server_hostname=host):
                return True
        except (TimeoutError, ssl.SSLError, ConnectionError):
            return False


def tls_mismatch(address: str, insecure: bool) -> str | None:
    """The error to show when this SuperNode's TLS setting does not match the SuperLink's at
    ``address`` (host:port); None when they match or the SuperLink is not up yet."""
    host, _, port = address.rpartition(":")
    tls = speaks_tls(host.strip("[]") or "127.0.0.1", int(port))
    if tls is None or tls != insecure:
        return None
    if insecure:
        return (
            f"the SuperLink at {address} uses TLS but this SuperNode was started with --insecure: start it "
            "with --root-certificates <the CA certificate that signed the SuperLink's> instead"
        )
    return (
        f"the SuperLink at {address} does not use TLS (it was started with --insecure) but this SuperNode "
        "expects TLS: start both with TLS, or both with --insecure"
    )


def watch_tls(address: str, insecure: bool, interval: float = 2.0) -> threading.Thread:
    """Check the TLS settings in the background once the SuperLink accepts connections (Flower's
    SuperNode would retry a mismatch forever): on a mismatch, say so and end the process."""

    def watch() -> None:
        while True:
            host, _, port = address.rpartition(":")
            if speaks_tls(host.strip("[]") or "127.0.0.1", int(port)) is not None:
                break
            time.sleep(interval)
        problem = tls_mismatch(address, insecure)
        if problem is not None:
            log.error("%s", problem)
            for handler in [*log.handlers, *logging.getLogger().handlers]:
                handler.flush()
            os._exit(TLS_MISMATCH_EXIT)

    thread = threading.Thread(target=watch, name="fedcluster-tls-check", daemon=True)
    thread.start()
    return thread


def activation_hint(message: str, key: str | None) -> str:
    """Flower's message for a SuperNode the SuperLink would not activate, with its likely causes."""
    if ACTIVATION_FAILED not in message:
        return message
    if key is None:
        return message + "\nThe SuperLink refused to activate this SuperNode."
    return (
        f"{message}\nThe SuperLink refused the key {key}: it is not registered there (register its public "
        f"key on the SuperLink: flwr supernode register {key}.pub <federation>), or a SuperNode with this "
        "key stopped less than a heartbeat interval ago and is still active there (start it again a minute "
        "later)"
    )


class ActivationHint(logging.Filter):
    """A filter on Flower's logger that adds ``activation_hint``'s causes to the exit message of a
    SuperNode the SuperLink refused (Flower logs it before it exits)."""

    def __init__(self, key: str | None) -> None:
        super().__init__()
        self.key = key

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and ACTIVATION_FAILED in record.msg:
            record.msg = activation_hint(record.msg, self.key)
        return True


def explain_activation_failures(key: str | None) -> ActivationHint:
    """Make Flower's SuperNode say, when it is refused, which key and why (``activation_hint``)."""
    hint = ActivationHint(key)
    logging.getLogger("flwr").addFilter(hint)
    return hint
