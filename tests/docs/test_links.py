"""The README's relative links point at files that exist (on GitHub they open the docs' Markdown
pages; `mkdocs build --strict` checks the links between the docs' own pages)."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_the_docs_figures_exist_are_pngs_and_are_the_ones_the_script_writes():
    """Every figure a page shows is a checked-in PNG that benchmarks/docs_figures.py (or, for "How
    clusters form", benchmarks/takeoff_figure.py) writes from a real run, and every such PNG is
    shown somewhere."""
    import ast

    docs = ROOT / "docs"
    shown: set[str] = set()
    for page in docs.rglob("*.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.relative_to(ROOT)} shows a missing figure: {target}"
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", target
            shown.add(path.name)
    for page in ("how-to/monitoring.md", "concepts.md", "results.md"):
        assert "](" in (docs / page).read_text() and any(
            f"figures/{name}" in (docs / page).read_text() for name in shown
        ), f"{page} shows no figure"
    written: set[str] = set()
    for name in ("docs_figures.py", "takeoff_figure.py"):
        script = (ROOT / "benchmarks" / name).read_text()
        written |= {Path(n.value).name for n in ast.walk(ast.parse(script)) if isinstance(n, ast.Constant)
                    and isinstance(n.value, str) and n.value.endswith(".png")}  # fmt: skip
    checked_in = {p.name for p in (docs / "figures").glob("*.png")}
    assert shown == checked_in == written, (shown, checked_in, written)


def test_every_benchmark_page_is_in_the_index_and_in_the_site():
    """benchmarks/RESULTS.md is the contents of benchmarks/results/: it links every page (and only
    pages that exist), and each page is shown in the docs site by a one-line include in nav."""
    index = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    linked = re.findall(r"\]\(results/([^)#\s]+\.md)\)", index)
    pages = sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("*.md"))
    assert len(pages) > 10 and sorted(linked) == pages, (linked, pages)
    nav = (ROOT / "mkdocs.yml").read_text()
    assert (ROOT / "docs/benchmarks/RESULTS.md").read_text().strip() == '--8<-- "benchmarks/RESULTS.md"'
    for name in pages:
        include = (ROOT / "docs/benchmarks/results" / name).read_text().strip()
        assert include == f'--8<-- "benchmarks/results/{name}"', name
        assert f": benchmarks/results/{name}" in nav, f"benchmarks/results/{name} is not in mkdocs.yml's nav"
        page = (ROOT / "benchmarks/results" / name).read_text()
        assert page.startswith("# ") and "## " in page, f"{name}: a title and its newest section"
