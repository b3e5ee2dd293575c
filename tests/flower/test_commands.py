"""flower/commands.py: ``fedcluster flower new DIR | supernode ...`` dispatches to the template
writer and the SuperNode, prints the usage on help, and answers bad arguments with exit status 2
(a failed ``new``: 1, with the reason)."""

from __future__ import annotations

import pytest

from lightning_fedcluster.flower import supernode, template
from lightning_fedcluster.flower.commands import USAGE, main


def test_help_prints_the_usage_and_no_command_is_an_error(capsys):
    assert main(["--help"]) == 0
    assert capsys.readouterr().out == USAGE
    assert main([]) == 2
    assert capsys.readouterr().out == USAGE


@pytest.mark.parametrize("argv", [["new"], ["new", "-x"], ["new", "a", "b"], ["nonsense"]])
def test_flower_commands_refuse_bad_arguments(argv, capsys):
    assert main(argv) == 2
    assert "usage" in capsys.readouterr().err


def test_new_writes_the_app_and_reports_a_refusal_with_status_1(monkeypatch, capsys):
    written = []
    monkeypatch.setattr(template, "write_app", lambda directory: written.append(directory) or ["a/x.py"])
    assert main(["new", "a"]) == 0
    assert written == ["a"] and "wrote a/x.py; next: cd a && ./certificates.sh" in capsys.readouterr().out

    def refuse(directory):
        raise FileExistsError(f"{directory} already has fedcluster_app.py")

    monkeypatch.setattr(template, "write_app", refuse)
    assert main(["new", "a"]) == 1
    assert capsys.readouterr().err == "fedcluster flower new: a already has fedcluster_app.py\n"


def test_supernode_passes_the_remaining_arguments_on(monkeypatch):
    seen = []
    monkeypatch.setattr(supernode, "main", seen.append)
    assert main(["supernode", "--insecure", "--poll-interval", "0.5"]) == 0
    assert seen == [["--insecure", "--poll-interval", "0.5"]]
