"""Hugging Face data sets built offline for the tests (``Dataset.from_dict``, files written here)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: every data set is built here
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
datasets = pytest.importorskip("datasets")
pytest.importorskip("flwr_datasets")


@pytest.fixture(scope="module")
def digits_dataset(digits) -> object:
    """scikit-learn's digits as a Dataset: 64 pixel columns in one array column, a label, a writer
    id (12 writers, a natural client id), and the row id."""
    x, y = digits
    writers = np.random.default_rng(0).integers(0, 12, size=y.numel())
    return datasets.Dataset.from_dict(
        {"pixels": x.numpy(), "label": y.numpy(), "writer": writers, "row": np.arange(y.numel())}
    )


def write_image_folder(root, sizes=None, per_class: int = 12, seed: int = 0):
    """An image folder (one sub-folder per class, 3 classes of 8x8 RGB PNGs) and its images as
    float [N, 3, 8, 8] in [0, 1], in the order the folder loads them. ``sizes`` overrides the size
    of image k with ``sizes[k]``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for c, name in enumerate(("cat", "dog", "eel")):
        (root / name).mkdir(parents=True)
        for k in range(per_class):
            size = (sizes or {}).get(c * per_class + k, (8, 8))
            array = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
            Image.fromarray(array).save(root / name / f"{k:03d}.png")
            images.append(array)
    return images
