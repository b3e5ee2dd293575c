"""The opt-in fast paths: their contract with the installed flwr (every internal they patch or
call exists with the parameters they pass, per supported release), the SuperNode's waits they
shorten, and that they are the only module of the package touching flwr's or Lightning's private
names besides Lightning's (``lightning_internals.py``) and Ray's loopback switch."""

from __future__ import annotations

import ast
import importlib
import threading
import time
from pathlib import Path

import pytest

from lightning_fedcluster.flower import fast_paths
from lightning_fedcluster.flower.fast_paths import Pace, signalling

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_fedcluster"
# The modules allowed to use private names of flwr, Lightning or Ray, each with its contract test.
OPT_IN = {
    "flower/fast_paths.py": "tests/flower/test_fast_paths.py",
    "lightning_internals.py": "tests/test_lightning_internals.py",
    "flower/ray_network.py": "tests/flower/test_ray_network.py",
}
LIBRARIES = ("flwr", "lightning", "ray", "pytorch_lightning")


def elapsed(function, *args) -> float:
    start = time.monotonic()
    function(*args)
    return time.monotonic() - start


@pytest.mark.parametrize("release", fast_paths.SUPPORTED_FLWR)
def test_every_flwr_internal_the_fast_paths_use_exists_in_the_supported_release(release):
    installed = fast_paths.flwr_version()
    if not installed.startswith(release + "."):
        pytest.skip(f"flwr {installed} is installed, not {release}")
    assert fast_paths.internals_problems() == []
    fast_paths.check_internals()


def test_the_installed_flwr_is_a_supported_release():
    assert fast_paths.flwr_version().rsplit(".", 1)[0] in fast_paths.SUPPORTED_FLWR


def test_a_missing_internal_fails_naming_the_flwr_version_and_the_name(monkeypatch):
    loop = importlib.import_module(fast_paths.SUPERNODE_LOOP)
    monkeypatch.delattr(loop, "_pull_and_store_message")
    with pytest.raises(RuntimeError) as caught:
        fast_paths.speed_up_supernode(Pace())
    message = str(caught.value)
    assert f"flwr {fast_paths.flwr_version()}" in message
    assert "flwr.supernode.start_client_internal._pull_and_store_message is missing" in message
    assert "without the fast paths" in message


def test_a_changed_signature_fails_naming_the_parameter(monkeypatch):
    pulls = importlib.import_module(fast_paths.OBJECT_PULLS)
    monkeypatch.setattr(pulls, "pull_objects", lambda object_ids, pull_object_fn: {})
    assert fast_paths.internals_problems() == [
        f"{fast_paths.OBJECT_PULLS}.pull_objects takes no initial_backoff, backoff_cap"
    ]


def test_speeding_up_a_supernode_patches_its_loop_and_only_then(monkeypatch):
    loop = importlib.import_module(fast_paths.SUPERNODE_LOOP)
    for name in ("time", "pull_objects", "_pull_and_store_message"):
        monkeypatch.setattr(loop, name, getattr(loop, name))  # restored after the test
    original = loop._pull_and_store_message
    pace = Pace(interval=0.01)
    fast_paths.speed_up_supernode(pace)
    assert loop.time.sleep == pace.sleep and loop.time.monotonic is time.monotonic
    assert loop.pull_objects.keywords == {"initial_backoff": 0.005, "backoff_cap": 0.02}
    assert loop._pull_and_store_message.__wrapped__ is original


def test_the_servers_quick_pulls_are_restored_after_the_run():
    grid = importlib.import_module(fast_paths.SERVER_GRID)
    original = grid.pull_objects
    with fast_paths.quick_server_pulls():
        assert grid.pull_objects.keywords["initial_backoff"] == fast_paths.INITIAL_BACKOFF
    assert grid.pull_objects is original


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


def own_private_names(sources: list[str]) -> set[str]:
    """The ``_``-prefixed names the package defines itself (attributes it assigns, functions,
    classes, module-level names)."""
    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {name for name in names if name.startswith("_")}


NAME_ACCESS = ("getattr", "setattr", "hasattr", "delattr")
STDLIB_AND_TORCH = ("os", "sys", "torch", "nn")  # their private names are outside this check


def private_uses(source: str, own: set[str]) -> list[str]:
    """``_``-prefixed names of flwr, Lightning or Ray that ``source`` imports, names in strings
    (``"ray._private..."``, ``getattr(x, "_trainer")``), or reads as attributes that the package
    does not define itself (``self._trainer``: Lightning's; ``parser._actions``: argparse's)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
            parts = node.module.split(".") + [alias.name for alias in node.names]
            found += [
                f"import {node.module}.{p}" for p in parts if p.startswith("_") and not p.startswith("__")
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = node.value.replace("(", " ").split()
            found += [w for w in words if w.startswith(LIBRARIES) and "._" in w]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in NAME_ACCESS
            and len(node.args) > 1
        ):
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("_"):
                found += (
                    [ast.unparse(node)] if name.value not in own and not name.value.startswith("__") else []
                )
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            outside = isinstance(root, ast.Name) and root.id in STDLIB_AND_TORCH
            if node.attr not in own and not outside:
                found.append(ast.unparse(node))
    return found


def lightning_private_names() -> set[str]:
    """The ``_``-prefixed names of the Lightning classes the package subclasses (their methods and
    their instances' attributes): a name the package defines too is an override of Lightning's."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    objects = [pl.LightningModule(), pl.LightningDataModule(), pl.Callback(), DDPStrategy()]
    names = {name for obj in objects for name in [*dir(type(obj)), *vars(obj)]}
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_private_names_of_flwr_and_lightning_are_used_only_in_the_opt_in_modules():
    paths = sorted(PACKAGE.rglob("*.py"))
    # Names the opt-in modules assign (``loop._pull_and_store_message = ...``) are flwr's, not ours.
    outside = [path for path in paths if path.relative_to(PACKAGE).as_posix() not in OPT_IN]
    own = own_private_names([path.read_text() for path in outside]) - lightning_private_names()
    users = {}
    for path in paths:
        relative = path.relative_to(PACKAGE).as_posix()
        uses = private_uses(path.read_text(), own)
        if uses and relative not in OPT_IN:
            users[relative] = uses
    assert users == {}, "move these into an opt-in module with a contract test (docs/development.md)"
    for module, test in OPT_IN.items():
        assert (PACKAGE / module).is_file() and (PACKAGE.parent / test).is_file(), (module, test)


def test_the_check_finds_what_it_looks_for():
    own = {"_rule"}
    assert private_uses("from lightning.pytorch.strategies.launchers import _Launcher\n", own)
    assert private_uses("x = self._trainer\n", own) and private_uses(
        "getattr(model, '_trainer', None)\n", own
    )
    assert private_uses("loop._pull_and_store_message = f\n", own)
    assert private_uses("CONSTANTS = 'ray._private.ray_constants'\n", own)
    assert not private_uses("self._rule = rule\nfrom flwr.app import Message\nos._exit(2)\n", own)
