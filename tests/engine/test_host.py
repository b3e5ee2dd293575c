"""engine/host.py: the ``TrainingHost`` and ``FederatedRun`` Protocols list exactly what the engine
and the module's components read of the ClusteredModule and of the strategy (no member unused,
none used undeclared), and the real classes provide every member."""

from __future__ import annotations

import ast
from pathlib import Path

import lightning_fedcluster as lf
from lightning_fedcluster.engine.host import FederatedRun, TrainingHost
from lightning_fedcluster.models import MLPClassifier

PACKAGE = Path(lf.__file__).resolve().parent


def protocol_members(protocol: type) -> set[str]:
    """The attributes, properties and methods a Protocol declares (its own, not ``Protocol``'s)."""
    declared = set(protocol.__dict__.get("__annotations__", {}))
    declared |= {name for name in vars(protocol) if not name.startswith("_")}
    return declared


def used_members(protocol: str, held_as: str, root: Path = PACKAGE) -> dict[str, set[str]]:
    """Attribute -> the files that read it of an object typed ``protocol``: a parameter annotated
    with it (``host.models``), or the attribute ``held_as`` of ``self`` that holds one
    (``self.host.models``)."""
    used: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
            typed = {
                a.arg for a in arguments if a.annotation is not None and protocol in ast.unparse(a.annotation)
            }
            for node in ast.walk(function):
                if not isinstance(node, ast.Attribute):
                    continue
                owner = node.value
                direct = isinstance(owner, ast.Name) and owner.id in typed
                held = (
                    isinstance(owner, ast.Attribute)
                    and owner.attr == held_as
                    and isinstance(owner.value, ast.Name)
                    and owner.value.id == "self"
                )
                if direct or held:
                    used.setdefault(node.attr, set()).add(path.relative_to(root.parent).as_posix())
    return used


def test_the_training_host_lists_exactly_what_is_read_of_it():
    used = used_members("TrainingHost", "host")
    declared = protocol_members(TrainingHost)
    undeclared = {name: sorted(files) for name, files in used.items() if name not in declared}
    assert undeclared == {}, "declare these in TrainingHost (engine/host.py), or stop reading them"
    assert sorted(declared - set(used)) == [], "nothing reads these of a TrainingHost: take them off"


def test_the_federated_run_lists_exactly_what_the_module_reads_of_its_strategy():
    used = used_members("FederatedRun", "federated")
    declared = protocol_members(FederatedRun)
    assert {name for name in used if name not in declared} == set()
    assert sorted(declared - set(used)) == []


def test_the_scan_finds_reads_through_a_parameter_and_through_a_held_host(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        "def f(host: TrainingHost, other: int):\n    return host.models, other.real\n\n"
        "class C:\n    def g(self):\n        return self.host.task, self.other.seed\n"
    )
    used = used_members("TrainingHost", "host", tmp_path / "pkg")
    assert set(used) == {"models", "task"}


def test_the_clustered_module_provides_every_member_of_the_training_host():
    module = lf.ClusteredModule(MLPClassifier(), 2)
    missing = sorted(name for name in protocol_members(TrainingHost) if name not in dir(module))
    assert missing == []


def test_the_federated_strategy_provides_every_member_of_the_federated_run():
    strategy = lf.FedRCStrategy(2)
    missing = sorted(name for name in protocol_members(FederatedRun) if not hasattr(strategy, name))
    assert missing == []
