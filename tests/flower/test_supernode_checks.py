"""What ``fedcluster flower supernode`` says when it cannot join: a TLS mismatch with the
SuperLink is named (Flower's SuperNode retries it forever), and a refused activation says the
key is not registered (Flower says only that it could not connect)."""

from __future__ import annotations

import logging
import socket
import ssl
import subprocess
import threading

import pytest

from lightning_fedcluster.flower.supernode_checks import (
    activation_hint,
    explain_activation_failures,
    speaks_tls,
    tls_mismatch,
)


def serve_once(handle) -> int:
    """A one-connection server on localhost; its port."""
    server = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with server:
            connection, _ = server.accept()
            with connection:
                handle(connection)

    threading.Thread(target=run, daemon=True).start()
    return server.getsockname()[1]


def plain_http(connection) -> None:
    connection.recv(1024)
    connection.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=localhost", "-days", "1", "-keyout", str(root / "key.pem"),
         "-out", str(root / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return root / "cert.pem", root / "key.pem"


def tls_server(certificate):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)

    def handle(connection) -> None:
        try:
            with context.wrap_socket(connection, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    return handle


def test_the_probe_tells_a_tls_superlink_from_a_plain_one_and_from_none(certificate):
    assert speaks_tls("127.0.0.1", serve_once(tls_server(certificate))) is True
    assert speaks_tls("127.0.0.1", serve_once(plain_http)) is False
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    assert speaks_tls("127.0.0.1", port) is None


def test_a_mismatch_names_tls_and_the_fix(certificate):
    tls_port = serve_once(tls_server(certificate))
    message = tls_mismatch(f"127.0.0.1:{tls_port}", insecure=True)
    assert "uses TLS but this SuperNode was started with --insecure" in message
    assert "--root-certificates" in message
    plain_port = serve_once(plain_http)
    assert "does not use TLS" in tls_mismatch(f"127.0.0.1:{plain_port}", insecure=False)
    assert tls_mismatch(f"127.0.0.1:{serve_once(plain_http)}", insecure=True) is None, (
        "both plain: no mismatch"
    )


def test_a_refused_activation_says_the_key_is_not_registered():
    flower = "Failed to initialize the connection to the SuperLink.\n[code: 3] Failed to activate SuperNode."
    hinted = activation_hint(flower, "keys/supernode-2")
    assert hinted.startswith(flower) and "it is not registered there" in hinted
    assert "flwr supernode register keys/supernode-2.pub <federation>" in hinted
    assert activation_hint("Connection refused", "keys/supernode-2") == "Connection refused"
    from flwr.supercore.exit import ExitCode
    from flwr.supercore.logger import log

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    flower_log = logging.getLogger("flwr")
    flower_log.addHandler(handler)
    hint = explain_activation_failures("keys/supernode-2")
    try:
        log(logging.ERROR, f"Exit Code: {ExitCode.SUPERNODE_CONNECTION_ERROR}\n{flower}")  # as flwr_exit logs
        log(logging.INFO, "Starting Flower SuperNode")
    finally:
        flower_log.removeFilter(hint)
        flower_log.removeHandler(handler)
    assert "it is not registered there" in lines[0] and lines[0].startswith("Exit Code:")
    assert lines[1] == "Starting Flower SuperNode"
