"""Fenced code blocks of the documentation pages, and the convention that says which ones run.

In ``docs/**/*.md`` and ``README.md`` a fenced ```` ```python ```` block is *runnable* unless the
line right before its fence is ``<!-- skip: reason -->``. A page's runnable blocks form one script,
in page order (later blocks use what earlier ones defined). A page holding
``<!-- requires: module -->`` needs that module installed. Other fences (``bash``, ``text``,
``yaml``) never run as code; their commands are checked by tests/docs/test_commands.py or by the
tests named next to them in the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
SKIP = re.compile(r"^<!--\s*skip:\s*(?P<reason>\S.*?)\s*-->$")
REQUIRES = re.compile(r"^<!--\s*requires:\s*(?P<module>[\w.]+)\s*-->$", re.M)


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, code, first code line (1-based) and skip reason."""

    page: Path
    lang: str
    code: str
    line: int
    indent: str
    skip: str | None

    @property
    def runs(self) -> bool:
        return self.lang == "python" and self.skip is None


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order. An unclosed fence is an error."""
    lines = page.read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening or not opening["lang"]:
            i += 1
            continue
        indent, start = opening["indent"], i + 1
        end = next((j for j in range(start, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page.relative_to(ROOT)}:{i + 1}: a ``` fence is never closed")
        marker = SKIP.match(lines[i - 1].strip()) if i > 0 else None
        code = "\n".join(line[len(indent) :] for line in lines[start:end])
        reason = marker["reason"] if marker else None
        found.append(Block(page, opening["lang"], code, start + 1, indent, reason))
        i = end + 1
    return found


def script(page: Path) -> str:
    """The page's runnable blocks as one script, each code line at its line number in the page
    (other lines blank), so that a traceback names the page's own line."""
    lines = [""] * len(page.read_text().split("\n"))
    for block in blocks(page):
        if block.runs:
            for offset, line in enumerate(block.code.split("\n")):
                lines[block.line - 1 + offset] = line
    return "\n".join(lines) + "\n"


def required_modules(page: Path) -> list[str]:
    return REQUIRES.findall(page.read_text())
