"""How a fit's processes end when something goes wrong: how long one waits for a peer that
stopped, and the exit status of a fit stopped by SIGTERM."""

from __future__ import annotations

import signal
from datetime import timedelta

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
