"""Checks of the user's model before training (a clear error now instead of a wrong run later),
and the divergence warning during training."""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from lightning_fedcluster.engine.host import FederatedRun
from lightning_fedcluster.engine.outputs import LogitsFrom, select_logits
from lightning_fedcluster.engine.task import Task

# Rows of the first client the output checks forward.
SAMPLE_ROWS = 8
FLAT_DATA_FIX = (
    "give the datamodule image-shaped inputs: image_shape=(C, H, W) in "
    "FederatedDataModule.from_tensors, or --data.image_shape=[C,H,W] for a tensor file (both serve "
    "flat rows as [N, C, H, W] images), DigitsFederated(as_images=True) "
    "(--data.init_args.as_images=true), or x reshaped to [N, C, H, W]"
)
"""How to turn flat inputs into images, for the errors a convolutional model meets on flat data."""
# A round loss this many times the first round's means the run diverged.
LOSS_GROWTH_FACTOR = 100.0


def check_training_setup(
    run: FederatedRun | None, datamodule: Any, num_clusters: int, datamodule_type: type
) -> None:
    """A federated strategy handed in (``run``: one that builds a ``TrainingPlan``) and a
    datamodule whose K agrees with the module's."""
    if run is None:
        raise TypeError(
            "ClusteredModule trains, tests and predicts under a federated strategy, which hands it the run "
            "when the trainer connects it; this trainer's strategy is not one: pass the one it trained with, "
            "e.g. Trainer(strategy=FedRCStrategy(num_clusters=3))"
        )
    if not isinstance(datamodule, datamodule_type):
        raise TypeError(
            "ClusteredModule needs a FederatedDataModule: call trainer.fit(module, datamodule=dm) "
            "with dm built by FederatedDataModule.from_tensors(...) or e.g. DigitsFederated()"
        )
    if run.num_clusters != num_clusters:
        raise ValueError(
            f"the strategy has num_clusters={run.num_clusters} but the ClusteredModule holds "
            f"{num_clusters} cluster models: make them agree"
        )


def check_rule_on_model(rule: Any, model: nn.Module) -> None:
    """The rule's options that name the model's parameters (FeSEM/WeCFL's
    ``representation_layers``) must match some: checked where the cluster models exist (the
    Lightning module's setup, the Flower server), never through a strategy, which under
    ``simulate`` holds no module."""
    if rule.capabilities.model_distances:
        rule.representation_mask([name for name, _ in model.named_parameters()])


def check_output_shape(model: nn.Module, datamodule: Any, task: Task, logits_from: LogitsFrom = None) -> None:
    """``model.forward`` (read through ``logits_from``) must give logits [batch, num_classes] (or
    predictions shaped like the targets, regression) for this datamodule; probabilities warn. Runs
    where the model's parameters are (``setup`` comes before Lightning moves the module to its
    device), on a few rows of the first client."""
    device = next(model.parameters()).device
    x, y = datamodule.train_split(0)
    name = type(model).__name__
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            raw = model(x[:SAMPLE_ROWS].to(device))
    except Exception as error:  # a conv model on flat rows: the shape is the cause, say how to fix it
        if x.ndim == 2 and any(isinstance(m, nn.Conv2d) for m in model.modules()):
            raise ValueError(
                f"{name} has 2-D convolutions but {type(datamodule).__name__} serves flat inputs "
                f"{tuple(x.shape)}: {FLAT_DATA_FIX}"
            ) from error
        explained = input_shape_error(name, x, error, "the datamodule's")
        if explained is error:
            raise
        raise explained from error
    finally:
        model.train(was_training)
    try:
        out = select_logits(raw, logits_from, name)
    except (KeyError, IndexError, TypeError, AttributeError) as error:  # from a logits_from callable
        raise ValueError(
            f"logits_from={logits_from!r} failed on {name}.forward's output: {error!r}"
        ) from error
    got = tuple(out.shape)
    source = f"{name}.forward" + (
        "" if logits_from is None else f" (read through logits_from={logits_from!r})"
    )
    if task is Task.REGRESSION:
        expected = tuple(y[:2].shape)
        if out.shape[0] != min(SAMPLE_ROWS, y.shape[0]) or out[0].numel() != y[0].numel():
            raise ValueError(
                f"{source} must return predictions shaped like the targets "
                f"{expected} (per sample {tuple(y.shape[1:])}), got {got}: set the model's output size"
            )
        return
    if out.dim() != 2 or out.shape[1] != datamodule.num_classes:
        lowest = unused_low_labels(datamodule)
        if lowest and out.dim() == 2 and out.shape[1] == datamodule.num_classes - lowest:
            raise ValueError(
                f"{source} returns {out.shape[1]} logits per sample but the datamodule has num_classes="
                f"{datamodule.num_classes}: its labels run from {lowest} to {datamodule.num_classes - 1} "
                f"(no label below {lowest}), and labels must be class indices 0..C-1. Remap them before "
                f"building the datamodule, e.g. y - {lowest} (or torch.unique(y, return_inverse=True)[1] "
                "for any set of labels)"
            )
        raise ValueError(
            f"{source} must return logits of shape [batch, num_classes] = "
            f"[batch, {datamodule.num_classes}] for this datamodule, got {got}: set the model's "
            "output size to the datamodule's num_classes"
        )
    if not callable(getattr(model, "per_sample_loss", None)) and looks_like_probabilities(out):
        rank_zero_warn(
            f"{source} seems to return probabilities (rows >= 0 summing to 1), but the engine takes "
            "them for logits (cross-entropy applies its own softmax), which trains to near chance: return "
            "the logits (drop the final softmax), or pass logits_from= to select the logits from the "
            "output, or define per_sample_loss(batch) for probabilities"
        )


# RuntimeError messages of torch that mean "the model was built for inputs of another shape".
SHAPE_MISMATCHES = (
    re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)"),
    re.compile(r"is invalid for input of size"),
    re.compile(r"[Ee]xpected .*input"),
    re.compile(r"must match the size of tensor"),
    re.compile(r"size mismatch"),
)


def input_shape_error(name: str, x: Tensor, error: Exception, whose: str | None = None) -> Exception:
    """A ValueError explaining torch's shape-mismatch ``error`` from ``name``.forward on ``x``, with
    the fix: for the datamodule's inputs (``whose``) build the model for them, for inputs given
    to a built module give them the model's shape. Any other error comes back unchanged."""
    message = str(error).split("\n")[0]
    matched = [pattern.search(message) for pattern in SHAPE_MISMATCHES]
    if not isinstance(error, RuntimeError) or not any(matched) or isinstance(error, torch.OutOfMemoryError):
        return error
    sample = tuple(x.shape[1:])
    linear = matched[0]
    if linear is not None:
        got, wanted = int(linear.group(2)), int(linear.group(3))
        detail = (
            f"a linear layer of {name} takes {wanted} features per sample but gets {got} (each sample "
            f"has shape {sample}, {math.prod(sample)} values)"
        )
    else:
        detail = f"{name} was built for inputs of another shape than {sample} per sample"
    if whose is None:
        fix = "Give inputs shaped like the samples the module was trained on"
    else:
        fix = (
            f"Build the model for samples of shape {sample} (e.g. its input size), or give inputs of the "
            "shape it was built for (flat images: reshape them to that size)"
        )
    return ValueError(
        f"{name}.forward cannot take {whose or 'the'} inputs of shape {tuple(x.shape)}: {detail}. {fix}. "
        f"torch said: {message}"
    )


def unused_low_labels(datamodule: Any) -> int:
    """The smallest label of the datamodule's data (training, held-out and global clients): > 0
    when the labels do not start at 0 (e.g. 1..10, which makes num_classes 11)."""
    labels = [getattr(datamodule, name, None) for name in ("train_y", "test_y", "global_y")]
    present = [y for y in labels if isinstance(y, Tensor) and y.numel() and not y.is_floating_point()]
    return int(min(int(y.min()) for y in present)) if present else 0


def looks_like_probabilities(out: Tensor) -> bool:
    """Every row non-negative and summing to 1 (a softmax output)."""
    out = out.detach().double()
    return bool((out >= 0).all()) and torch.allclose(out.sum(1), torch.ones_like(out[:, 0]), atol=1e-4)


def check_loss_growth(first: float | None, loss: float, round_index: int) -> float | None:
    """Warn once when the round's training loss exceeds ``LOSS_GROWTH_FACTOR`` times the first
    round's (a learning rate too high trains to chance silently otherwise). Returns the new
    reference: the first round's loss, or ``inf`` once warned (so it warns only once)."""
    if first is None:
        return loss if math.isfinite(loss) and loss > 0 else None
    if loss > LOSS_GROWTH_FACTOR * first:
        rank_zero_warn(
            f"round {round_index + 1}: the training loss {loss:.4g} is over {LOSS_GROWTH_FACTOR:.0f}x "
            f"the first round's ({first:.4g}); training is diverging: lower the learning rate"
        )
        return math.inf
    return first


# Rounds in a row at chance level (after the first aggregation) before the chance warning.
CHANCE_ROUNDS = 3
# Hooks of the user's LightningModule the engine never calls, and what it does instead.
IGNORED_HOOKS = {
    "training_step": "each client's local step minimizes {loss} with the optimizer of configure_optimizers",
    "validation_step": "validation scores every client (val/local_acc, val/global_acc, ...)",
    "test_step": "testing scores every client (test/local_acc, test/global_acc, ...)",
    "predict_step": "trainer.predict returns each row's mixture prediction (ClusteredModule.predict_step)",
}
_LIBRARIES = ("lightning.", "pytorch_lightning.", "lightning_fedcluster.")
# Names whose use in a training_step does more than return a loss (logging, manual optimization).
_BEYOND_THE_LOSS = frozenset(
    {
        "log",
        "log_dict",
        "manual_backward",
        "optimizers",
        "lr_schedulers",
        "toggle_optimizer",
        "untoggle_optimizer",
    }
)
_warned_classes: set[type] = set()  # the not-called warning is given once per module class and process


def warn_before_fit(model: nn.Module, num_clusters: int, datamodule: Any, task: Task) -> None:
    """Warn (before training) about settings the engine accepts but the user likely did not mean:
    more cluster models than clients, and hooks of the user's module it never calls (once per
    module class; not for a ``training_step`` that only returns the engine's own loss)."""
    if num_clusters > datamodule.num_clients:
        rank_zero_warn(
            f"num_clusters={num_clusters} but the datamodule has only {datamodule.num_clients} clients: "
            "with more cluster models than clients some models get little or no data (hard-clustering "
            f"algorithms leave at least {num_clusters - datamodule.num_clients} empty); use num_clusters <= "
            f"{datamodule.num_clients}, the number of distinct data distributions you expect"
        )
    warn_clients_without_rows(datamodule, task)
    ignored = [hook for hook in IGNORED_HOOKS if user_defined(type(model), hook)]
    if "training_step" in ignored and returns_the_engines_loss(model, task):
        ignored.remove("training_step")
    if ignored and type(model) not in _warned_classes:
        _warned_classes.add(type(model))
        name = type(model).__name__
        loss = loss_source(model, task)
        instead = "; ".join(IGNORED_HOOKS[hook].format(loss=loss) for hook in ignored)
        rank_zero_warn(
            f"{name} defines {', '.join(ignored)}, which lightning-fedcluster does not call (nor the "
            f"self.log calls in them): {instead}. The engine uses {name}'s forward, configure_optimizers "
            "and, when defined, per_sample_loss(batch) or criterion; log more with a Callback "
            "(its hooks see trainer.lightning_module.round_metrics and eval_metrics)"
        )


def warn_clients_without_rows(datamodule: Any, task: Task) -> None:
    """Warn when some clients have no validation or no test rows (tiny clients, a small
    ``test_fraction``): they train, but the local metrics pool the other clients' rows only."""
    sizes = {
        "validation": getattr(datamodule, "val_sizes", None),
        "test": getattr(datamodule, "test_sizes", None),
    }
    empty = {split: int((rows == 0).sum()) for split, rows in sizes.items() if rows is not None}
    if not any(empty.values()):
        return
    metric, clients = task.metric, datamodule.num_clients
    no_val, no_test = empty.get("validation", 0), empty.get("test", 0)
    rank_zero_warn(
        f"{no_val} of {clients} clients have no validation rows and {no_test} no test rows: they train "
        f"and are placed in clusters, but val/local_{metric} and "
        f"test/local_{metric} pool the rows of the other clients only (row-weighted), so how well their "
        "clusters fit them is not measured; a larger test_fraction, or fewer and larger clients "
        "(min_client_size), gives each client held-out rows"
    )


def warn_rounds_past_the_run(config: Any, max_epochs: int | None) -> None:
    """Warn before training when a rule's round options (``config.round_options()``: each option
    and its value k, which acts after round k) are at least the run's ``max_epochs`` rounds: no
    round of the run trains with them (at most the final model's evaluation sees them)."""
    options = getattr(config, "round_options", None)
    if options is None or max_epochs is None or max_epochs < 0:
        return
    late = {name: value for name, value in options().items() if value >= max_epochs}
    if late:
        named = ", ".join(f"{name}={value}" for name, value in late.items())
        one = len(late) == 1
        rank_zero_warn(
            f"{named} leave{'s' if one else ''} no round to train after {'it' if one else 'them'}: the "
            f"run has max_epochs={max_epochs} rounds (rounds 1-{max_epochs}) and a round option k acts "
            f"after round k; lower {'it' if one else 'them'} below {max_epochs} or raise max_epochs"
        )


def returns_the_engines_loss(model: nn.Module, task: Task) -> bool:
    """Whether the module's ``training_step`` is the standard one that the engine's local step
    already is: its code names the loss the engine uses (``engine.losses.per_sample_loss``) and
    neither logs nor steps optimizers. Read from the code's names, never run; anything else (a loss
    computed in a helper, an extra term) keeps the warning."""
    code = getattr(type(model).training_step, "__code__", None)
    if code is None:
        return False
    names = set(code.co_names)
    if names & _BEYOND_THE_LOSS:
        return False
    if callable(getattr(model, "per_sample_loss", None)):
        return "per_sample_loss" in names
    if getattr(model, "criterion", None) is not None:
        return "criterion" in names
    losses = {"cross_entropy", "CrossEntropyLoss"} if task.is_classification else {"mse_loss", "MSELoss"}
    return bool(names & losses)


def user_defined(cls: type, hook: str) -> bool:
    """Whether ``hook`` comes from the user's class (not Lightning's or this library's)."""
    for klass in cls.__mro__:
        if hook in vars(klass):
            return not f"{klass.__module__}.".startswith(_LIBRARIES)
    return False


def loss_source(model: nn.Module, task: Task) -> str:
    """Where the engine's per-sample loss comes from, in words (``engine.losses.per_sample_loss``)."""
    name = type(model).__name__
    if callable(getattr(model, "per_sample_loss", None)):
        return f"{name}.per_sample_loss(batch)"
    if getattr(model, "criterion", None) is not None:
        return f"{name}.criterion (per sample)"
    return "the cross-entropy of forward's logits" if task.is_classification else "the squared error"


def check_chance_level(rounds: int, metrics: dict[str, float], round_index: int, num_classes: int) -> int:
    """Warn once when training stays at chance: the round's training loss at or above log C (the
    loss of a uniform guess) and its accuracy at most 2/C, for ``CHANCE_ROUNDS`` rounds in a row
    after the first aggregation (a learning rate so high that the model collapsed to a constant
    prediction, without the loss growing 100x). Returns the rounds in a row so far (-1 once warned).
    Healthy runs fall below log C from their first aggregated round on."""
    if rounds < 0 or num_classes < 2 or round_index == 0 or "train/acc" not in metrics:
        return rounds
    loss, accuracy = metrics["train/loss"], metrics["train/acc"]
    if not (loss >= math.log(num_classes) and accuracy <= 2.0 / num_classes):
        return 0
    rounds += 1
    if rounds < CHANCE_ROUNDS:
        return rounds
    rank_zero_warn(
        f"round {round_index + 1}: training is at chance level for {rounds} rounds (loss {loss:.4g} >= log "
        f"{num_classes} = {math.log(num_classes):.4g}, the loss of a uniform guess; accuracy {accuracy:.3f} "
        f"for 1/{num_classes} = {1 / num_classes:.3f}): the learning rate is most likely too high (the "
        "model collapsed to a constant prediction): lower it, e.g. tenfold"
    )
    return -1
