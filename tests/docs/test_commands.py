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
    sub = args[:1] if args and not args[0].startswith("-") else []  # e.g. `authors_comparison.py run`
    done = subprocess.run([sys.executable, str(ROOT / script), *sub, "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)  # fmt: skip
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


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def readme_line(prefix: str) -> tuple[int, str]:
    """The README's first line starting with ``prefix`` and its index (as .ci/run reads them)."""
    lines = (ROOT / "README.md").read_text().split("\n")
    found = [(i, line) for i, line in enumerate(lines) if line.startswith(prefix)]
    assert found, f"README.md has no line starting with {prefix!r}"
    return found[0]


def test_the_readmes_cpu_install_keeps_a_cpu_torch_through_the_test_command():
    """The CPU advice installs torch and torchvision together from PyTorch's CPU index, before the
    test command; the test command cannot replace them (no upgrade flag), and no requirement of the
    package or of the installed distributions it depends on excludes a ``+cpu`` build of the
    installed releases: pip's default upgrade strategy (only-if-needed) then keeps them. Measured
    with ``pip install --dry-run --report``: after torch alone (2.13.0+cpu) the test command
    installs torch 2.15.0, triton and 15 nvidia-* wheels; after torch and torchvision, none."""
    from importlib import metadata

    from packaging.requirements import Requirement

    cpu_at, cpu = readme_line("pip install torch")
    test_at, test = readme_line('pip install -e ".[dev')
    words = shlex.split(cpu)
    assert {"torch", "torchvision"} <= set(words), cpu
    assert words[words.index("--index-url") + 1] == CPU_INDEX, cpu
    assert cpu_at < test_at, "the CPU install must come before the test command"
    install = shlex.split(test.split("&&")[0])
    assert not {"-U", "--upgrade", "--force-reinstall", "--upgrade-strategy"} & set(install), test

    cpu_builds = {name: metadata.version(name).split("+")[0] + "+cpu" for name in ("torch", "torchvision")}
    pending = ["lightning-fedcluster"]
    extras = {"lightning-fedcluster": {"dev", "flower", "vision", "hf"}}
    seen: set[str] = set()
    checked: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # an extra's package that this environment lacks (e.g. flwr on Python 3.10)
        for text in requires:
            requirement = Requirement(text)
            wanted = extras.get(name, set())
            if requirement.marker and not any(
                requirement.marker.evaluate({"extra": extra}) for extra in (wanted or {""})
            ):
                continue
            key = requirement.name.lower()
            if key in cpu_builds:
                checked.add(key)
                assert requirement.specifier.contains(cpu_builds[key], prereleases=True), (
                    f"{name} requires {requirement}, which a CPU build {cpu_builds[key]} does not satisfy: "
                    "pip would replace the README's CPU torch"
                )
            elif key != name:
                pending.append(key)
    assert checked == {"torch", "torchvision"}, "the requirements on torch and torchvision were found"
