"""The ``fedcluster`` command's errors in one or two lines, the cause first.

jsonargparse reports a bad ``--data``, class name or argument as a report of every type it tried
("Does not validate against any of the Union subtypes", the subtypes, the given namespace), and
an error raised while building the configured classes as a 75-line traceback; the library's own
message ("path='no_such_file.pt': no such file") sits in the middle. Here the report is reduced
to the lines that say what is wrong, a misspelt class or argument name gets a "did you mean",
and the full report is shown only with ``FEDCLUSTER_DEBUG=1`` (or jsonargparse's
``JSONARGPARSE_DEBUG``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import os
import re
import sys
import typing
from typing import Any, NoReturn

from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import Strategy, StrategyRegistry

DEBUG_ENV = "FEDCLUSTER_DEBUG"
HINT = f"(all options: fedcluster fit --help; the full report: {DEBUG_ENV}=1 fedcluster ...)"

# The classes a configuration key names, for "did you mean" on a misspelt class.
BASES: dict[str, type] = {
    "model": LightningModule,
    "data": LightningDataModule,
    "trainer.strategy": Strategy,
    "trainer.logger": Logger,
    "trainer.callbacks": Callback,
}
NOISE = (
    re.compile(r"^Does not validate against any of the Union subtypes"),
    re.compile(r"^(Subtypes|Errors|Given value type|Given value):"),
    re.compile(r"^Expected a <class '(NoneType|str)'>$"),  # the union's other members
    re.compile(r"^Expected a path but \S+ either not accessible or invalid"),  # it is not a config file
)
KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
CLASS_PATH = re.compile(r"^Problem with given class_path '([^']+)':\s*(.*)$")
GIVEN_CLASS = re.compile(r"class_path='([^']+)'")
NOT_ACCEPTED = re.compile(r"^Option '([^']+)' is not accepted$")
NO_SUCH_CLASS = re.compile(r"^(?:Expected a dot import path string:|Import path)\s*(\S+)")
UNRECOGNIZED = re.compile(r"^unrecognized arguments: (.*)$", re.IGNORECASE)
STRATEGY_NAME = re.compile(r"invalid strategy name: `strategy='([^']+)'`")
UNREGISTERED = re.compile(
    r"^strategy='([^']+)' is not a registered strategy"
)  # strategies.check_strategy_name


def debug_requested() -> bool:
    """Whether the user asked for the full report (``FEDCLUSTER_DEBUG`` or ``JSONARGPARSE_DEBUG``)."""
    return any(
        os.environ.get(name, "").lower() not in ("", "0", "false")
        for name in (DEBUG_ENV, "JSONARGPARSE_DEBUG")
    )


def exit_with(summary: str) -> NoReturn:
    """Print ``summary`` and the hint to stderr and exit with status 2 (a usage error)."""
    sys.stderr.write(f"error: {summary}\n{HINT}\n")
    raise SystemExit(2)


class ConciseArgumentParser(LightningArgumentParser):
    """LightningArgumentParser whose errors are ``summarize``d (unless the full report is asked
    for, or the parser is a nested one whose errors jsonargparse catches)."""

    # The parsers of one CLI (its root and its subcommands', ``FedClusterCLI.init_parser``): an
    # unknown option's "did you mean" looks in all of them.
    family: list[Any] | None = None

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_requested():
            super().error(message, ex)
        exit_with(summarize(message, self))


def summarize(message: str, parser: Any = None) -> str:
    """The lines of a jsonargparse (or Lightning, or library) error message that say what is
    wrong, joined on one line: ``--key: cause``, with "did you mean" for a misspelt class or
    argument name. ``parser`` offers the option names for an unrecognised argument."""
    lines = [line.strip().removeprefix("- ").strip() for line in message.splitlines()]
    unrecognized = UNRECOGNIZED.match(lines[0]) if lines else None
    if unrecognized:
        return unknown_options(unrecognized.group(1), parser)
    unregistered = UNREGISTERED.match(lines[0]) if lines else None
    if unregistered:  # the library's message; a strategy class name it did not match gets one
        hint = "" if "did you mean" in lines[0] else suggestion(unregistered.group(1), "trainer.strategy")
        return lines[0] + hint
    strategy = STRATEGY_NAME.search(message)
    if strategy:
        name = strategy.group(1)
        return f"--trainer.strategy: no strategy named {name!r}{suggestion(name, 'trainer.strategy')}"
    key, owner, argument, causes = None, None, None, []
    given = GIVEN_CLASS.search(message)
    for line in lines:
        if not line or any(pattern.search(line) for pattern in NOISE):
            continue
        keyed = KEY.match(line)
        if keyed:
            if key is None:
                key = keyed.group(1)
            else:  # a nested key: the argument of the class being built
                argument = keyed.group(1)
            line = keyed.group(2)
        located = CLASS_PATH.match(line)
        if located:
            owner, argument, line = located.group(1), None, located.group(2)
        if line:
            causes.append(cause(line, key, owner, argument))
    where = f"--{key}: " if key else (f"{short(given.group(1))}: " if given else "")
    if not causes:
        return where + next((line for line in lines if line), message)
    return where + "; ".join(dict.fromkeys(causes))


def cause(line: str, key: str | None, owner: str | None, argument: str | None) -> str:
    """One error line in words, with a "did you mean" where a class or argument was misspelt."""
    rejected = NOT_ACCEPTED.match(line)
    if rejected:
        name = rejected.group(1)
        close = difflib.get_close_matches(name, argument_names(owner) if owner else [], n=1, cutoff=0.6)
        target = short(owner) if owner else "the class"
        return f"{target} has no argument {name!r}" + (f"; did you mean {close[0]}?" if close else "")
    missing = NO_SUCH_CLASS.match(line)
    if missing:
        name = missing.group(1)
        return f"no class named {name!r}{suggestion(name, key)}"
    if owner is None:
        return line
    return f"{short(owner)}" + (f" argument {argument}" if argument else "") + f": {line}"


def suggestion(name: str, key: str | None) -> str:
    """ "; did you mean X?" for a misspelt class (or strategy) name under ``key``, or ""."""
    base = BASES.get(key or "")
    if base is None:
        return ""
    names = {cls.__name__: cls.__name__ for cls in subclasses(base)}
    if base is Strategy:
        names.update({registered: registered for registered in StrategyRegistry.available_strategies()})
    folded = {candidate.lower(): candidate for candidate in names}
    close = difflib.get_close_matches(short(name).lower(), list(folded), n=1, cutoff=0.6)
    return f"; did you mean {folded[close[0]]}?" if close else ""


def unknown_options(given: str, parser: Any) -> str:
    """'unrecognized arguments' with the closest option name of the parser for each."""
    options = option_names(parser)
    parts = []
    for option in (token for token in given.split() if token.startswith("--")):
        flag = option.split("=", 1)[0]
        close = difflib.get_close_matches(flag, options, n=1, cutoff=0.75)
        parts.append(f"unknown option {flag}" + (f"; did you mean {close[0]}?" if close else ""))
    return "; ".join(parts) or f"unrecognized arguments: {given}"


OPTION = re.compile(r"(?<![\w-])(--[A-Za-z][\w.-]*)")


def option_names(parser: Any) -> list[str]:
    """Every --option that ``parser``'s help, and its subcommands' (its ``family``), lists: read
    from ``format_help()``, argparse's public view of a parser's options."""
    if parser is None:
        return []
    family = getattr(parser, "family", None) or [parser]
    return sorted({name for member in family for name in OPTION.findall(member.format_help())})


def argument_names(class_path: str) -> list[str]:
    """The constructor arguments jsonargparse accepts for ``class_path`` (its own resolution, which
    follows **kwargs into base classes; the plain signature where that is unavailable), and the
    fields of a dataclass argument as ``argument.field`` (``config.group_round``)."""
    try:
        cls = import_class(class_path)
    except (ImportError, AttributeError, ValueError):
        return []
    try:
        from jsonargparse._parameter_resolvers import get_signature_parameters

        parameters = get_signature_parameters(cls, None)
    except Exception:  # a private jsonargparse helper: fall back to the signature
        return [name for name in inspect.signature(cls).parameters if name not in ("self", "args", "kwargs")]
    names = [parameter.name for parameter in parameters]
    for parameter in parameters:
        for option in typing.get_args(parameter.annotation) or (parameter.annotation,):
            if dataclasses.is_dataclass(option):
                names += [f"{parameter.name}.{field.name}" for field in dataclasses.fields(option)]
    return names


def import_class(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def subclasses(base: type) -> list[type]:
    """Every imported subclass of ``base``, recursively."""
    found, pending = [], list(base.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending += cls.__subclasses__()
    return found


def short(class_path: str) -> str:
    return class_path.rpartition(".")[2]
