"""``fedcluster flower new``: the app it writes passes Flower's own checks (its config, and the
``server`` / ``client`` attributes Flower finds without importing the module), lists no
dependencies for Flower's per-run install, and is never written over an existing app."""

from __future__ import annotations

import subprocess

from lightning_fedcluster.flower.commands import main


def test_flower_new_writes_an_app_that_flowers_checks_accept(tmp_path, capsys):
    from flwr.cli.config_utils import load_and_validate
    from flwr.supercore.object_ref import validate

    app = tmp_path / "my_app"
    assert main(["new", str(app)]) == 0
    assert "certificates.sh" in capsys.readouterr().out
    config, warnings = load_and_validate(app / "pyproject.toml", check_module=False)
    assert config["project"]["name"] == "my-app" and config["project"]["dependencies"] == []
    components = config["tool"]["flwr"]["app"]["components"]
    for reference in (components["serverapp"], components["clientapp"]):
        assert validate(reference, check_module=True, project_dir=app) == (True, None), reference
    assert config["tool"]["flwr"]["app"]["config"]["min-nodes"] == 2
    assert config["tool"]["flwr"]["app"]["config"]["fast-paths"] is False  # Flower's public paths
    # The certificates script makes a CA-signed certificate for localhost and two node key pairs.
    subprocess.run(["bash", str(app / "certificates.sh")], check=True, capture_output=True, timeout=120)
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", "certificates/ca.crt", "certificates/server.pem"],
        cwd=app, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stderr
    assert sorted(p.name for p in (app / "keys").iterdir()) == [
        "supernode-0", "supernode-0.pub", "supernode-1", "supernode-1.pub",
    ]  # fmt: skip


def test_one_line_assignment_is_what_flower_rejects(tmp_path):
    """Why the template assigns ``server`` and ``client`` on separate lines."""
    from flwr.supercore.object_ref import validate

    (tmp_path / "fedcluster_app.py").write_text("server, client = object(), object()\n")
    valid, error = validate("fedcluster_app:server", check_module=True, project_dir=tmp_path)
    assert not valid and "Unable to find attribute server" in error


def test_flower_new_never_writes_over_an_app(tmp_path, capsys):
    app = tmp_path / "my_app"
    assert main(["new", str(app)]) == 0
    (app / "fedcluster_app.py").write_text("# mine\n")
    assert main(["new", str(app)]) == 1
    assert "already has" in capsys.readouterr().err
    assert (app / "fedcluster_app.py").read_text() == "# mine\n"
