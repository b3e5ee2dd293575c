"""RoundProgressBar: progress over communication rounds instead of Lightning's per-epoch bars.

One epoch is one round and one batch, so Lightning's TQDM bar shows a 1/1 bar per round and a
bar per validation pass. This bar counts rounds: ``round t/T``, the clients trained in the round,
rounds per second, the round's training metrics and the latest validation scores with the round
they are from. On a terminal it is one bar redrawn in place; without one (a log file, CI) it
prints at most ``lines`` plain lines per fit. Validation and test draw nothing.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, TextIO

import lightning.pytorch as pl
from lightning.pytorch.callbacks.progress import ProgressBar
from tqdm import tqdm

from lightning_fedcluster.arguments import check_positive_int


def format_metrics(metrics: dict[str, Any]) -> str:
    """``name value`` pairs, floats to 3 decimals, in the order given."""
    parts = []
    for name, value in metrics.items():
        parts.append(f"{name} {value:.3f}" if isinstance(value, float) else f"{name} {value}")
    return "  ".join(parts)


def _is_terminal(stream: TextIO) -> bool:
    """A terminal with a width (a pseudo-terminal of 0 columns would show an empty bar)."""
    if not stream.isatty():
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (OSError, ValueError):  # no file descriptor (e.g. a wrapped stream): trust isatty
        return True


class RoundProgressBar(ProgressBar):
    """A progress bar over rounds (the ``fedcluster`` CLI uses it by default).

    Use it like any Lightning progress bar: ``Trainer(callbacks=[RoundProgressBar()])`` replaces
    the default TQDM bar.

    Args:
        lines: without a terminal, the most lines printed per fit (every ⌈T/lines⌉ rounds and the
            last one; rounds 1, 2, 4, 8, ... when the number of rounds T is not known).
        stream: where to write (default: ``sys.stdout``).
    """

    def __init__(self, lines: int = 10, stream: TextIO | None = None) -> None:
        super().__init__()
        check_positive_int("lines", lines)
        self.lines = lines
        self._stream = stream
        self._enabled = True
        self._bar: tqdm | None = None
        self._clients = 0
        self._started = 0.0
        self._first_round = 0
        self._last_printed = -1
        self._validated: int | None = None  # the round of the latest validation scores

    @property
    def stream(self) -> TextIO:
        return sys.stdout if self._stream is None else self._stream

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print without breaking the bar."""
        if self._bar is not None:
            self._bar.write(" ".join(str(a) for a in args), file=self.stream)
        else:
            print(*args, file=self.stream, **kwargs)

    @staticmethod
    def total_rounds(trainer: pl.Trainer) -> int | None:
        """The round count of the fit (``max_epochs``), None when only ``max_steps`` bounds it."""
        rounds = trainer.max_epochs
        return None if rounds is None or rounds < 0 else rounds

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._enabled:
            return
        self._clients, self._started, self._validated = 0, time.monotonic(), None
        self._first_round = self._last_printed = trainer.current_epoch
        if _is_terminal(self.stream):
            self._bar = tqdm(
                total=self.total_rounds(trainer),
                initial=trainer.current_epoch,
                desc="round",
                unit="round",
                file=self.stream,
                dynamic_ncols=True,
            )

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._validated = trainer.current_epoch + 1  # validation runs before the round's line

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._enabled:
            return
        self._clients = int(getattr(pl_module, "round_metrics", {}).get("train/clients", 0))
        metrics = self.round_metrics(trainer, pl_module)
        if self._bar is not None:
            self._bar.set_postfix_str(
                f"clients {self._clients}  {self._metrics_text(metrics)}", refresh=False
            )
            self._bar.update(1)
            return
        done, total = trainer.current_epoch + 1, self.total_rounds(trainer)
        every = math.ceil(total / self.lines) if total else None
        due = done == total or (done % every == 0 if every else (done & (done - 1)) == 0)
        if due:
            self._print_line(done, total, metrics)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._enabled and trainer.current_epoch > self._last_printed:
            # the last round was not printed (stopped early, or T unknown): print it
            metrics = self.round_metrics(trainer, pl_module)
            self._print_line(trainer.current_epoch, self.total_rounds(trainer), metrics)

    def round_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """What the bar shows after the counters: the metrics logged with ``prog_bar=True``."""
        metrics = self.get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def _metrics_text(self, metrics: dict[str, Any]) -> str:
        """The round's own metrics, then the validation scores with the round they are from
        (validation runs every ``check_val_every_n_epoch`` rounds; its scores are kept between)."""
        own = {name: value for name, value in metrics.items() if not name.startswith("val/")}
        scores = {name: value for name, value in metrics.items() if name.startswith("val/")}
        text = format_metrics(own)
        if scores:
            known = "" if self._validated is None else f"  (validated at round {self._validated})"
            text = f"{text}  {format_metrics(scores)}{known}"
        return text.strip()

    def _print_line(self, done: int, total: int | None, metrics: dict[str, Any]) -> None:
        rate = (done - self._first_round) / max(time.monotonic() - self._started, 1e-9)
        rounds = f"{done}/{total}" if total else f"{done}"
        line = f"round {rounds}  clients {self._clients}  {rate:.2f} rounds/s"
        print(f"{line}  {self._metrics_text(metrics)}".rstrip(), file=self.stream, flush=True)
        self._last_printed = done
