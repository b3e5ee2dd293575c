"""The tests mirror the package file by file, as Lightning's do: ``tests/<path>/test_<module>.py``
tests ``lightning_fedcluster/<path>/<module>.py`` (``tests/<path>/test_init.py``: the package's
``__init__.py``), so the test of a module is found without searching. Both directions are checked:
a misplaced test file fails here, and so does a module without its test file (an ``__init__.py``
that only re-exports needs none)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "lightning_fedcluster"

# Test files about no single module, each with its reason.
CROSS_CUTTING = {
    "tests/test_layout.py": "this check of the layout",
    "tests/test_import_graph.py": "the import graph of the whole package",
    "tests/test_examples.py": "the configurations in examples/, run through the CLI",
    "tests/flower/test_new_algorithm.py": "the docs' one-file algorithm on Flower's grid",
    "tests/flower/test_docs_deployment.py": "the docs' deployment text, run verbatim on localhost",
    "tests/flower/test_deployment_faults.py": "the fault suite: a localhost deployment killed and poisoned",
    "tests/flower/test_hugging_face_deployment.py": "SuperNodes loading Hugging Face partitions, deployed",
    "tests/flower/test_round_numbers.py": "one round numbering: the console, TensorBoard, Flower's run files",
}
CROSS_CUTTING_FOLDERS = {
    "tests/docs": "the documentation site: its pages, links and commands",
    "tests/helpers": "helpers and scripts the tests import or run, not tests",
}
# Not mirrored yet, each with what it waits for; the list only shrinks.
PENDING: dict[str, str] = {}
# Modules without their test file yet, each with what it waits for; the list only shrinks.
UNTESTED_MODULES: dict[str, str] = {}


def collected_files(root: Path) -> list[Path]:
    """Every file pytest collects under ``root/tests`` (its default patterns), relative to ``root``."""
    tests = root / "tests"
    found = set(tests.rglob("test_*.py")) | set(tests.rglob("*_test.py"))
    return sorted(path.relative_to(root) for path in found)


def mirrored_module(test_file: Path, root: Path, package: str = PACKAGE) -> Path | None:
    """The package file that ``test_file`` (``tests/<path>/test_<name>.py``) mirrors, if it exists."""
    if not test_file.name.startswith("test_"):
        return None
    folder = root / package / Path(*test_file.parts[1:-1])
    name = test_file.stem.removeprefix("test_")
    module = folder / ("__init__.py" if name == "init" else f"{name}.py")
    return module if module.is_file() else None


def _allowed(test_file: Path) -> bool:
    posix = test_file.as_posix()
    return (
        posix in CROSS_CUTTING
        or posix in PENDING
        or any(posix.startswith(folder + "/") for folder in CROSS_CUTTING_FOLDERS)
    )


def misplaced(root: Path, package: str = PACKAGE) -> list[str]:
    """Test files outside the allow-lists that mirror no module of the package."""
    return [
        path.as_posix()
        for path in collected_files(root)
        if not _allowed(path) and mirrored_module(path, root, package) is None
    ]


def mirror_test_file(module: Path, root: Path, package: str = PACKAGE) -> Path:
    """The test file (relative to ``root``) that mirrors ``module`` (a path under ``root``)."""
    relative = module.relative_to(root / package)
    name = "init" if module.name == "__init__.py" else module.stem
    return Path("tests", *relative.parts[:-1], f"test_{name}.py")


def only_reexports(module: Path) -> bool:
    """Whether ``module`` holds nothing to test: imports, ``__all__`` and a docstring only."""
    body = ast.parse(module.read_text(encoding="utf-8")).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return all(isinstance(node, (ast.Import, ast.ImportFrom)) or assigns_all(node) for node in body)


def assigns_all(node: ast.stmt) -> bool:
    """``__all__ = [...]`` (annotated or not)."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)):
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [getattr(target, "id", None) for target in targets] == ["__all__"]


def untested(root: Path, package: str = PACKAGE, allowed: dict[str, str] | None = None) -> list[str]:
    """Modules of the package outside ``allowed`` without their mirrored test file, re-exporting
    ``__init__.py`` files aside."""
    allowed = UNTESTED_MODULES if allowed is None else allowed
    return [
        module.relative_to(root).as_posix()
        for module in sorted((root / package).rglob("*.py"))
        if module.relative_to(root).as_posix() not in allowed
        and not (module.name == "__init__.py" and only_reexports(module))
        and not (root / mirror_test_file(module, root, package)).is_file()
    ]


def test_every_test_file_mirrors_a_module():
    assert misplaced(ROOT) == [], (
        "name each test file after the module it tests: tests/<path>/test_<module>.py for "
        f"{PACKAGE}/<path>/<module>.py (test_init.py for a package's __init__.py)"
    )


def test_every_module_has_its_test_file():
    assert untested(ROOT) == [], (
        "give each module its test file: tests/<path>/test_<module>.py for "
        f"{PACKAGE}/<path>/<module>.py (test_init.py for a package's __init__.py that does more "
        "than re-export)"
    )


def test_the_untested_allow_list_only_names_modules_still_without_tests():
    for entry in UNTESTED_MODULES:
        module = ROOT / entry
        assert module.is_file(), f"{entry} is gone: take it off UNTESTED_MODULES"
        assert not (ROOT / mirror_test_file(module, ROOT)).is_file(), f"{entry} has tests now: take it off"


def test_the_allow_lists_name_files_that_exist():
    for entry in [*CROSS_CUTTING, *PENDING]:
        assert (ROOT / entry).is_file(), f"{entry} is gone: take it off the allow-list"
    for folder in CROSS_CUTTING_FOLDERS:
        assert (ROOT / folder).is_dir(), f"{folder} is gone: take it off the allow-list"


def test_every_test_folder_is_a_package():
    """The tests import each other as ``tests.<path>`` (``from tests.conftest import ...``)."""
    folders = {(ROOT / path).parent for path in collected_files(ROOT)}
    missing = [f.relative_to(ROOT).as_posix() for f in sorted(folders) if not (f / "__init__.py").is_file()]
    assert missing == []


def test_a_misplaced_test_file_is_reported(tmp_path):
    for path in (
        "pkg/__init__.py", "pkg/engine/__init__.py", "pkg/engine/round.py", "pkg/engine/rules/__init__.py",
        "tests/engine/test_round.py", "tests/engine/test_init.py", "tests/engine/test_rules.py",
        "tests/engine/test_rounds.py", "tests/test_engine.py", "tests/engine/round_test.py",
        "tests/engine/helpers.py",
    ):  # fmt: skip
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    # A package's tests are tests/<package>/test_init.py, not a file named after the package; a
    # subpackage's are tests/<path>/<subpackage>/test_init.py.
    assert misplaced(tmp_path, "pkg") == [
        "tests/engine/round_test.py",
        "tests/engine/test_rounds.py",
        "tests/engine/test_rules.py",
        "tests/test_engine.py",
    ]
    assert (
        mirrored_module(Path("tests/engine/test_init.py"), tmp_path, "pkg")
        == tmp_path / "pkg/engine/__init__.py"
    )


def test_a_module_without_its_test_file_is_reported(tmp_path):
    files = {
        "pkg/__init__.py": '"""Docs."""\nfrom pkg.round import run\n\n__all__ = ["run"]\n',
        "pkg/engine/__init__.py": "from pkg.engine.round import run\nVERSION = 1\n",  # more than re-exports
        "pkg/engine/round.py": "def run(): ...\n",
        "pkg/engine/server.py": "def serve(): ...\n",
        "pkg/engine/plan.py": "",
        "pkg/flower/__init__.py": "try:\n    import flwr\nexcept ImportError:\n    raise\n",
        "tests/engine/test_round.py": "",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert untested(tmp_path, "pkg", allowed={"pkg/engine/plan.py": "waits"}) == [
        "pkg/engine/__init__.py",
        "pkg/engine/server.py",
        "pkg/flower/__init__.py",
    ]
    assert mirror_test_file(tmp_path / "pkg/engine/__init__.py", tmp_path, "pkg") == Path(
        "tests/engine/test_init.py"
    )
    (tmp_path / "tests/engine/test_init.py").write_text("")
    (tmp_path / "tests/engine/test_server.py").write_text("")
    assert untested(tmp_path, "pkg", allowed={"pkg/engine/plan.py": "waits"}) == ["pkg/flower/__init__.py"]
