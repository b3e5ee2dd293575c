"""Reading a Hugging Face data set: the optional dependencies (the ``hf`` extra), the source (a
``datasets.Dataset``, a ``DatasetDict`` or a path read offline), and its named columns as tensors,
read for the rows asked (``ColumnReader.read``) from the memory-mapped Arrow table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["ColumnReader", "column_array", "load_source", "require_hf"]

EXTRA = 'pip install "lightning-fedcluster[hf]"'
FILE_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".arrow": "arrow", ".json": "json", ".jsonl": "json"}


def require_hf() -> Any:
    """The ``datasets`` module; ImportError naming the ``hf`` extra when it or ``flwr_datasets``
    is missing."""
    try:
        import datasets
        import flwr_datasets  # noqa: F401  (the partitioners; checked here so the message is one)
    except ImportError as error:
        raise ImportError(
            f"Hugging Face data sets need the `hf` extra (datasets and flwr-datasets), missing here "
            f"({error.name}): {EXTRA}"
        ) from error
    return datasets


def load_source(source: Any, split: str, test_split: str | None, cache_dir: str | None) -> tuple[Any, Any]:
    """(the clients' split, the global test split or None) of ``source``: a ``Dataset``, a
    ``DatasetDict`` (``split`` and ``test_split`` name its splits) or a path ``datasets`` reads
    offline: a .parquet/.csv/.arrow/.json(l) file, a folder saved with ``save_to_disk``, or an
    image folder (one sub-folder per class)."""
    datasets = require_hf()
    if isinstance(source, (str, Path)):
        source = _load_path(datasets, Path(source), cache_dir)
    if isinstance(source, datasets.Dataset):
        if test_split is not None:
            raise ValueError(
                f"test_split={test_split!r} names a split, but the source is a single Dataset: pass a "
                "DatasetDict (or leave test_split unset and hold rows out with global_test_fraction)"
            )
        return source, None
    if isinstance(source, datasets.DatasetDict):
        for name, value in (("split", split), ("test_split", test_split)):
            if value is not None and value not in source:
                raise ValueError(
                    f"{name}={value!r} is not a split of the DatasetDict: it has {sorted(source)}"
                )
        return source[split], None if test_split is None else source[test_split]
    raise TypeError(
        f"source must be a datasets.Dataset, a DatasetDict or a path, got {type(source).__name__} "
        "(an IterableDataset cannot be partitioned: load it without streaming)"
    )


def _load_path(datasets: Any, path: Path, cache_dir: str | None) -> Any:
    if not path.exists():
        raise FileNotFoundError(f"source={str(path)!r}: no such file or folder")
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return datasets.load_from_disk(str(path))
        return datasets.load_dataset("imagefolder", data_dir=str(path), cache_dir=cache_dir)
    builder = FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(
            f"source={str(path)!r}: expected a {', '.join(FILE_BUILDERS)} file, a saved data set or an "
            "image folder"
        )
    return datasets.load_dataset(builder, data_files=str(path), cache_dir=cache_dir)


def _columns(value: str | Sequence[str], name: str) -> list[str]:
    columns = [value] if isinstance(value, str) else list(value)
    if not columns or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"{name} must be a column name or a non-empty list of column names, got {value!r}")
    return columns


class ColumnReader:
    """The inputs (``features``: one image column, one array column or several number columns)
    and the labels (``label``: integer class ids) of a ``datasets.Dataset``, read for given rows.
    Images are decoded to float [C, H, W] in [0, 1]; ``transform`` (float tensor -> float tensor,
    row-wise) then runs on every block of rows read."""

    def __init__(
        self,
        dataset: Any,
        features: str | Sequence[str],
        label: str,
        transform: Callable[[Tensor], Tensor] | None = None,
        where: str = "the data set",
    ) -> None:
        datasets = require_hf()
        self.columns = _columns(features, "features")
        if not isinstance(label, str):
            raise ValueError(f"label must be a column name, got {label!r}")
        available = list(dataset.column_names)
        for name, column in [("features", c) for c in self.columns] + [("label", label)]:
            if column not in available:
                raise ValueError(
                    f"{name}: column {column!r} is not in {where}, whose columns are {available}; "
                    f"pass {name}= one of them"
                )
        kinds = dataset.features
        self.image = [c for c in self.columns if isinstance(kinds[c], datasets.Image)]
        if self.image and len(self.columns) > 1:
            raise ValueError(
                f"features={self.columns} mixes the image column {self.image[0]!r} with other columns: "
                "give one image column, or number columns only"
            )
        for column in self.columns:
            dtype = _leaf_dtype(kinds[column])
            if column not in self.image and not _numeric(dtype):
                raise ValueError(
                    f"features: column {column!r} holds {dtype} values; inputs must be numbers, arrays "
                    "of numbers or images: encode or drop it"
                )
        label_kind = kinds[label]
        if not isinstance(label_kind, datasets.ClassLabel):
            dtype = _leaf_dtype(label_kind)
            if dtype in ("string", "large_string"):
                raise ValueError(
                    f"label column {label!r} holds strings: labels must be integer class ids; encode it "
                    f"with dataset = dataset.class_encode_column({label!r}) (classes in sorted order)"
                )
            if not dtype.startswith(("int", "uint")):
                raise ValueError(
                    f"label column {label!r} holds {dtype} values: labels must be integer class ids "
                    f"0..C-1; cast it with dataset.cast_column({label!r}, datasets.Value('int64'))"
                )
        self.label = label
        self.transform = transform
        self.dataset = dataset
        self._rows = dataset.with_format("numpy", columns=[*self.columns, label])
        self._table = arrow_table(dataset)
        # Number columns are taken from the Arrow table directly; images and arrays are decoded by
        # the data set's own formatting.
        self._scalar = not self.image and not any(
            hasattr(kinds[c], "feature") or type(kinds[c]).__name__.startswith("Array") for c in self.columns
        )

    def labels(self) -> np.ndarray:
        """Every row's label, int64 (one column read, no inputs decoded)."""
        return column_array(self.dataset, self.label).astype(np.int64)

    def read(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """The (x float32, y int64) of ``rows`` (row ids), in that order."""
        if self._scalar:
            import pyarrow as pa

            taken = self._table.select([*self.columns, self.label]).take(pa.array(rows.numpy()))
            batch = {c: taken.column(c).to_numpy() for c in [*self.columns, self.label]}
        else:
            batch = self._rows[rows.tolist()]
        y = torch.from_numpy(np.array(batch[self.label], dtype=np.int64))
        if self.image:
            x = _images(batch[self.image[0]], self.image[0])
        else:
            arrays = [_numbers(batch[c], c) for c in self.columns]
            x = arrays[0] if len(arrays) == 1 else torch.stack(arrays, dim=1)
            if x.ndim == 1:
                x = x.unsqueeze(1)
        if self.transform is not None:
            out = self.transform(x)
            if not isinstance(out, Tensor) or not out.is_floating_point() or out.shape[0] != x.shape[0]:
                raise ValueError(
                    "transform must return a float tensor with one row per row it was given "
                    f"({x.shape[0]}), got {type(out).__name__} {tuple(getattr(out, 'shape', ()))}"
                )
            x = out.to(torch.float32)
        return x, y


def arrow_table(dataset: Any) -> Any:
    """The ``pyarrow.Table`` of ``dataset``'s rows in their order: a zero-copy slice of the
    memory-mapped table when the data set was loaded from files, the rows an indices mapping
    (``select``, ``shuffle``) points at, gathered, otherwise."""
    return dataset.with_format("arrow")[0 : len(dataset)]


def column_array(dataset: Any, column: str, rows: Any = None) -> np.ndarray:
    """One column of ``dataset`` as a numpy array (all rows, or ``rows``), read as one batch
    (``dataset[column]`` would convert it row by row)."""
    import pyarrow as pa

    # through the data set's own row order (a partition's indices mapping included), in one call
    table = arrow_table(dataset.select_columns([column]))
    values = table.column(column)
    if rows is not None:
        values = values.take(pa.array(np.asarray(rows, dtype=np.int64)))
    if pa.types.is_nested(values.type):
        formatted = dataset.with_format("numpy", columns=[column])
        batch = formatted[0 : len(dataset)] if rows is None else formatted[list(rows)]
        return np.asarray(batch[column])
    return values.to_numpy()


def _leaf_dtype(kind: Any) -> str:
    while hasattr(kind, "feature"):  # List, Sequence, Array: the element type
        kind = kind.feature
    return str(getattr(kind, "dtype", type(kind).__name__))


def _numeric(dtype: str) -> bool:
    return dtype.startswith(("int", "uint", "float", "bool")) or dtype == "double"


def _numbers(values: Any, column: str) -> Tensor:
    array = np.asarray(values)
    if array.dtype == object:
        raise ValueError(
            f"features: column {column!r} holds arrays of different lengths: every row needs one shape "
            "(pad or crop them to one length)"
        )
    return torch.from_numpy(np.array(array, dtype=np.float32))  # a copy: Arrow's buffers are read-only


def _images(values: Any, column: str) -> Tensor:
    """Decoded images [n, H, W(, C)] uint8 as float [n, C, H, W] in [0, 1]."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        array = values
    else:
        shapes = sorted({tuple(np.asarray(v).shape) for v in values})
        raise ValueError(
            f"image column {column!r} holds images of different sizes ({', '.join(map(str, shapes[:4]))}"
            f"{', ...' if len(shapes) > 4 else ''}): resize them to one size first, e.g. dataset.map("
            f"lambda row: {{{column!r}: row[{column!r}].resize((32, 32))}})"
        )
    x = torch.from_numpy(np.ascontiguousarray(array))
    if x.ndim == 3:
        x = x.unsqueeze(-1)  # greyscale [n, H, W]
    scale = 255.0 if x.dtype == torch.uint8 else 1.0
    return x.permute(0, 3, 1, 2).to(torch.float32).div_(scale).contiguous()
