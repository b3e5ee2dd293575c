"""The API reference (docs/api, mkdocstrings) shows the user's API, not the hooks Lightning calls:
the members a page's ``filters`` keep, applied as mkdocstrings applies them (a member is shown
unless a ``!``-pattern matches its name)."""

from __future__ import annotations

import html
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.pytorch.strategies import DDPStrategy

from lightning_fedcluster.strategies import FederatedStrategy

ROOT = Path(__file__).resolve().parents[2]


def page_filters(page: str) -> list[str]:
    match = re.search(
        r"^\s*filters:\s*(\[.*\])\s*$", (ROOT / "docs" / "api" / page).read_text(), re.MULTILINE
    )
    assert match, f"docs/api/{page} sets no filters"
    return re.findall(r'"([^"]+)"', match.group(1))


def shown(name: str, filters: list[str]) -> bool:
    return not any(re.search(pattern[1:], name) for pattern in filters if pattern.startswith("!"))


def test_the_strategy_page_hides_the_lightning_hooks_and_keeps_the_users_api():
    filters = page_filters("strategies.md")
    own = {name for name, _ in inspect.getmembers(FederatedStrategy) if name in vars(FederatedStrategy)}
    lightning_hooks = {name for name in own if not name.startswith("_") and hasattr(DDPStrategy, name)}
    assert lightning_hooks >= {"connect", "setup", "setup_distributed", "configure_ddp"}
    assert not [name for name in lightning_hooks if shown(name, filters)]
    assert {name for name in own if shown(name, filters)} >= {"algorithm", "algorithm_name", "plan"}


SPHINX_ROLES = re.compile(r":(class|mod|func|meth|attr|obj|exc|data):")


def test_the_built_reference_shows_no_raw_sphinx_roles(tmp_path):
    """Docstrings cross-reference with mkdocstrings' own syntax (``[`CFLConfig`][lightning_fedcluster
    .algorithms.cfl.CFLConfig]``); a Sphinx role (``:class:`...```) is shown on the page as raw text.
    Builds the site as ``mkdocs build --strict`` does (about 25 s)."""
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = {
        str(page.relative_to(site)): len(SPHINX_ROLES.findall(html.unescape(page.read_text())))
        for page in sorted((site / "api").rglob("*.html"))
    }
    assert found and not {page: count for page, count in found.items() if count}, found
