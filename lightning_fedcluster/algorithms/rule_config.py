"""A rule's options in one place: its frozen ``Config`` dataclass.

Every rule class names its options in a nested ``Config`` (``FedRC.Config``, ``CFL.Config``, ...):
the defaults, the validation (``__post_init__``, errors that name the option and the fix) and the
docs live there once. A rule is built with either the keyword options (``FedRC(3,
hard_prediction=True)``) or a ready ``config=``, and reads ``self.config``; the strategies forward
their flat keyword arguments into it (``strategies/keywords.py`` ``rule_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class NoOptions:
    """The options of a rule that has none."""


def build_config(rule: str, config_type: type, config: Any, options: dict[str, Any]) -> Any:
    """``config`` itself, or ``config_type(**options)``; refuses both at once, a ``config`` of
    another type and an option ``config_type`` does not have (naming the valid ones)."""
    if config is not None:
        if options:
            raise TypeError(
                f"{rule} got config= and the options {sorted(options)}: give either a {rule}.Config "
                "or keyword options, not both"
            )
        if not isinstance(config, config_type):
            raise TypeError(f"{rule}'s config must be a {rule}.Config, got {type(config).__name__}")
        return config
    valid = [field.name for field in fields(config_type)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(
            f"{rule} got unknown option(s) {unknown}; its options ({rule}.Config) are: "
            f"{', '.join(valid) or 'none'}"
        )
    return config_type(**options)
