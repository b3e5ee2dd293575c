"""What the Flower server shows: one progress line per round (``flwr run --stream`` prints the
ServerApp's console), Python logging routed to the console, and the TensorBoard writer of the
round metrics."""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger("lightning_fedcluster.flower")


def progress_line(round_index: int, num_rounds: int, metrics: dict[str, float], seconds: float) -> str:
    """The server's line per round: round, clients, training loss and accuracy, validation, time."""
    parts = [f"round {round_index + 1}/{num_rounds}"]
    if "train/clients" in metrics:
        parts.append(f"{int(metrics['train/clients'])} clients")
    if metrics.get("train/rejected"):
        parts.append(f"{int(metrics['train/rejected'])} rejected")
    for name, label in (("train/loss", "loss"), ("train/acc", "acc"), ("train/mse", "mse")):
        if name in metrics:
            parts.append(f"{label} {metrics[name]:.4f}")
    parts += [f"{name} {value:.4f}" for name, value in metrics.items() if name.startswith("val/")]
    parts.append(f"{seconds:.2f} s")
    return ", ".join(parts)


def console_logging() -> None:
    """The library's log lines (INFO and up) on the ServerApp's stdout, which Flower streams to
    ``flwr run --stream``; once per process, and only when no handler is configured."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(levelname)s : fedcluster: %(message)s"))
        log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)


def writer_for(log_dir: str | None) -> Any:
    if log_dir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir)
