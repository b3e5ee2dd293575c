"""No import cycle: the package's module import graph, read from the source with `ast`.

Every import counts, wherever it is written: module level, under ``if TYPE_CHECKING:`` and inside
functions, since a cycle hidden behind a type-only or deferred import is still a cycle in the
design. ``from package import name`` is an edge to ``package.name`` when that is a module of the
package, else to ``package`` (its ``__init__``); the implicit import of parent packages is not
an edge (as in grimp / import-linter).

`CYCLE_FREE` names the part of the package that must have no cycle: any strongly connected
component of the whole graph (more than one module, or a module importing itself) that contains a
module under it fails. Set it to ``"lightning_fedcluster"`` to check the whole package.

Run as a script to print every cycle of the whole package: ``python tests/test_import_graph.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "lightning_fedcluster"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
CYCLE_FREE = "lightning_fedcluster"


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package is named by its ``__init__``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join([package, *parts])] = path
    return modules


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a (possibly relative) ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (all imports in the file, at any depth)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, is_package, node)
                for alias in node.names:
                    child = f"{source}.{alias.name}"
                    targets.append(child if child in modules else source)
            graph[name].update(target for target in targets if target in modules)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return sorted(components)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: components of more than one module, or a module importing itself."""
    return [c for c in strongly_connected(graph) if len(c) > 1 or c[0] in graph[c[0]]]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_graph_sees_every_kind_of_import(tmp_path):
    """The reader counts module-level, TYPE_CHECKING, function-level and relative imports."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    )
    (package / "b.py").write_text("def f():\n    from pkg import c\n    return c\n")
    (package / "c.py").write_text("import pkg.sub.d\n")
    (package / "sub" / "__init__.py").write_text("from . import d\n")
    (package / "sub" / "d.py").write_text("from ..a import x\nfrom .. import b\n")
    graph = import_graph(module_files(package, "pkg"))
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.sub.d"}
    assert graph["pkg.sub"] == {"pkg.sub.d"}
    assert graph["pkg.sub.d"] == {"pkg.a", "pkg.b"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"]]


def test_no_import_cycle():
    graph = import_graph(module_files())
    assert len(graph) > 50, "the package's modules were not found"
    found = [c for c in cycles(graph) if any(_under(m, CYCLE_FREE) for m in c)]
    assert not found, f"import cycles touching {CYCLE_FREE}:\n" + "\n".join(" -> ".join(c) for c in found)


if __name__ == "__main__":
    everything = cycles(import_graph(module_files()))
    print(f"{len(everything)} import cycle(s) (strongly connected components) in {PACKAGE}")
    for component in everything:
        print(f"- {len(component)} modules: " + ", ".join(component))
    sys.exit(1 if everything else 0)
