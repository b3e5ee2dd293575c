"""The product's text speaks of the product, never of how its authors organise their work.

Scanned: ``README.md``, ``CHANGELOG.md`` (it speaks of releases and versions, so the same words are
out of place there too), every Markdown page under ``docs/``, every ``.md`` and ``.py`` file under
``benchmarks/`` (its result pages included), the names of the records under ``benchmarks/records/``
(not their contents: they are raw measurements), and the comments and string literals (docstrings,
help texts, messages, printed table titles) of every ``.py`` file under ``benchmarks/`` and the
package ``lightning_fedcluster/``. Code itself (names, arguments) is not scanned. Every scanned
file's path is checked as well, so that a module or record cannot carry the words in its name.

The words (each a regular expression; ``_`` and ``-`` count as word separators, so that a name such
as ``takeoff_grid.py`` or ``session_54.jsonl`` is caught as well as the prose):

- a work period: "session", "sessions", "this session", "work period";
- a stop, an issue or a pull request by number: "stop 55", "issue 25", "issues 25", "#25";
- a machine lent or borrowed: "lent", "borrowed" ("the session machine" is caught as a session);
- an experiment grid: "take-off grid", "takeoff_grid", "the grid", "grids";
- "done means" / "done-means".

Flower's ``Grid`` is an API of the product's deployment, not an experiment grid, so ``grid`` stays
allowed where it means that, and nowhere else (a narrow exception, written into ``GRID`` itself):
the capitalised class name ``Grid`` (``HttpGrid``, ``GridExecutor`` are other words and never match);
``grid`` as code: in a Markdown or reST code span (```` `grid` ````, ```` ``grid.py`` ````), in a
fenced code block of a page, as an argument name (never scanned in a ``.py`` file), or as part of a
dotted or snake-case name (``grid.py``, ``flwr.superlink.grid``, ``affine_grid``, ``local_grid``);
and the prose word right after a name that says whose grid it is: "Flower grid", "Flower's grid",
"SuperLink grid", "SuperLink's grid", "ServerApp's grid". The experiment grid's own names
(``take-off grid``, ``takeoff_grid``) match whatever surrounds them, code spans included.

Each hit is reported as ``file:line: text`` of the line.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from tests.docs.markdown_blocks import ROOT

PACKAGE = "lightning_fedcluster"
# Word boundaries that treat "_" and "-" as separators, so identifiers and file names are caught.
_B, _E = r"(?<![A-Za-z0-9])", r"(?![A-Za-z0-9])"
WORDS: dict[str, re.Pattern[str]] = {
    "work period": re.compile(rf"{_B}(?:sessions?|work[ _-]periods?){_E}", re.I),
    "stop or issue number": re.compile(
        rf"{_B}(?:stops?|issues?|pr)[ _-]?#?\d+{_E}|(?<![\w&#/])#\d+{_E}", re.I
    ),
    "lent or borrowed machine": re.compile(rf"{_B}(?:lent|borrowed|lending|borrowing){_E}", re.I),
    "done means": re.compile(rf"{_B}done[ _-]means{_E}", re.I),
}
# The experiment grid by name, wherever it is written (code spans and file names included).
TAKEOFF_GRID = re.compile(rf"{_B}take[ _-]?off[ _-]?grids?{_E}", re.I)
# Any other lowercase "grid" as a word of prose, unless a name right before it says it is Flower's.
# Run on the line with its code spans blanked; "\b" (not _B) keeps snake-case names (affine_grid)
# out, and the look-ahead keeps dotted names (grid.py, grid.send_and_receive) out.
FLOWER_OWNERS = ("Flower ", "Flower's ", "SuperLink ", "SuperLink's ", "ServerApp's ")
GRID = re.compile(
    "".join(f"(?<!{re.escape(owner)})" for owner in FLOWER_OWNERS) + r"(?<![\w.])grids?\b(?!\.\w)"
)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
FENCE = re.compile(r"^\s*(```|~~~)")


def line_hits(text: str, prose: bool = True) -> list[str]:
    """The names of the words ``text`` (one line) holds. A lowercase ``grid`` counts only in prose
    (``prose``: not a line of a fenced code block) and outside code spans."""
    found = [name for name, pattern in WORDS.items() if pattern.search(text)]
    outside_code = CODE_SPAN.sub(lambda m: " " * len(m.group()), text)
    if TAKEOFF_GRID.search(text) or (prose and GRID.search(outside_code)):
        found.append("experiment grid")
    return found


def markdown_lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, whether it is inside a fenced code block) for every line."""
    fenced = False
    for number, line in enumerate(text.split("\n"), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        yield number, line, fenced


# Python >= 3.12 splits an f-string into tokens; its literal text is FSTRING_MIDDLE.
TEXT_TOKENS = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def python_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every comment and every line of every string literal."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in TEXT_TOKENS:
            for offset, line in enumerate(token.string.split("\n")):
                yield token.start[0] + offset, line


def scanned_files(root: Path = ROOT) -> list[Path]:
    """Every file whose text is scanned (see the module docstring)."""
    files = [root / name for name in ("README.md", "CHANGELOG.md") if (root / name).is_file()]
    files += sorted((root / "docs").rglob("*.md"))
    files += sorted(
        p for p in (root / "benchmarks").rglob("*") if p.suffix in (".md", ".py") and "records" not in p.parts
    )
    files += sorted((root / PACKAGE).rglob("*.py"))
    return files


def hits(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: text`` for every line of ``path`` that holds one of the words."""
    name = path.relative_to(root).as_posix()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        lines = ((number, line, False) for number, line in python_lines(text))
    else:
        lines = markdown_lines(text)
    found = []
    for number, line, fenced in lines:
        if words := line_hits(line, prose=not fenced):
            found.append(f"{name}:{number}: {line.strip()}  [{', '.join(words)}]")
    return found


def name_hits(root: Path = ROOT) -> list[str]:
    """Scanned files and records whose path holds one of the words."""
    paths = [p.relative_to(root).as_posix() for p in scanned_files(root)]
    records = root / "benchmarks" / "records"
    paths += sorted(p.relative_to(root).as_posix() for p in records.rglob("*") if p.is_file())
    return [f"{path}: its name  [{', '.join(words)}]" for path in paths if (words := line_hits(path))]


def all_hits(root: Path = ROOT) -> list[str]:
    return name_hits(root) + [hit for path in scanned_files(root) for hit in hits(path, root)]


def test_the_product_speaks_of_the_product():
    found = all_hits()
    assert not found, (
        f"{len(found)} lines speak of how the work is organised, not of the product:\n" + "\n".join(found)
    )


def test_each_word_is_caught_and_flowers_grid_is_not():
    caught = {
        "measured in session 54": ["work period"],
        "as this session's run showed": ["work period"],
        "records of sessions 33-38": ["work period"],
        "the session machine": ["work period"],
        "takeoff_session_54.jsonl": ["work period"],
        "until stop 55": ["stop or issue number"],
        "Issue 25: why a model falls": ["stop or issue number"],
        "see #25": ["stop or issue number"],
        "the issue-17 run, merged in PR #31": ["stop or issue number"],
        "on a lent H100": ["lent or borrowed machine"],
        "the borrowed GPU": ["lent or borrowed machine"],
        "the take-off grid's jobs": ["experiment grid"],
        "python benchmarks/takeoff_grid.py run": ["experiment grid"],
        "`takeoff_grid.py`": ["experiment grid"],
        "a screen, not the five-seed grid": ["experiment grid"],
        "The grid ran on two cores": ["experiment grid"],
        "the done-means table": ["done means"],
        "what done means here": ["done means"],
    }
    for text, words in caught.items():
        assert line_hits(text) == words, text
    allowed = [
        "a Flower grid (the nodes)",
        "A SuperLink's grid (``flwr run`` on a deployment)",
        "the ServerApp's grid",
        "with ``grid.py`` as the executor",
        "``flwr.superlink.grid.http_grid``",
        "Flower's `Grid` API and the `grid` argument of `ServerApp.main`",
        "F.affine_grid(theta) and tests/flower/local_grid.py",
        "silent, excellent, a Python process, a stopped run, issued, the 25th round",
        "colours #1f77b4 and color='#ff7f0e'; version 0.3.0",
    ]
    for text in allowed:
        assert line_hits(text) == [], text


def test_code_is_not_scanned_as_prose(tmp_path):
    """Flower's ``grid`` argument in a page's code block or in a module's code is allowed; the same
    word in the page's prose, a module's comment or docstring, or the experiment grid's name in a
    code block, is not."""
    page = tmp_path / "page.md"
    page.write_text(
        "```python\ndef main(grid: Grid, context: Context) -> None:\n```\nThe grid ran twice.\n"
        "```bash\npython benchmarks/takeoff_grid.py run\n```\n"
    )
    assert [hit.split(": ")[0] for hit in hits(page, tmp_path)] == ["page.md:4", "page.md:6"]
    module = tmp_path / "module.py"
    module.write_text(
        "def main(grid: Grid) -> None:  # each run of the grid\n"
        '    """On the Flower grid, as in session 3."""\n'
        '    print(f"{grid} done means")\n'
        "    return grid.send_and_receive([])\n"
    )
    found = [hit.split(": ")[0] for hit in hits(module, tmp_path)]
    assert found == ["module.py:1", "module.py:2", "module.py:3"]
