"""Lightning's process launchers, leaving ``os.environ`` as they found it.

Lightning's launchers export the rendezvous variables (``MASTER_ADDR``, ``MASTER_PORT``,
``NODE_RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``) into the launching process and never remove them.
A later ``devices=2`` run in that process, or in any process it starts (a sweep driver, a
notebook running a script), then sees ``LOCAL_RANK`` and takes itself for a process started by an
external launcher: it starts no other process and waits for them forever.

So: a launch that started no other process (one process, or spawned/forked workers that have
ended) restores the variables afterwards. The first process of a multi-process script launch keeps
them: the processes it started run the same script, and Lightning's later trainer calls in that
script (``trainer.test`` after ``trainer.fit``) rely on them. It marks them as its own
(``FEDCLUSTER_LAUNCH`` = pid:port, inherited by the processes it starts), so that a process it
starts in any other way recognises them as stale, says so, and removes them before launching.

A one-process launch also keeps torch's thread count: Lightning's launchers set it to the cores
per process (and export ``OMP_NUM_THREADS``) unless ``OMP_NUM_THREADS`` is set, which suits
processes that share the machine, but a one-process fit is no such thing, and Lightning's own
single-device fit leaves a user's ``torch.set_num_threads`` as it is.

``EnvironmentKeepingLaunch`` makes a strategy use these launchers. Lightning's launcher classes
and the hook that picks one are private: ``lightning_internals.py`` names them (with a contract
test), so this module uses only public names.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_fedcluster.engine.threads import users_variable_kept
from lightning_fedcluster.lightning_internals import ReplacesLauncher, ScriptLaunch, SpawnLaunch, start_method

LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
MARKER = "FEDCLUSTER_LAUNCH"
THREADS_VARIABLE = "OMP_NUM_THREADS"  # set, Lightning's launchers leave torch's thread count as it is


@contextlib.contextmanager
def restored_environment(names: tuple[str, ...]) -> Iterator[None]:
    """Set the variables ``names`` back to their values (or absence) on entry, on exit."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def kept_threads() -> Iterator[None]:
    """torch's thread count as the process had it, through a launch (see above); the environment
    as found afterwards."""
    with restored_environment((THREADS_VARIABLE,)):
        with users_variable_kept(os.environ.get(THREADS_VARIABLE)):  # the engine's choice reads it
            os.environ.setdefault(THREADS_VARIABLE, str(torch.get_num_threads()))
            yield


def remove_stale_variables() -> None:
    """Remove the rendezvous variables a multi-process launch of another process left behind
    (this process is neither that launch's first process nor one it started), with a warning."""
    marker = os.environ.get(MARKER)
    if marker is None or "LOCAL_RANK" not in os.environ:
        return
    pid, _, port = marker.partition(":")
    if pid in (str(os.getpid()), str(os.getppid())) or os.environ.get("MASTER_PORT") != port:
        return  # this launch's own processes, or variables that another launcher set since
    stale = {name: os.environ.pop(name) for name in LAUNCH_VARIABLES if name in os.environ}
    os.environ.pop(MARKER)
    rank_zero_warn(
        f"the environment held {stale}, left by the multi-process run of process {pid} that started this "
        "one; they were removed so that this run starts its own processes (else it would wait forever for "
        "processes that never come). To launch the processes yourself (torchrun, SLURM), start them from "
        "a clean environment"
    )


class KeepEnvironment:
    """A launcher mixin: ``launch`` leaves the rendezvous variables as it found them (see above)."""

    def launch(self, function: Callable, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        remove_stale_variables()
        if self.starts_script_processes():
            os.environ[MARKER] = f"{os.getpid()}:{self.cluster_environment.main_port}"  # type: ignore[attr-defined]
            return super().launch(function, *args, trainer=trainer, **kwargs)  # type: ignore[misc]
        with restored_environment((*LAUNCH_VARIABLES, MARKER)), contextlib.ExitStack() as stack:
            if self.single_process():
                stack.enter_context(kept_threads())
                if MARKER in os.environ:
                    # A one-process run inside a multi-process script (each process runs it alone, as
                    # Lightning's script launch runs every line in every process): not one of the ranks.
                    for name in (*LAUNCH_VARIABLES, MARKER):
                        os.environ.pop(name, None)
            return super().launch(function, *args, trainer=trainer, **kwargs)  # type: ignore[misc]

    def starts_script_processes(self) -> bool:
        """Whether this launch starts other processes that run the same script (and outlive it)."""
        return False

    def single_process(self) -> bool:
        return False


class ScriptLauncher(KeepEnvironment, ScriptLaunch):
    def starts_script_processes(self) -> bool:
        return self.num_processes > 1 and not self.cluster_environment.creates_processes_externally

    def single_process(self) -> bool:
        return self.num_processes * self.num_nodes == 1


class MultiProcessingLauncher(KeepEnvironment, SpawnLaunch):
    pass


class EnvironmentKeepingLaunch(ReplacesLauncher):
    """A strategy mixin: Lightning's launcher for it, as the subclass above that leaves
    ``os.environ`` as found, built from the same settings (a launcher of another kind, or none,
    stays as it is)."""

    def replace_launcher(self, launcher: Any) -> Any:
        if type(launcher) is ScriptLaunch:
            return ScriptLauncher(launcher.cluster_environment, launcher.num_processes, launcher.num_nodes)
        if type(launcher) is SpawnLaunch:
            return MultiProcessingLauncher(self, start_method=start_method(launcher))
        return launcher
