"""What a checkpoint records besides the weights: the client store, which algorithm with which
configuration wrote it, what ``global_step`` counts (rounds), and the server optimizer's state.
Resuming is refused, with a message naming both sides, under another algorithm, with other
algorithm-specific client state or another server optimizer, from the middle of a round (an
earlier version's checkpoint: its working copies held a client's local weights), or from an
earlier version's checkpoint whose ``global_step`` counted client-steps."""

from __future__ import annotations

from dataclasses import is_dataclass
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_fedcluster.algorithms.base import Algorithm
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.engine.copies import local_optimizer
from lightning_fedcluster.engine.plan import TrainingPlan
from lightning_fedcluster.engine.server_optimizer_state import SERVER_OPTIMIZER_KEY, ServerOptimizer

CLIENT_STATE_KEY = "fedcluster_client_state"
METADATA_KEY = "fedcluster_metadata"
_PLAIN = (int, float, bool, str, type(None))


def algorithm_config(rule: Algorithm) -> dict[str, Any]:
    """The rule's settings that fit in a checkpoint as plain values: its options (the fields of
    ``rule.config``) and its other public attributes (K; a user's rule may keep its own)."""
    config: dict[str, Any] = {}
    options = vars(rule.config) if is_dataclass(getattr(rule, "config", None)) else {}
    for name, value in sorted({**vars(rule), **options}.items()):
        if name.startswith("_"):
            continue
        plain_tuple = isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)
        if isinstance(value, _PLAIN) or plain_tuple:
            config[name] = value
    return config


# The strategy's round settings a resumed run may change (each change is listed in a warning).
SCHEDULE_SETTINGS = (
    "clients_per_round",
    "local_steps",
    "local_epochs",
    "drop_last",
    "server_lr",
    "seed",
    "finetune_epochs",
)


def schedule_config(plan: Any) -> dict[str, Any]:
    """The run's round settings (clients per round, local work, server step, seed)."""
    return {name: getattr(plan, name, None) for name in SCHEDULE_SETTINGS}


STEP_UNIT = "round"
"""What Lightning's ``global_step`` counts in a checkpoint's run (``metadata["global_step"]``): one
step per round. Checkpoints without it were written when it counted client-steps."""


def metadata(
    name: str,
    rule: Algorithm,
    state: ClientState | None,
    round_in_progress: int | None,
    schedule: dict[str, Any] | None = None,
    rounds_trained: int = 0,
) -> dict[str, Any]:
    return {
        "algorithm": name,
        "config": algorithm_config(rule),
        "schedule": schedule or {},
        "client_state_keys": sorted(state.extra) if state is not None else [],
        "round_in_progress": round_in_progress,
        "rounds_trained": rounds_trained,
        "global_step": STEP_UNIT,
    }


def check_step_unit(ckpt: dict[str, Any]) -> None:
    """Refuse to resume a fit from a checkpoint whose ``global_step`` counted client-steps (an
    earlier lightning-fedcluster): Lightning would go on counting from its step, so ``max_steps``
    and step-named checkpoints would mix the two units. Testing and predicting with it work."""
    saved = ckpt.get(METADATA_KEY) or {}
    if saved.get("global_step") == STEP_UNIT:
        return
    rounds = saved.get("rounds_trained", ckpt.get("epoch", 0) + 1)
    raise ValueError(
        f"the checkpoint was written by an earlier lightning-fedcluster, whose global_step counted "
        f"client-steps (global_step={ckpt.get('global_step')} after {rounds} rounds); this version counts "
        "one step per round, so a resumed fit would count max_steps and step-named checkpoints in both "
        "units. Resume it with the version that wrote it; trainer.test / trainer.predict / "
        "trainer.validate with ckpt_path= read it as it is"
    )


def check_resumable(
    saved: dict[str, Any] | None,
    name: str,
    rule: Algorithm,
    state: ClientState | None,
    schedule: dict[str, Any] | None = None,
) -> list[str]:
    """Raise a ValueError when the checkpoint cannot continue this run of algorithm ``name``;
    return the configuration differences that are allowed (for a warning). A checkpoint
    without metadata predates it."""
    if saved is None:
        return []
    if saved["algorithm"] != name:
        raise ValueError(
            f"the checkpoint was written by {saved['algorithm']} but this run trains {name}: resume with "
            f"the strategy that wrote it ({saved['algorithm']}), or start {name} from scratch (a new "
            "Trainer without ckpt_path)"
        )
    keys = sorted(state.extra) if state is not None else []
    if saved["client_state_keys"] != keys:
        raise ValueError(
            f"the checkpoint's {name} client state holds {saved['client_state_keys']} but this run's {name} "
            f"configuration keeps {keys}: resume with the configuration that wrote it "
            f"(checkpoint: {saved['config']})"
        )
    if saved["round_in_progress"] is not None:
        raise ValueError(
            f"the checkpoint was taken in the middle of round {saved['round_in_progress'] + 1} (not at a "
            "round "
            "boundary, so it does not hold that round's aggregated weights): resume from a round-boundary "
            "checkpoint, such as the default ModelCheckpoint's (saved at every round end) or "
            "ModelCheckpoint(every_n_epochs=1)"
        )
    differences = _differences(saved["config"], algorithm_config(rule))
    if saved.get("schedule") and schedule:  # a checkpoint without the schedule predates it
        differences += _differences(saved["schedule"], schedule)
    return differences


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """ "key: checkpoint a → now b" for every setting that differs."""
    return [
        f"{key}: checkpoint {saved.get(key)!r} → now {current.get(key)!r}"
        for key in sorted(set(current) | set(saved))
        if saved.get(key) != current.get(key)
    ]


def load_server_optimizer(server_optimizer: ServerOptimizer | None, ckpt: dict[str, Any]) -> None:
    """Restore the server optimizer's state; refuse a checkpoint written with another one."""
    saved = ckpt.get(SERVER_OPTIMIZER_KEY)
    if server_optimizer is not None and saved is None and METADATA_KEY in ckpt:
        raise ValueError(
            f"the checkpoint holds no server optimizer state but this run uses "
            f"server_optimizer={server_optimizer.config.kind!r}: resume with server_optimizer='none'"
        )
    if saved is not None and server_optimizer is None:
        raise ValueError(
            f"the checkpoint holds server_optimizer={saved['kind']!r} state but this run uses "
            "server_optimizer='none': resume with the server optimizer that wrote it"
        )
    if server_optimizer is not None and saved is not None:
        server_optimizer.load_state_dict(saved)


def saved_num_clusters(ckpt: dict[str, Any]) -> int | None:
    """K of the ClusteredModule that wrote ``ckpt``: its cluster models ``models.<k>.*`` (None
    when the state dict holds none)."""
    indices = {key.split(".")[1] for key in ckpt.get("state_dict", {}) if key.startswith("models.")}
    return len(indices) if indices else None


def check_num_clusters(ckpt: dict[str, Any], num_clusters: int) -> None:
    """Refuse, naming both K, a checkpoint with another number of cluster models (Lightning would
    fail later on the optimizer's parameter groups or the state dict, never saying so)."""
    saved = saved_num_clusters(ckpt)
    if saved is not None and saved != num_clusters:
        raise ValueError(
            f"the checkpoint has K={saved} cluster models, this run K={num_clusters}: resume with "
            f"num_clusters={saved}, or start a {num_clusters}-cluster fit without ckpt_path"
        )


def check_solver_layout(saved: dict[str, Any], optimizer: Any) -> None:
    """Resuming a fit restores the local solver's state: refuse, before Lightning fails deep in
    torch, a checkpoint whose parameter groups differ from this run's solver (a checkpoint written
    before the solver became copy 0's optimizer with every copy's parameters in its groups, or with
    another model, K or shared_layers)."""
    saved_sizes = [len(group["params"]) for group in saved.get("param_groups", [])]
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    if saved_sizes != sizes:
        raise ValueError(
            f"the checkpoint's optimizer state has parameter groups of {saved_sizes} tensors but this run's "
            f"local solver has {sizes} (copy 0's configure_optimizers with the other copies' parameters "
            "in the same groups): it was written by an older lightning-fedcluster (before the local solver "
            "was one optimizer over the K copies) or with another model, num_clusters or shared_layers. "
            "Start a new fit without ckpt_path from its weights: "
            "module.load_state_dict(torch.load(path)['state_dict'])"
        )


def checkpoint_entries(
    plan: TrainingPlan,
    state: ClientState | None,
    server_optimizer: ServerOptimizer | None,
    rounds_trained: int,
) -> dict[str, Any]:
    """What a fit adds to a Lightning checkpoint besides the weights: the server optimizer's state,
    the client store and the metadata above (none of the three where there is nothing to save)."""
    entries: dict[str, Any] = {}
    if server_optimizer is not None:
        entries[SERVER_OPTIMIZER_KEY] = server_optimizer.state_dict()
    if state is None:
        return entries
    entries[CLIENT_STATE_KEY] = state.state_dict()
    schedule = schedule_config(plan)
    entries[METADATA_KEY] = metadata(plan.name, plan.rule, state, None, schedule, rounds_trained)
    return entries


def check_checkpoint(ckpt: dict[str, Any], num_clusters: int, models: Any, trainer: Any) -> None:
    """Refuse, before anything is restored, a checkpoint of another K and, when it resumes a fit,
    one whose ``global_step`` counted client-steps or whose solver has other parameter groups."""
    check_num_clusters(ckpt, num_clusters)
    fitting = trainer is not None and trainer.state.fn == TrainerFn.FITTING
    if fitting and "loops" in ckpt:  # resuming a fit (not a checkpoint of weights alone)
        check_step_unit(ckpt)
    if fitting and ckpt.get("optimizer_states"):
        check_solver_layout(ckpt["optimizer_states"][0], local_optimizer(models, trainer))


def restore_client_state(
    state: ClientState, saved: dict[str, Tensor], saved_metadata: dict[str, Any] | None, plan: TrainingPlan
) -> None:
    """Load a checkpoint's client store into ``state`` after ``check_resumable``; the allowed
    configuration changes are listed in a warning."""
    differences = check_resumable(saved_metadata, plan.name, plan.rule, state, schedule_config(plan))
    if differences:
        rank_zero_warn(f"resuming {plan.name} with a changed configuration: " + "; ".join(differences))
    state.load_state_dict(saved)


def resume_hint(trainer: Any) -> str:
    """What to do after Ctrl-C stopped a fit: the last round-boundary checkpoint of the trainer's
    ModelCheckpoint callbacks and how to resume from it (``--ckpt_path`` / ``ckpt_path=``)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    saved = [
        c.last_model_path or c.best_model_path for c in trainer.callbacks if isinstance(c, ModelCheckpoint)
    ]
    path = next((p for p in saved if p), None)
    module = trainer.lightning_module
    where = f"training stopped in round {trainer.current_epoch + 1} of {trainer.max_epochs}"
    if path is None:
        return (
            f"{where} ({getattr(module, 'rounds_trained', 0)} rounds done) and no checkpoint was saved "
            "(checkpointing is off, or no round had ended): nothing to resume from; a ModelCheckpoint "
            "(on by default) saves one at every round end"
        )
    return (
        f"{where}. To resume from the last round-boundary checkpoint, {path}: fedcluster fit <the same "
        f"arguments> --ckpt_path {path} (Python: trainer.fit(module, datamodule=dm, ckpt_path={path!r})); "
        "the resumed run trains the same weights as an uninterrupted one"
    )
