"""The waits of ``fedcluster flower supernode``: the SuperNode and its in-process ClientApp runner
wake each other instead of polling, and the SuperNode polls quickly only while messages flow."""

from __future__ import annotations

import threading
import time

import pytest

from lightning_fedcluster.flower.supernode import Pace, parse, signalling


def elapsed(function, *args) -> float:
    start = time.monotonic()
    function(*args)
    return time.monotonic() - start


def test_an_idle_node_waits_as_flower_does_and_a_busy_one_polls_quickly():
    pace = Pace(interval=0.01, busy_window=30.0)
    assert elapsed(pace.sleep, 0.3) >= 0.29  # no task yet: Flower's own wait
    pace.touch()
    pace.replied.clear()
    assert elapsed(pace.sleep, 3.0) < 0.2  # busy: --poll-interval
    pace.last_task -= 31.0  # the busy window has passed
    assert elapsed(pace.sleep, 0.3) >= 0.29


def test_a_pushed_reply_ends_the_supernodes_wait_at_once():
    pace = Pace(interval=5.0, busy_window=0.0)  # a wait of 5 s that only the reply can cut short
    threading.Timer(0.05, pace.touch).start()
    assert elapsed(pace.sleep, 5.0) < 2.0
    assert not pace.replied.is_set()  # consumed: the next wait is a full one again


def test_the_runner_wakes_when_the_supernode_stores_a_message_and_only_then():
    pace = Pace()
    answers = iter([None, 123])  # Flower's _pull_and_store_message: no message, then run 123's
    pull_and_store = signalling(lambda *a, **k: next(answers), pace.stored)
    assert pull_and_store("state") is None and not pace.stored.is_set()
    assert elapsed(pace.wait_for_message, 0.2) >= 0.19  # nothing stored: the fallback poll
    threading.Timer(0.05, pull_and_store).start()
    assert elapsed(pace.wait_for_message, 5.0) < 2.0
    assert not pace.stored.is_set()


def test_own_options_are_checked_and_the_rest_go_to_flower():
    ours, rest = parse(["--poll-interval", "0.05", "--insecure", "--superlink", "127.0.0.1:9092"])
    assert ours.poll_interval == 0.05 and rest == ["--insecure", "--superlink", "127.0.0.1:9092"]


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
