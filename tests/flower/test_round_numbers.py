"""One round numbering wherever a user reads a round (docs/concepts.md, "Round numbers"): rounds
are counted from 1, round t being the t-th, after which ``global_step`` is t. The console's
progress and event lines, TensorBoard's text and scalar steps and a Flower run's log, TensorBoard
and run file all name the same round for the same event, and ``group_round=2`` groups after
round 2. They were read side by side: the events said "round 1" for what the progress line,
TensorBoard and the options called round 2, and a Flower run file keyed the rounds its log named
2 and 3 as 1 and 2."""

from __future__ import annotations

import io
import logging

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.callbacks import ClusterMonitor, RoundProgressBar
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.flower import FlowerApps
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer
from tests.flower import workload
from tests.flower.local_grid import partitions, run_local
from tests.helpers.tensorboard_text import event_texts

NODE_B = 101  # the second node of ``partitions(2)``


def _scalar_steps(log_dir: str, tag: str) -> list[int]:
    events = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def test_a_fit_names_each_round_alike_on_the_console_and_in_tensorboard(tmp_path, caplog):
    stream = io.StringIO()
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="run")
    strategy = lf.FedRCStrategy(3, clients_per_round=6, local_steps=2, config=FedRC.Config(group_round=2))
    callbacks = [RoundProgressBar(3, stream), ClusterMonitor(figures=False)]
    trainer = make_trainer(
        strategy, 3, logger=logger, limit_val_batches=0, enable_progress_bar=True, callbacks=callbacks
    )
    # the events' rank_zero_info, read where pytest collects every record (a handler on the named
    # logger missed them after other test files had run in the same process)
    caplog.set_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero")
    trainer.fit(MLPClassifier(), datamodule=DigitsFederated(num_clients=12, concepts=2, seed=0))
    logger.experiment.flush()
    (event,) = [line for line in caplog.messages if "grouped" in line]
    assert event.startswith("round 2: grouped"), event  # group_round=2: the grouping after round 2
    progress = stream.getvalue().splitlines()
    assert [line.split()[1] for line in progress] == ["1/3", "2/3", "3/3"]
    assert event_texts(logger.log_dir) == {2: event}  # TensorBoard: at round 2's step, as said
    assert _scalar_steps(logger.log_dir, "train/loss") == [1, 2, 3]


def _silent_in_the_second_round(node, message):
    """Node B does not answer the second round's train message (its group id is the round's
    position from 0, a message field no user reads)."""
    train = message.metadata.message_type == "train"
    return "silent" if train and node == NODE_B and message.metadata.group_id == "1" else None


def test_a_flower_run_names_each_round_alike_in_its_log_tensorboard_and_run_file(
    tmp_path, caplog, task_identity
):
    saved, logs = tmp_path / "run.pt", tmp_path / "logs"

    def strategy() -> lf.FedRCStrategy:
        return lf.FedRCStrategy(2, local_steps=2, config=FedRC.Config(group_round=2), executor="loop")

    apps = FlowerApps(
        strategy, workload.make_module, workload.make_datamodule, num_rounds=3, round_timeout=5.0,
        save_path=str(saved), log_dir=str(logs),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="lightning_fedcluster.flower"):
        run_local(apps, partitions(2), _silent_in_the_second_round)
    text = caplog.text
    assert f"round 2: node {NODE_B} (partition 1) failed" in text
    (event,) = [r.getMessage() for r in caplog.records if "grouped" in r.getMessage()]
    assert event.startswith("round 2: grouped"), event
    assert "round 2/3, " in text
    run = torch.load(saved)
    assert list(run["dropped"]) == [2], run["dropped"]  # the round the log named
    assert len(run["metrics"]) == 3
    assert event_texts(str(logs)) == {2: event}
    assert _scalar_steps(str(logs), "train/loss") == [1, 2, 3]


def test_a_flower_run_hands_discovery_components_its_rounds(task_identity):
    from tests.algorithms.discovery.test_runner import Rounds

    rounds = Rounds()

    def strategy() -> lf.FederatedStrategy:
        rule = lf.algorithms.FedRC(2, components=(rounds,))
        return lf.FederatedStrategy(algorithm=rule, local_steps=2, executor="loop")

    apps = FlowerApps(strategy, workload.make_module, workload.make_datamodule, num_rounds=3)
    run_local(apps, partitions(2))
    assert rounds.seen == [(0, 3), (1, 3), (2, 3)]  # as the Lightning engine's max_epochs
