"""The Flower server's checkpoint: its state between rounds in a verified file (``checkpoint-path``),
written atomically every ``checkpoint-every`` rounds, so that a run whose ServerApp or SuperLink
went down goes on from the last one (``resume=true``) instead of starting again.

The file holds what the server keeps across rounds: the K global models, the client store, the
server optimizer's and LR schedulers' state, the store entries its actions own, the divergence
checks' state and the metrics, dropped and rejected clients so far. The nodes' stores started
afresh with the new run: the server restores its clients' rows into them before the first round
(``nodes.restore_stores``), which makes resuming exact for every rule whose client state the
server holds. A run whose nodes hold more (per-sample state such as FedRC-Adam's γ, persistent
optimizer state, personal models) cannot resume exactly, and is refused.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from lightning_fedcluster.algorithms.client_state import Scope
from lightning_fedcluster.engine.checkpoint import check_resumable, metadata, schedule_config
from lightning_fedcluster.engine.federation import RoundDriver
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.verified_files import load_verified, save_verified

log = logging.getLogger("lightning_fedcluster.flower")


def node_only_state(plan: TrainingPlan) -> list[str]:
    """The client state that only the nodes hold, which a resumed run cannot restore."""
    rule, held = plan.rule, []
    per_sample = {entry.name for entry in rule.state_entries() if entry.scope == Scope.SAMPLE}
    if per_sample:
        held.append(f"per-sample state {sorted(per_sample)}")
    if plan.persists_optimizer_state:
        held.append("persistent optimizer state (optimizer_state='persist')")
    if rule.capabilities.personal_models:
        held.append("personal models")
    return held


def save_checkpoint(server: Any, driver: RoundDriver, round_index: int, path: str | os.PathLike) -> None:
    """The server's state after round ``round_index`` (``server``: a ``FlowerServer``)."""
    state, plan = driver.state, server.plan
    schedulers = [entry.scheduler.state_dict() for entry in state.schedulers.entries]
    optimizer = state.server_optimizer
    save_verified(
        {
            "metadata": metadata(plan.name, plan.rule, state.client_state, None, schedule_config(plan)),
            "round": round_index,
            "num_rounds": server.num_rounds,
            "state_dict": server.module.state_dict(),
            "client_state": state.client_state.state_dict(),
            "server_optimizer": None if optimizer is None else optimizer.state_dict(),
            "solver": server.solver.state_dict(),
            "schedulers": schedulers,
            "pushed": sorted(server.pushed),
            "checks": {"first_loss": driver.first_loss, "chance_rounds": driver.chance_rounds},
            "metrics": server.metrics,
            "save_path": None if server.save_path is None else str(server.save_path),
            "dropped": server.dropped,
            "rejected": server.rejected,
        },
        path,
    )


def check_checkpoint_owner(path: str | os.PathLike, save_path: str | None) -> None:
    """Refuse, before the first round, a checkpoint at ``path`` written by a run with another
    ``save-path``: two runs given their own save-path but one checkpoint-path would otherwise
    resume from, or overwrite, each other's state. A file that is not a whole checkpoint is left to
    ``resume_from`` (which refuses it) or overwritten by a run that starts afresh."""
    saved, verified = load_verified(path)
    if not verified or "save_path" not in saved:
        return
    owner = saved["save_path"]
    if owner != (None if save_path is None else str(save_path)):
        raise ValueError(
            f"checkpoint-path {path} holds the state of the run saved to {owner}, not this run's "
            f"save-path {save_path}: give each run its own checkpoint-path (e.g. --run-config "
            f"'checkpoint-path=\"{Path(save_path or 'run').stem}.state.pt\"'), or resume that run with "
            f"its own save-path"
        )


def resume_from(server: Any, driver: RoundDriver, path: str | os.PathLike) -> int:
    """Load the checkpoint at ``path`` into the server and ``driver``; the round to go on from.
    Refused, by name, for a file that is not whole, another algorithm or configuration, another
    federation, or a run whose nodes held state the server cannot restore."""
    plan, state = server.plan, driver.state
    held = node_only_state(plan)
    if held:
        listed = " and ".join([", ".join(held[:-1]), held[-1]] if len(held) > 1 else held)
        raise ValueError(
            f"cannot resume this {plan.name} run from {path}: its nodes held {listed}, which ended "
            "with the run that stopped, so it would not go on exactly; start it afresh (resume=false)"
        )
    saved, verified = load_verified(path)
    if not verified or "round" not in saved:
        raise ValueError(
            f"{path} is not a Flower server checkpoint (checkpoint-path): give the one the run wrote"
        )
    differences = check_resumable(
        saved["metadata"], plan.name, plan.rule, state.client_state, schedule_config(plan)
    )
    if differences:
        log.warning("resuming %s with a changed configuration: %s", plan.name, "; ".join(differences))
    if saved["client_state"]["omega"].shape != state.client_state.omega.shape:
        raise ValueError(
            f"{path} holds {tuple(saved['client_state']['omega'].shape)} clients x clusters but this "
            f"federation has {tuple(state.client_state.omega.shape)}: resume with the nodes and datamodule "
            "that wrote it"
        )
    server.module.load_state_dict(saved["state_dict"])
    state.client_state.load_state_dict(saved["client_state"])
    if state.server_optimizer is not None:
        state.server_optimizer.load_state_dict(saved["server_optimizer"])
    server.solver.load_state_dict(saved["solver"])
    for entry, scheduler in zip(state.schedulers.entries, saved["schedulers"], strict=True):
        entry.scheduler.load_state_dict(scheduler)
    server.found.pushed.clear()
    server.found.pushed.update(saved["pushed"])
    driver.first_loss, driver.chance_rounds = saved["checks"]["first_loss"], saved["checks"]["chance_rounds"]
    server.metrics = saved["metrics"]
    server.found.dropped.clear()
    server.found.dropped.update(saved["dropped"])
    server.found.rejected.clear()
    server.found.rejected.update(saved["rejected"])
    log.info("resuming from %s after round %d of %d", Path(path), saved["round"] + 1, server.num_rounds)
    return int(saved["round"]) + 1
