"""Building a FederatedDataModule from raw data: the FedRC scenario from labelled tensors
(``from_tensors``) or clients from any partition (``from_partition``). A mixin, so the
datamodule class keeps one job (holding and serving the splits); the datamodule class supplies
``_construct`` and names itself as the type built, so this module does not import it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from torch import Tensor

from lightning_fedcluster.datamodules.clients import build_clients
from lightning_fedcluster.datamodules.scenario import build_scenario
from lightning_fedcluster.datamodules.scenario_arguments import preset_evaluation_fractions, rows_as_images
from lightning_fedcluster.datamodules.validation import check_batch_size

Built = TypeVar("Built")
"""The datamodule type the builders return (`FederatedDataModule`)."""


class ScenarioBuilders(Generic[Built]):
    """``FederatedDataModule.from_tensors`` and ``FederatedDataModule.from_partition``."""

    @classmethod
    def _construct(
        cls, arguments: dict[str, Any], batch_size: int, val_share: float, adapt_fraction: float, seed: int
    ) -> Built:
        """The datamodule holding built clients ``arguments``; the class mixing this in provides it."""
        raise NotImplementedError(f"{cls.__name__} mixes in ScenarioBuilders but does not define _construct")

    @classmethod
    def from_tensors(
        cls,
        x: Tensor,
        y: Tensor,
        *,
        num_clients: int | None = None,
        concepts: int = 1,
        dirichlet_alpha: float | None = 1.0,
        corrupt_fraction: float | Sequence[float] | None = None,
        concept_proportions: Sequence[float] | None = None,
        test_fraction: float | None = None,
        global_test_fraction: float | None = None,
        min_client_size: int = 2,
        num_classes: int | None = None,
        image_shape: tuple[int, int, int] | None = None,
        batch_size: int = 32,
        seed: int = 0,
        global_test: tuple[Tensor, Tensor] | None = None,
        corruptions: Sequence[str] | None = None,
        val_share: float = 0.5,
        adapt_fraction: float | None = None,
        preset: str | None = None,
        partition: Sequence[Any] | None = None,
    ) -> Built:
        """Build the FedRC scenario from labelled tensors; see `build_scenario` for the steps
        (`preset="authors"`: the client mix of the FedRC authors' scripts; `partition`: one array
        of row ids per client instead of the Dirichlet split, with the shifts drawn on top).

        Each client's `test_fraction` of held-out rows is then split into validation
        (`val_share`) and test, and every global client into validation/test x adapt/score
        (`adapt_fraction`), drawn from `seed` (see the class docstring). Left unset they are 0.2
        and 0.4, or the authors' 0.1 and 0.9 under `preset="authors"`, as in the vision datamodules.

        `image_shape=(C, H, W)` serves flat rows [N, C*H*W] as images [N, C, H, W] (for
        convolutional models; ``fedcluster fit --data FILE --data.image_shape=[C,H,W]`` does the
        same), and is the shape the corruptions see."""
        check_batch_size(batch_size)
        test_fraction, adapt_fraction = preset_evaluation_fractions(preset, test_fraction, adapt_fraction)
        if global_test is not None and isinstance(global_test, (tuple, list)) and len(global_test) == 2:
            global_test = (rows_as_images(global_test[0], image_shape), global_test[1])
        arguments = build_scenario(
            rows_as_images(x, image_shape),
            y,
            num_clients=num_clients,
            concepts=concepts,
            dirichlet_alpha=dirichlet_alpha,
            corrupt_fraction=corrupt_fraction,
            concept_proportions=concept_proportions,
            test_fraction=test_fraction,
            global_test_fraction=global_test_fraction,
            min_client_size=min_client_size,
            num_classes=num_classes,
            image_shape=image_shape,
            seed=seed,
            global_test=global_test,
            corruptions=corruptions,
            preset=preset,
            partition=partition,
        )
        return cls._construct(arguments, batch_size, val_share, adapt_fraction, seed)

    @classmethod
    def from_partition(
        cls,
        x: Tensor,
        y: Tensor,
        parts: Sequence[Any],
        *,
        test_fraction: float = 0.2,
        concept: Any = None,
        feature_style: Sequence[str] | None = None,
        mixture: Any = None,
        unseen_fraction: float = 0.0,
        global_test: Sequence[tuple[Tensor, Tensor]] = (),
        global_concept: Any = None,
        num_classes: int | None = None,
        batch_size: int = 32,
        seed: int = 0,
        val_share: float = 0.5,
        adapt_fraction: float = 0.4,
    ) -> Built:
        """Clients from any partition of (x, y), e.g. one made by the `partition` functions;
        see `build_clients`. Works for classification and regression targets alike. The
        held-out rows and global clients are split for evaluation as in the class docstring
        (`val_share`, `adapt_fraction`, drawn from `seed`)."""
        check_batch_size(batch_size)
        arguments = build_clients(
            x,
            y,
            parts,
            test_fraction=test_fraction,
            concept=concept,
            feature_style=feature_style,
            mixture=mixture,
            unseen_fraction=unseen_fraction,
            global_test=global_test,
            global_concept=global_concept,
            num_classes=num_classes,
            seed=seed,
        )
        return cls._construct(arguments, batch_size, val_share, adapt_fraction, seed)

    @classmethod
    def from_hugging_face(
        cls,
        source: Any,
        *,
        features: str | Sequence[str],
        label: str,
        partitioner: Any,
        split: str = "train",
        test_split: str | None = None,
        transform: Callable[[Tensor], Tensor] | None = None,
        concept: str | Callable[[Any], int] | None = None,
        concepts: int = 1,
        corrupt_fraction: float | Sequence[float] | None = 0.0,
        concept_proportions: Sequence[float] | None = None,
        corruptions: Sequence[str] | None = None,
        preset: str | None = None,
        image_shape: tuple[int, int, int] | None = None,
        test_fraction: float | None = None,
        global_test_fraction: float | None = None,
        num_classes: int | None = None,
        batch_size: int = 32,
        seed: int = 0,
        val_share: float = 0.5,
        adapt_fraction: float | None = None,
        memory_map: str | Path | None = None,
        cache_dir: str | None = None,
    ) -> Built:
        """Clients from a Hugging Face data set, one per partition of a Flower Datasets partitioner.

        `source` is a `datasets.Dataset`, a `DatasetDict` (`split` names the clients' split;
        `test_split`, e.g. "test", builds the global test clients from that split instead of
        holding out `global_test_fraction`, default 0.2, of every class) or a path read offline (a
        parquet, csv, arrow or json file, a `save_to_disk` folder, an image folder). `features` names
        the input column(s): one image column (decoded to float [C, H, W] in [0, 1]), one array
        column, or number columns (stacked to [N, F]); `label` the integer class id column;
        `transform` runs on each block of decoded rows (float tensor in, float tensor out, row-wise).

        `partitioner` (a new `flwr_datasets.partitioner.Partitioner`: Iid, Dirichlet, Pathological,
        NaturalId, ...) is given the client pool, and client i holds its partition i
        (`dm.source_rows[i]`: those rows of the split; `dm.natural_ids[i]`: a NaturalIdPartitioner's
        id). The shifts of `from_tensors` go on top (`concepts`, `corrupt_fraction`, default 0 here,
        `preset="authors"`), and each client's rows are split into train and held-out rows
        (`test_fraction`). `concept` names a column (one value per client) or a function of the
        natural id giving each client's own concept, kept as metadata for diagnostics.

        Rows are read per client from the memory-mapped Arrow table and written end to end, so no
        tensor of the whole data set is built; with `memory_map` (a directory, one per datamodule)
        the training inputs are written to a memory-mapped file there (`train_x.f32`, replaced on
        every build and left there afterwards), read from disk as clients train. Needs the `hf`
        extra."""
        from lightning_fedcluster.datamodules.hugging_face import hugging_face_arguments

        check_batch_size(batch_size)
        test_fraction, adapt_fraction = preset_evaluation_fractions(preset, test_fraction, adapt_fraction)
        arguments, clients = hugging_face_arguments(
            source,
            features=features,
            label=label,
            partitioner=partitioner,
            split=split,
            test_split=test_split,
            transform=transform,
            concept=concept,
            concepts=concepts,
            corrupt_fraction=corrupt_fraction,
            concept_proportions=concept_proportions,
            corruptions=corruptions,
            preset=preset,
            image_shape=image_shape,
            test_fraction=test_fraction,
            global_test_fraction=global_test_fraction,
            num_classes=num_classes,
            seed=seed,
            memory_map=memory_map,
            cache_dir=cache_dir,
        )
        built = cls._construct(arguments, batch_size, val_share, adapt_fraction, seed)
        built.source_rows = clients.source_rows  # type: ignore[attr-defined]
        built.natural_ids = clients.natural_ids  # type: ignore[attr-defined]
        return built
