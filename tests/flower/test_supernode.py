"""``fedcluster flower supernode``: its options, the runner's polls (quick only while messages
flow), Flower left unpatched by default, and each FAB's own code."""

from __future__ import annotations

import time

import pytest

from lightning_fedcluster.flower.supernode import IDLE_POLL, Polling, node_options, parse


def elapsed(function, *args) -> float:
    start = time.monotonic()
    function(*args)
    return time.monotonic() - start


def test_the_runner_polls_quickly_only_while_messages_flow():
    polling = Polling(interval=0.01, busy_window=30.0)
    assert elapsed(polling.wait) >= IDLE_POLL - 0.01  # no task yet: the idle poll
    polling.touch()
    assert elapsed(polling.wait) < 0.2  # busy: --poll-interval
    polling.last_task -= 31.0  # the busy window has passed
    assert elapsed(polling.wait) >= IDLE_POLL - 0.01


def test_own_options_are_checked_and_the_rest_go_to_flower():
    ours, rest = parse(["--poll-interval", "0.05", "--insecure", "--superlink", "127.0.0.1:9092"])
    assert ours.poll_interval == 0.05 and rest == ["--insecure", "--superlink", "127.0.0.1:9092"]
    assert not ours.fast_paths, "Flower's public paths unless asked"
    assert parse(["--fast-paths", "--insecure"])[0].fast_paths


def test_the_flower_options_it_reads_have_flowers_defaults():
    from flwr.supercore.constant import SUPERLINK_DEFAULT_CLIENT_ADDRESS

    node = node_options(["--insecure", "--port", "9096", "--node-config", "partition-id=0"])
    assert node.insecure and node.port == 9096 and node.host == "127.0.0.1"
    assert node.superlink == SUPERLINK_DEFAULT_CLIENT_ADDRESS and node.isolation == "process"
    assert node_options(["--root-certificates", "ca.crt"]).root_certificates == "ca.crt"


def test_by_default_nothing_of_flower_is_patched():
    """The default command uses flwr-clientapp's own pull and leaves Flower's SuperNode loop as it is
    (the patches live in flower/fast_paths.py, applied only with --fast-paths)."""
    import ast
    import inspect

    from lightning_fedcluster.flower import supernode

    source = inspect.getsource(supernode)
    private = [
        ast.unparse(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr.startswith("_")  # __dict__ too
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]  # fmt: skip
    assert private == []
    assert "start_client_internal" not in source


def test_a_poll_interval_of_zero_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        parse(["--poll-interval", "0"])
    assert "--poll-interval must be > 0" in capsys.readouterr().err


def test_an_app_loaded_after_another_of_the_same_module_name_runs_its_own_code(tmp_path, monkeypatch):
    """Flower's loader reuses a module already imported: ``forget_apps`` drops the modules (and the
    sys.path entries) of the apps loaded before, so a node serves each FAB its own code."""
    import importlib
    import sys

    from lightning_fedcluster.flower.supernode import forget_apps

    first, second = tmp_path / "first", tmp_path / "second"
    for directory, width in ((first, 128), (second, 32)):
        directory.mkdir()
        (directory / "fedcluster_fault_app.py").write_text(f"WIDTH = {width}\n")
    monkeypatch.setattr(sys, "path", [str(first), *sys.path])
    assert importlib.import_module("fedcluster_fault_app").WIDTH == 128
    loaded = sys.modules["fedcluster_fault_app"]
    forget_apps([first.absolute()])
    assert "fedcluster_fault_app" not in sys.modules and str(first) not in sys.path
    sys.path.insert(0, str(second))
    assert importlib.import_module("fedcluster_fault_app").WIDTH == 32
    assert loaded.WIDTH == 128, "the app loaded before keeps its own module"
    del sys.modules["fedcluster_fault_app"]


class QuietHeartbeat:
    def __init__(self, *args) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class ClosedClient:
    def close(self) -> None: ...


def test_a_task_whose_message_never_arrives_is_given_up_and_the_next_task_runs(monkeypatch):
    """Flower's SuperNode leaves a task behind when the run ends while it receives the message (a
    SuperLink that restarted): the task's pull retries for hours. The runner gives it up after
    ``pull_wait`` (reported failed, no reply) and runs the next task."""
    import threading

    import flwr.supercore.heartbeat as heartbeat
    import flwr.supernode.runtime.run_clientapp as run_clientapp
    from flwr.common.constant import SubStatus

    from lightning_fedcluster.flower.supernode import ClientAppRunner

    outputs: list[tuple] = []
    monkeypatch.setattr(heartbeat, "HeartbeatSender", QuietHeartbeat)
    monkeypatch.setattr(heartbeat, "make_task_heartbeat_fn_http", lambda client: None)
    monkeypatch.setattr(run_clientapp, "push_message", lambda client, reply, context: outputs.append(reply))
    monkeypatch.setattr(
        run_clientapp, "push_task_output",
        lambda client, context, sub_status, details: outputs.append((sub_status, details)),
    )  # fmt: skip
    never = threading.Event()
    pulls = iter([lambda: never.wait(60), lambda: ("message", "context", "run", "fab")])
    runner = ClientAppRunner("127.0.0.1:1", wait=lambda: None, done=lambda: None,
                             pull=lambda client: next(pulls)(), pull_wait=0.5)  # fmt: skip
    monkeypatch.setattr(runner, "client", lambda *interceptors: ClosedClient())
    monkeypatch.setattr(runner, "load", lambda fab, run: lambda message, context: f"reply to {message}")
    try:
        assert elapsed(runner.run_task, "orphan") < 5
        ((status, details),) = outputs
        assert status == SubStatus.FAILED and "did not arrive within 0.5 s" in details
        runner.run_task("next")
        assert outputs[1:] == ["reply to message", (SubStatus.COMPLETED, "")]
    finally:
        never.set()
    with pytest.raises(SystemExit):
        parse(["--pull-wait", "0"])
    assert parse(["--pull-wait", "600"])[0].pull_wait == 600.0
