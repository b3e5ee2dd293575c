"""How a fit's processes end: how long one waits for a peer that stopped, the exit status of a
fit stopped by SIGTERM, and the process group torn down before the interpreter exits."""

from __future__ import annotations

import atexit
import signal
from datetime import timedelta

import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import SIGTERMException

# The exit status of a fit stopped by SIGTERM: that of a process killed by it (128 + 15).
SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM


def process_group_timeout(timeout: timedelta | float | None) -> timedelta | None:
    """The strategy's ``timeout`` as the ``timedelta`` torch.distributed takes (a number: seconds):
    how long a process waits for the others in a collective (a round's all-reduce) before the fit
    fails. A stopped (SIGSTOP) or hung peer fails the others after it, 30 minutes by default."""
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(
            f"timeout must be a number of seconds > 0 or a datetime.timedelta (how long a process waits for "
            f"the others at a round's all-reduce before the fit fails), got {timeout!r}"
        )
    return timedelta(seconds=float(timeout))


def exit_status_on_sigterm(exception: BaseException) -> None:
    """Lightning stops a fit on SIGTERM with a ``SIGTERMException``, a ``SystemExit`` whose status
    is 0, so a scheduler would take it for a finished fit (and the code after ``trainer.fit`` would
    not run either way): give it status 143. The last round-end checkpoint is whole on disk (the
    strategies write checkpoints atomically) and resuming from it is exact."""
    if isinstance(exception, SIGTERMException) and not exception.code:
        exception.code = SIGTERM_EXIT_STATUS


_teardown_registered = False


def _destroy_process_group() -> None:
    """Destroy the default process group while the interpreter is still whole (at exit)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def destroy_process_group_at_exit() -> None:
    """Once per process, when a group exists: destroy it at interpreter exit. Lightning registers
    this only for NCCL; a gloo group left alive at exit can abort the process while the
    interpreter shuts down, after training finished correctly."""
    global _teardown_registered
    if dist.is_available() and dist.is_initialized() and not _teardown_registered:
        atexit.register(_destroy_process_group)
        _teardown_registered = True
