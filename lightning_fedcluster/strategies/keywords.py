"""The strategies' keywords: an argument no strategy reads is a TypeError that lists the valid
names and suggests the nearest one, instead of being swallowed by Lightning's DDPStrategy (whose
``**kwargs`` go to a DistributedDataParallel wrapper this library never builds); a named
strategy's flat rule options go into the rule's frozen ``Config`` (``rule_config``)."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def init_parameters(cls: type, base: type) -> list[str]:
    """The named ``__init__`` parameters of ``cls`` and of its ancestors up to ``base`` (inclusive),
    subclass first, read from the signatures (so new arguments are picked up without a list)."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is not None:
            parameters = list(inspect.signature(init).parameters.values())[1:]  # drop self
            names += [p.name for p in parameters if p.kind in _NAMED and p.name not in names]
        if klass is base:
            break
    return names


def _wrapper_arguments() -> set[str]:
    """Arguments that configure DDP's model wrapper (gradient all-reduce), not the processes."""
    ddp = set(inspect.signature(DDPStrategy.__init__).parameters)
    return ddp | set(inspect.signature(DistributedDataParallel.__init__).parameters)


def reject_unknown(strategy: str, unknown: Mapping[str, Any], valid: list[str]) -> None:
    """Raise a TypeError for the keyword arguments in ``unknown``, naming the nearest valid name."""
    if not unknown:
        return
    wrapper = _wrapper_arguments()
    problems = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        if name in wrapper:
            problems.append(
                f"{name!r} (an argument of DDP's gradient all-reduce wrapper, which federated strategies "
                "never build: client updates are averaged once per round instead)"
            )
        elif close:
            problems.append(f"{name!r} (did you mean {close[0]!r}?)")
        else:
            problems.append(repr(name))
    raise TypeError(
        f"{strategy} got unexpected keyword argument{'s' if len(problems) > 1 else ''} "
        f"{', '.join(problems)}. Valid arguments: {', '.join(valid)}"
    )


def rule_config(config_type: type, arguments: Mapping[str, Any], **fixed: Any) -> Any:
    """The rule's frozen ``Config`` from a strategy's flat keyword arguments: the Config's fields
    picked by name from ``arguments`` (the strategy's ``locals()``), plus what the strategy sets
    itself (``fixed``: its seed, FedEM's ``use_label_stats=False``). The Config checks them; the
    strategy neither checks nor documents them a second time."""
    names = [field.name for field in fields(config_type)]
    options = {name: arguments[name] for name in names if name in arguments and name not in fixed}
    return config_type(**options, **fixed)


def documents_rule_options(config_type: type) -> Callable[[type], type]:
    """Class decorator of a named strategy: its docstring gains the ``Args:`` of ``config_type``'s
    docstring, so that the CLI's help (jsonargparse reads the docstrings) shows the rule options
    that are written once, on the rule's Config."""

    def decorate(strategy: type) -> type:
        _, found, options = inspect.cleandoc(config_type.__doc__ or "").partition("Args:\n")
        if found:
            strategy.__doc__ = f"{inspect.cleandoc(strategy.__doc__ or '')}\n\nArgs:\n{options}"
        return strategy

    return decorate
