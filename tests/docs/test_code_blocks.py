"""Every code block of the documentation that is meant to run does run (convention in
tests/docs/markdown_blocks.py): each page's runnable blocks as one script in a fresh process,
in a temporary working folder, with the page's line numbers in any traceback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.docs.markdown_blocks import ROOT, blocks, pages, required_modules, script

RUNNABLE = [page for page in pages() if any(block.runs for block in blocks(page))]
# Rendezvous variables left by in-process multi-device trainers of this session would join the
# page's own processes to another run.
DISTRIBUTED = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
               "LOCAL_WORLD_SIZE", "GROUP_RANK"}  # fmt: skip


def name(page) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", RUNNABLE, ids=name)
def test_the_pages_code_runs(page, tmp_path):
    for module in required_modules(page):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{name(page)} needs {module}")
    path = tmp_path / page.name.replace(".md", "_md.py")
    path.write_text(script(page))
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, f"{name(page)} failed:\n{done.stderr[-4000:]}"


def test_every_python_block_is_seen_and_every_skip_says_why():
    seen = 0
    for page in pages():
        text = page.read_text()
        found = blocks(page)
        python = [b for b in found if b.lang == "python"]
        seen += len(python)
        assert text.count("```python\n") == len(python), name(page)
        for block in python:
            # An indented block would run with its list's indentation stripped: keep them flush.
            assert block.indent == "", f"{name(page)}:{block.line}: a python block inside a list"
        for lineno, line in enumerate(text.split("\n"), 1):
            if line.strip().startswith("<!-- skip"):
                following = [b for b in found if b.line == lineno + 2]
                where = f"{name(page)}:{lineno}"
                assert following and following[0].skip, f"{where}: a skip marker without a reason or block"
    assert seen >= 10


def test_the_readmes_api_example_is_the_one_getting_started_runs():
    (readme_example,) = [b for b in blocks(ROOT / "README.md") if b.lang == "python"]
    assert readme_example.skip
    started = [b.code for b in blocks(ROOT / "docs" / "getting-started.md") if b.runs]
    assert readme_example.code in started


# Characters of a code line that a code block shows at 1280 px without scrolling (Material's
# 61rem grid at 20 px/rem less both sidebars and margins: ~656 px of 13.6 px Roboto Mono, 80
# characters), less a list's indentation.
VISIBLE_CODE_CHARACTERS = 76


def test_the_flower_pages_code_fits_the_page_and_long_lines_wrap():
    page = ROOT / "docs" / "how-to" / "flower.md"
    long = [
        f"{name(page)}:{block.line + i}: {len(line)} characters"
        for block in blocks(page)
        for i, line in enumerate(block.code.split("\n"))
        if len(block.indent) + len(line) > VISIBLE_CODE_CHARACTERS
    ]
    assert not long, "wrap these lines (a shell command with \\ continuations): " + "; ".join(long)
    config = (ROOT / "mkdocs.yml").read_text()
    assert "extra_css:\n  - stylesheets/extra.css" in config
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert ".md-typeset pre > code {\n  white-space: pre-wrap;" in css  # any page's long line wraps
