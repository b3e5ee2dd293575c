"""The shell commands the documentation tells users to type: ``fedcluster`` commands parse (with
``--print_config``, so nothing trains), benchmark commands name flags their scripts take, and
pip commands name extras that pyproject.toml defines. The Flower deployment commands run in
tests/flower/test_docs_deployment.py; the README's test command runs in .ci/run."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from lightning_fedcluster.cli import run_cli
from tests.docs.markdown_blocks import ROOT, pages

TEXT = "\n".join(page.read_text() for page in pages())


def commands(program: str) -> list[str]:
    """Distinct ``program ...`` commands, inline (`...`) or on a line of a shell block."""
    inline = re.findall(rf"`({program} [^`]*)`", TEXT)
    lines = re.findall(rf"^(?:.*&& |(?:[A-Z_]+=\S+ )+)?({program}(?: [^\n#]*)?)$", TEXT, flags=re.M)
    return sorted({c.strip() for c in inline + lines})


# `fedcluster flower ...` is not the LightningCLI: tests/flower/test_docs_deployment.py runs those.
FEDCLUSTER = [c for c in commands("fedcluster") if not c.startswith("fedcluster flower")]


def test_the_commands_are_found():
    assert "fedcluster fit" in FEDCLUSTER
    assert "fedcluster fit --config examples/fedrc_fashion_mnist.yaml" in FEDCLUSTER


@pytest.mark.parametrize("command", FEDCLUSTER)
def test_a_fedcluster_command_parses(command, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the commands name examples/ relative to the repository
    monkeypatch.setattr(sys, "argv", ["fedcluster"])
    args = shlex.split(command)[1:]
    with pytest.raises(SystemExit) as printed:
        run_cli([*args, *([] if "--print_config" in args else ["--print_config"])])
    assert printed.value.code in (0, None), capsys.readouterr().err[-2000:]
    assert "class_path: lightning_fedcluster" in capsys.readouterr().out


@pytest.mark.parametrize("command", commands("python benchmarks/[a-z0-9_]+.py"))
def test_a_benchmark_command_names_flags_its_script_takes(command):
    script, *args = shlex.split(command)[1:]
    assert (ROOT / script).is_file(), script
    done = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    for flag in (a for a in args if a.startswith("--")):
        assert flag in done.stdout, f"{command}: {script} --help does not list {flag}"


def test_pip_commands_name_extras_that_exist():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = re.findall(r"(?:lightning-fedcluster|-e \")\.?\[([\w,]+)\]", TEXT)
    assert named
    for group in named:
        assert set(group.split(",")) <= extras, group
