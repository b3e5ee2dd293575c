"""`FederatedDataModule`: every client's train/validation/test split plus the global test clients.

Splits are stored concatenated (one tensor per split and an offsets vector) so memory is
O(data) and a client's data is a slice view. Each client's held-out rows are split into a
validation and a test part, and every global client into validation/test x adapt/score parts
(`evaluation_splits`), so that validation never looks at test rows and an unseen client is never
scored on the rows it adapts on. `build_scenario` constructs the FedRC scenario
(label, feature and concept shift; App. H.8 of the paper) from any labelled tensors.

The datamodule itself lives here; `scenario` (build_scenario), `clients` (build_clients,
dataset_to_tensors), `validation` (input checks) and `metadata` (ClientMetadata) hold the rest,
re-exported from this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
from torch import Tensor

from lightning_fedcluster.datamodules.builders import ScenarioBuilders
from lightning_fedcluster.datamodules.clients import build_clients, dataset_to_tensors
from lightning_fedcluster.datamodules.evaluation_splits import (
    adapt_fraction_arg,
    carve_evaluation_rows,
    val_share_arg,
)
from lightning_fedcluster.datamodules.loaders import evaluation_dataloader, round_dataloader
from lightning_fedcluster.datamodules.metadata import ClientMetadata
from lightning_fedcluster.datamodules.scenario import build_scenario
from lightning_fedcluster.datamodules.storage import check_stage_part, client_slice, concatenate
from lightning_fedcluster.datamodules.validation import TASKS as TASKS  # re-exported
from lightning_fedcluster.datamodules.validation import (
    Split,
    check_batch_size,
    check_finite_split,
    check_labels,
    check_num_classes_arg,
    clean_splits,
    int_arg,
    task_arg,
)
from lightning_fedcluster.engine.task import Task

__all__ = [
    "ClientMetadata",
    "FederatedDataModule",
    "build_clients",
    "build_scenario",
    "dataset_to_tensors",
]


class FederatedDataModule(ScenarioBuilders["FederatedDataModule"], pl.LightningDataModule):
    """Participating clients (train + validation + test split each) and non-participating global
    test clients.

    `client_train[i]`, `client_test[i]` and `global_test[g]` are (x, y) pairs; x is float of any
    per-sample shape. `client_test[i]` holds client i's held-out rows (never trained on); they may
    be empty, the training rows may not. Client i's training rows are
    `train_x[train_offsets[i]:train_offsets[i+1]]`.

    Honest evaluation (`evaluation_splits`): each client's held-out rows are split once into
    validation (`val_share`, `val_x/val_y/val_offsets`) and test (`test_x/...`), and each global
    client into validation/test x adapt (`adapt_fraction`, where its mixture weights are fitted)
    and score parts, so validation never looks at test rows and no unseen client is scored on the
    rows it adapted on; `evaluation_split(stage, part)` gives every part, `global_x/...` the whole.

    The task follows the targets: integer labels y [N] make a classification task (`num_classes`
    given or inferred); float targets y [N] or [N, D] with `num_classes=None` make a regression
    task (`task == "regression"`, `num_classes is None`, `target_shape` = () or (D,)).
    `task` may also be given explicitly to have the targets checked against it.

    Args:
        val_share: share of held-out rows used for validation, in (0, 1) (0 would reuse test rows).
        adapt_fraction: share of a global client's validation/test rows it adapts on, in (0, 1).
        seed: seed of the validation/test and adapt/score draws (integer >= 0).
    """

    rounds: Callable[[], int] | None = None  # handed over by the module (``serve_rounds``)

    def __init__(
        self,
        client_train: Sequence[tuple[Tensor, Tensor]],
        client_test: Sequence[tuple[Tensor, Tensor]],
        global_test: Sequence[tuple[Tensor, Tensor]] = (),
        *,
        num_classes: int | None = None,
        batch_size: int = 32,
        metadata: ClientMetadata | None = None,
        task: Task | str | None = None,
        val_share: float = 0.5,
        adapt_fraction: float = 0.4,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_batch_size(batch_size)
        self._val_share = val_share_arg(val_share)
        self._adapt_fraction = adapt_fraction_arg(adapt_fraction)
        self._seed = int_arg("seed", seed, 0)
        if num_classes is not None:
            check_num_classes_arg(num_classes)
        task = task_arg(task, num_classes, client_train)
        train = clean_splits("client_train", client_train, task)
        test = clean_splits("client_test", client_test, task)
        held = clean_splits("global_test", global_test, task)
        if not train:
            raise ValueError("client_train is empty: pass one (x, y) training split per client")
        if len(test) != len(train):
            raise ValueError(
                f"client_test has {len(test)} clients but client_train has {len(train)}: pass one "
                "test split per client (an empty one is allowed)"
            )
        for i, (_, y) in enumerate(train):
            if y.numel() == 0:
                raise ValueError(
                    f"client_train[{i}] is empty: every client needs at least one training "
                    "sample; drop it or repartition"
                )
        sample_shape = tuple(train[0][0].shape[1:])
        target_shape = tuple(train[0][1].shape[1:])
        shapes = (sample_shape, target_shape, train[0][1].dtype)
        self.train_x, self.train_y, self.train_offsets = concatenate("client_train", train, *shapes)
        held_x, held_y, held_offsets = concatenate("client_test", test, *shapes)
        del test
        self.global_x, self.global_y, self.global_offsets = concatenate("global_test", held, *shapes)
        self._task = task
        self._target_shape = target_shape
        self._num_classes: int | None = None
        if task is Task.CLASSIFICATION:
            labelled = {
                "client_train": (self.train_y, self.train_offsets),
                "client_test": (held_y, held_offsets),
                "global_test": (self.global_y, self.global_offsets),
            }
            if num_classes is None:
                num_classes = max(int(y.max()) + 1 for y, _ in labelled.values() if y.numel())
                if num_classes < 2:
                    raise ValueError(
                        f"num_classes was inferred as {num_classes} from the labels; pass "
                        "num_classes >= 2 explicitly"
                    )
            for name, (y, offsets) in labelled.items():
                check_labels(name, y, offsets, num_classes)
            self._num_classes = int(num_classes)
        self.batch_size = batch_size
        self._metadata = self._check_metadata(metadata)
        # The splits as given (held-out rows whole), so messages name the caller's rows.
        check_finite_split("client_train", self.train_x, self.train_y, self.train_offsets)
        check_finite_split("client_test", held_x, held_y, held_offsets)
        check_finite_split("global_test", self.global_x, self.global_y, self.global_offsets)
        self._split_for_evaluation(held_x, held_y, held_offsets)

    @classmethod
    def _construct(
        cls, arguments: dict[str, Any], batch_size: int, val_share: float, adapt_fraction: float, seed: int
    ) -> FederatedDataModule:
        """The datamodule holding built clients ``arguments`` (``from_tensors``/``from_partition``).
        Subclasses with their own constructor (e.g. DigitsFederated) cannot take these arguments:
        they get a FederatedDataModule."""
        target = cls if cls.__init__ is FederatedDataModule.__init__ else FederatedDataModule
        options = dict(batch_size=batch_size, val_share=val_share, adapt_fraction=adapt_fraction, seed=seed)
        return target(**arguments, **options)

    def _split_for_evaluation(self, held_x: Tensor, held_y: Tensor, held_offsets: Tensor) -> None:
        """Carve validation out of the held-out rows and plan the global adapt/score parts."""
        shares = (self._val_share, self._adapt_fraction, self._seed)
        rows = carve_evaluation_rows(held_x, held_y, held_offsets, self.global_offsets, *shares)
        self.val_x, self.val_y, self.val_offsets = rows.val
        self.test_x, self.test_y, self.test_offsets = rows.test
        self._positions, self._global_parts = rows.positions, rows.global_parts

    def check_finite(self) -> None:
        """Raise ValueError if any split holds NaN or Inf in its inputs x or float targets y.

        Called at construction (every path: the constructor, `from_tensors`, `from_partition`,
        subclasses; there the held-out rows are checked as given, before their validation/test
        split) and again in `setup`, so tensors edited afterwards (e.g. normalised in place) are
        caught before training too: training, validation ("client_val"), test and global rows.
        The global adapt/score parts are gathered from `global_x`/`global_y` on each
        `evaluation_split` call, so checking those covers them. One `isfinite` pass per split
        tensor; the offending client is located from the offsets only when something is wrong.
        """
        check_finite_split("client_train", self.train_x, self.train_y, self.train_offsets)
        check_finite_split("client_val", self.val_x, self.val_y, self.val_offsets)
        check_finite_split("client_test", self.test_x, self.test_y, self.test_offsets)
        check_finite_split("global_test", self.global_x, self.global_y, self.global_offsets)

    def setup(self, stage: str | None = None) -> None:
        """Lightning calls this before fit/validate/test: re-check the splits are finite."""
        self.check_finite()

    def _check_metadata(self, metadata: ClientMetadata | None) -> ClientMetadata:
        if metadata is None:
            return ClientMetadata.default(self.num_clients, self.num_global_clients)
        if not isinstance(metadata, ClientMetadata):
            raise TypeError(f"metadata must be a ClientMetadata or None, got {type(metadata).__name__}")
        if metadata.concept.numel() != self.num_clients:
            raise ValueError(
                f"metadata.concept has {metadata.concept.numel()} entries but there are "
                f"{self.num_clients} clients: give one per client"
            )
        if metadata.global_concept.numel() != self.num_global_clients:
            raise ValueError(
                f"metadata.global_concept has {metadata.global_concept.numel()} entries but there "
                f"are {self.num_global_clients} global test clients: give one per global client"
            )
        return metadata

    @property
    def num_clients(self) -> int:
        """Number of participating clients M."""
        return self.train_offsets.numel() - 1

    @property
    def num_global_clients(self) -> int:
        """Number of non-participating global test clients G (one per concept in scenarios)."""
        return self.global_offsets.numel() - 1

    @property
    def num_classes(self) -> int | None:
        """Number of classes C for classification; None for a regression task."""
        return self._num_classes

    @property
    def task(self) -> Task:
        """Task.CLASSIFICATION (integer labels, cross-entropy) or Task.REGRESSION (float targets,
        MSE); a ``str`` enum, equal to "classification" / "regression"."""
        return self._task

    @property
    def target_shape(self) -> tuple[int, ...]:
        """Per-sample target shape: () for labels and scalar targets, (D,) for y of shape [N, D]."""
        return self._target_shape

    @property
    def output_size(self) -> int:
        """Width of the model output the task needs: C logits, or D (1 for scalar) regression outputs."""
        if self._num_classes is not None:
            return self._num_classes
        return math.prod(self._target_shape)

    @property
    def metadata(self) -> ClientMetadata:
        return self._metadata

    @property
    def train_sizes(self) -> Tensor:
        """Training samples per client, LongTensor [M]."""
        return self.train_offsets.diff()

    @property
    def val_sizes(self) -> Tensor:
        """Validation samples per client, LongTensor [M] (entries may be 0)."""
        return self.val_offsets.diff()

    @property
    def test_sizes(self) -> Tensor:
        """Test samples per client, LongTensor [M] (entries may be 0); the held-out rows not
        taken for validation."""
        return self.test_offsets.diff()

    @property
    def val_share(self) -> float:
        """Share of each client's held-out rows (and each global client's rows) for validation."""
        return self._val_share

    @property
    def adapt_fraction(self) -> float:
        """Share of a global client's validation/test rows it adapts on (the rest are scored)."""
        return self._adapt_fraction

    @property
    def seed(self) -> int:
        """Seed of the validation/test and adapt/score splits."""
        return self._seed

    def train_split(self, i: int) -> Split:
        """Client i's training (x, y), as views of the concatenated tensors."""
        return client_slice(self.train_x, self.train_y, self.train_offsets, i, "i", self.num_clients)

    def val_split(self, i: int) -> Split:
        """Client i's validation (x, y), as views; may be empty. Disjoint from its test rows."""
        return client_slice(self.val_x, self.val_y, self.val_offsets, i, "i", self.num_clients)

    def test_split(self, i: int) -> Split:
        """Client i's test (x, y), as views; may be empty. Disjoint from its validation rows."""
        return client_slice(self.test_x, self.test_y, self.test_offsets, i, "i", self.num_clients)

    def evaluation_split(self, stage: str, part: str) -> tuple[Tensor, Tensor, Tensor]:
        """The rows one evaluation stage reads, as (x, y, offsets).

        `stage` is "val" or "test"; `part` is "local" (the participating clients' validation or
        test rows, offsets [M + 1], clients may have none), "global_adapt" (the rows each global
        client fits its mixture weights on) or "global_score" (the rows it is then scored on),
        both with offsets [G + 1]. Validation and test never share a row, and neither do a
        global client's adapt and score parts. "local" returns the stored tensors (views);
        the global parts are gathered from `global_x`/`global_y` on every call (a copy, so they
        follow in-place edits of those; keep the result rather than calling per batch).
        """
        check_stage_part(stage, part)
        if part == "local":
            if stage == "val":
                return self.val_x, self.val_y, self.val_offsets
            return self.test_x, self.test_y, self.test_offsets
        rows, offsets = self._global_parts[stage, part]
        return self.global_x[rows], self.global_y[rows], offsets

    def evaluation_rows(self, stage: str, part: str) -> Tensor:
        """Where each row of `evaluation_split(stage, part)` came from, LongTensor [N]: its
        position within its client's held-out rows as given (`client_test[i]`) for "local", within
        its global client's rows (`global_split(g)`) for "global_adapt"/"global_score"."""
        check_stage_part(stage, part)
        return self._positions[stage, part]

    def global_split(self, g: int) -> Split:
        """Global test client g's whole (x, y), as views: its validation and test rows, adapt and
        score parts together (`evaluation_split` separates them)."""
        count = self.num_global_clients
        return client_slice(self.global_x, self.global_y, self.global_offsets, g, "g", count)

    def serve_rounds(self, rounds: Callable[[], int]) -> None:
        """Train under a federated module: ``rounds()`` names the round each training epoch runs
        (the module hands it over when a fit sets up; the training loader yields it)."""
        self.rounds = rounds

    def train_dataloader(self):
        return round_dataloader(self)

    def val_dataloader(self):
        return evaluation_dataloader(self, "val")

    def test_dataloader(self):
        return evaluation_dataloader(self, "test")

    def predict_dataloader(self):
        """``trainer.predict`` reads the rows ``trainer.test`` scores: the participating clients'
        test rows, then each global client's test score rows (``lightning_fedcluster.prediction``)."""
        return evaluation_dataloader(self, "test")
