"""Where the logits are in a cluster model's output: ``logits_from``.

Every place the engine reads a cluster model's forward (losses, no-grad passes, the vectorised
executor's functional calls, the setup check, ``ClusteredModule.forward``) goes through
``select_logits``. ``logits_from`` is None (``forward`` returns the logits, or the predictions
for regression), a dict key (or the attribute of a namedtuple or dataclass), a tuple/list
index, or a callable ``output -> logits``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

LogitsFrom = int | str | Callable[[Any], Tensor] | None
HINT = "a dict key, a tuple index, or a callable output -> logits"


def check_logits_from(logits_from: Any) -> LogitsFrom:
    """``logits_from`` if it has one of the accepted types, else a TypeError naming it."""
    if logits_from is None or callable(logits_from):
        return logits_from
    if isinstance(logits_from, (str, int)) and not isinstance(logits_from, bool):
        return logits_from
    raise TypeError(f"logits_from must be {HINT} (or None), got {type(logits_from).__name__}")


def describe(output: Any) -> str:
    """A short description of a forward's output for error messages."""
    if isinstance(output, Tensor):
        return f"a tensor of shape {tuple(output.shape)}"
    if isinstance(output, Mapping):
        return f"a dict with keys {list(output)}"
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {len(output)} elements"
    return f"a {type(output).__name__}"


def select_logits(output: Any, logits_from: LogitsFrom, owner: str = "model") -> Tensor:
    """The logits out of a forward's ``output`` (``owner`` names the model in errors)."""
    if logits_from is None:
        if isinstance(output, Tensor):
            return output
        example = next(iter(output), "logits") if isinstance(output, Mapping) else 0
        raise ValueError(
            f"{owner}.forward returns {describe(output)}, not a tensor of logits: pass logits_from= to "
            f"ClusteredModule or the strategy to say where the logits are ({HINT}, e.g. "
            f"logits_from={example!r})"
        )
    if callable(logits_from):
        selected = logits_from(output)
    elif isinstance(output, Mapping):
        if logits_from not in output:
            raise ValueError(
                f"logits_from={logits_from!r} is not a key of the dict {owner}.forward returns "
                f"(keys: {list(output)}): pass one of them"
            )
        selected = output[logits_from]
    elif isinstance(output, (tuple, list)) and isinstance(logits_from, int):
        if not -len(output) <= logits_from < len(output):
            raise ValueError(
                f"logits_from={logits_from} is out of range for the {len(output)}-element "
                f"{type(output).__name__} {owner}.forward returns: pass an index in [0, {len(output)})"
            )
        selected = output[logits_from]
    elif isinstance(logits_from, str) and hasattr(output, logits_from):  # a namedtuple or dataclass
        selected = getattr(output, logits_from)
    else:
        raise ValueError(
            f"logits_from={logits_from!r} cannot select from {describe(output)} ({owner}.forward's output): "
            f"pass {HINT}"
        )
    if not isinstance(selected, Tensor):
        raise ValueError(
            f"logits_from={logits_from!r} selects {describe(selected)} from {owner}.forward's output, not a "
            "tensor of logits"
        )
    # Under bfloat16 autocast (precision="bf16-mixed") the losses, the E-step and the metrics
    # read float32 logits, so that only the model's own layers run in half precision.
    return selected.float() if selected.dtype in (torch.bfloat16, torch.float16) else selected


def forward_logits(model: nn.Module, x: Tensor, logits_from: LogitsFrom) -> Tensor:
    """The logits of ``model`` on ``x``: its forward, read through ``logits_from``."""
    return select_logits(model(x), logits_from, type(model).__name__)


def logits_selector(logits_from: LogitsFrom) -> Callable[[Any], Tensor]:
    """``select_logits`` as a function of the output alone (for ``torch.func`` calls)."""
    return functools.partial(select_logits, logits_from=logits_from)
