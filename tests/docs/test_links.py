"""The README's relative links point at files that exist (on GitHub they open the docs' Markdown
pages; `mkdocs build --strict` checks the links between the docs' own pages)."""

from __future__ import annotations

import re

from tests.docs.markdown_blocks import ROOT

README = ROOT / "README.md"


def test_the_readmes_relative_links_resolve():
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in relative)
    for target in relative:
        path = target.split("#")[0]
        assert not path or (ROOT / path).is_file(), f"README links to a missing file: {target}"


def test_every_docs_page_the_readme_names_is_in_the_site():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in re.findall(r"\]\(docs/([^)#\s]+\.md)", README.read_text()):
        assert f": {page}" in nav, f"docs/{page} is linked from the README but not in mkdocs.yml's nav"
