"""Lightning's private names, in one place (lightning 2.6; the ``lightning`` dependency).

Everything else in the package uses Lightning's public API. Two things have none:

- **The launchers** (``strategies/launchers.py`` keeps ``os.environ`` as a launch found it).
  Lightning's launcher classes are private, the strategy's ``_configure_launcher`` is where a
  strategy picks one, and Lightning's trainer recognises them by class (it kills a script
  launch's processes on an exception, refuses returned predictions from spawned ones), so a
  wrapper would change what it does: the package's launchers subclass Lightning's own, under the
  names given here (``ScriptLaunch``, ``SpawnLaunch``), and ``ReplacesLauncher`` lets a strategy
  build its own in place of the one Lightning picked (from its public attributes, no state copied).
- **The hyper-parameters' name** that ``Trainer.save_checkpoint`` writes beside them
  (``LightningModule._hparams_name``, set by ``save_hyperparameters``): ``load_from_checkpoint``
  needs it for a module whose hyper-parameters are one argument (``__init__(self, config)``),
  and an exported cluster model must load as Lightning's own checkpoint does.

``INTERNALS`` lists them; ``check_internals`` fails naming the installed Lightning version and
the missing name (``tests/test_lightning_internals.py``).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher, _SubprocessScriptLauncher

ScriptLaunch = _SubprocessScriptLauncher  # the launcher of ``strategy="ddp"``: the script, once per process
SpawnLaunch = _MultiProcessingLauncher  # of ``ddp_spawn``/``ddp_fork``: the function in worker processes

LAUNCHERS = "lightning.pytorch.strategies.launchers"
# (module, name, parameters or attributes it must have): every Lightning internal used here.
INTERNALS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (LAUNCHERS, "_SubprocessScriptLauncher", ("cluster_environment", "num_processes", "num_nodes")),
    (LAUNCHERS, "_MultiProcessingLauncher", ("strategy", "start_method", "_start_method")),
    ("lightning.pytorch.strategies", "DDPStrategy", ("_configure_launcher", "_launcher")),
    ("lightning.pytorch.utilities.parsing", "save_hyperparameters", ("_hparams_name",)),  # sets it
)


def internals_problems() -> list[str]:
    """What of ``INTERNALS`` the installed Lightning lacks (empty: all there)."""
    problems = []
    for module_name, name, members in INTERNALS:
        target = getattr(importlib.import_module(module_name), name, None)
        if target is None:
            problems.append(f"{module_name}.{name} is missing")
            continue
        init = inspect.signature(target.__init__).parameters if inspect.isclass(target) else {}
        source = inspect.getsource(target)
        missing = [m for m in members if m not in init and not hasattr(target, m) and f".{m}" not in source]
        if missing:
            problems.append(f"{module_name}.{name} has no {', '.join(missing)}")
    return problems


def check_internals() -> None:
    """Fail, naming the installed Lightning and what it lacks, when ``INTERNALS`` are not there."""
    problems = internals_problems()
    if problems:
        raise RuntimeError(
            f"lightning-fedcluster uses Lightning internals of lightning 2.6 (lightning_internals.py), but "
            f"the installed lightning {pl.__version__} differs: {'; '.join(problems)}"
        )


def start_method(launcher: SpawnLaunch) -> str:
    """How a ``SpawnLaunch`` starts its workers ("spawn", "fork" or "forkserver")."""
    return launcher._start_method


class ReplacesLauncher:
    """A strategy mixin: Lightning picks the launcher, then ``replace_launcher`` may return another."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()  # type: ignore[misc]
        self._launcher = self.replace_launcher(self._launcher)

    def replace_launcher(self, launcher: Any) -> Any:
        return launcher


def hparams_name(model: pl.LightningModule) -> str | None:
    """The name ``save_hyperparameters`` gave the module's hyper-parameters ("kwargs", or the
    argument that held them), as ``Trainer.save_checkpoint`` writes it."""
    return getattr(model, "_hparams_name", None)
