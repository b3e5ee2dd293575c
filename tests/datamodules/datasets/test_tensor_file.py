"""datamodules/datasets/tensor_file.py: a user's ``.pt`` / ``.npz`` file of (x, y) becomes the
``from_tensors`` scenario; inputs are served as images when asked; a bad file is named with the
fix. (``fedcluster fit --data FILE`` end to end: tests/test_cli.py.)"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules import FederatedDataModule
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors
from lightning_fedcluster.datamodules.datasets.tensor_file import (
    TensorFileFederated,
    as_images,
    load_tensor_file,
)


def test_a_pt_pair_and_npz_uint8_are_loaded_as_x_and_y_scaled_to_0_1(tmp_path: Path) -> None:
    torch.save((torch.tensor([[0.5]]), torch.tensor([1])), tmp_path / "pair.pt")
    assert {k: v.tolist() for k, v in load_tensor_file(tmp_path / "pair.pt").items()} == {
        "x": [[0.5]],
        "y": [1],
    }
    np.savez(
        tmp_path / "bytes.npz", x=np.array([[0, 51, 255]], dtype=np.uint8), y=np.array([2]), other=np.ones(1)
    )
    loaded = load_tensor_file(tmp_path / "bytes.npz")
    assert sorted(loaded) == ["x", "y"]  # keys other than x, y, x_test, y_test are not read
    torch.testing.assert_close(loaded["x"], torch.tensor([[0.0, 0.2, 1.0]]))
    assert loaded["y"].tolist() == [2]


def test_images_are_reshaped_or_permuted_to_channels_first() -> None:
    colour = torch.rand(5, 4, 4, 3, generator=torch.Generator().manual_seed(0))  # [N, H, W, C]
    assert torch.equal(as_images(colour, (3, 4, 4), True, "x"), colour.permute(0, 3, 1, 2))
    assert torch.equal(as_images(colour.reshape(5, -1), (3, 4, 4), False, "x"), colour.reshape(5, 3, 4, 4))
    assert as_images(colour, None, False, "x") is colour
    with pytest.raises(ValueError, match=r"channels-last images.*--data.channels_last=true"):
        as_images(colour, (3, 4, 4), False, "x")
    with pytest.raises(ValueError, match=r"channels_last=True needs x_test stored as \[N, H, W, C\]"):
        as_images(colour.reshape(5, -1), (3, 4, 4), True, "x_test")
    with pytest.raises(ValueError, match=r"image_shape must be \(channels, height, width\)"):
        as_images(colour, (4, 4), False, "x")


def test_a_file_with_a_test_set_gives_the_global_clients(tmp_path: Path) -> None:
    x, y = load_digits_tensors()
    path = tmp_path / "split.pt"
    torch.save({"x": x[:1400], "y": y[:1400], "x_test": x[1400:], "y_test": y[1400:]}, path)
    dm = TensorFileFederated(str(path), num_clients=10, concepts=2, image_shape=(1, 8, 8))
    assert dm.num_global_clients == 2
    assert int(dm.train_sizes.sum() + dm.val_sizes.sum() + dm.test_sizes.sum()) == 1400


def test_bad_tensor_files_are_named_with_the_fix(tmp_path: Path) -> None:
    x, y = load_digits_tensors()
    torch.save({"inputs": x, "y": y}, tmp_path / "keys.pt")
    with pytest.raises(ValueError, match=r"needs tensors 'x' and 'y'.*holds \['inputs', 'y'\]"):
        TensorFileFederated(str(tmp_path / "keys.pt"))
    np.savez(tmp_path / "keys.npz", X=x.numpy(), labels=y.numpy())  # the keys are listed, not []
    with pytest.raises(ValueError, match=r"holds \['X', 'labels'\]: save the inputs as 'x' and the labels "
                       r"as 'y' \(numpy.savez\(path, x=..., y=...\)\)"):  # fmt: skip
        TensorFileFederated(str(tmp_path / "keys.npz"))
    np.savez(tmp_path / "names.npz", x=x.numpy(), y=np.array(["zero", "one"])[(y % 2).numpy()])
    with pytest.raises(
        ValueError, match=r"'y' holds <U4 values \(strings\), but labels must be integer-encoded"
    ):
        TensorFileFederated(str(tmp_path / "names.npz"))
    torch.save({"x": x, "y": y}, tmp_path / "ok.pt")
    with pytest.raises(ValueError, match=r"image_shape=\[1, 8, 7\] does not fit x"):
        TensorFileFederated(str(tmp_path / "ok.pt"), image_shape=(1, 8, 7))
    with pytest.raises(ValueError, match="expected a .pt or .npz file"):
        TensorFileFederated(str(tmp_path / "ok.csv"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        TensorFileFederated(str(tmp_path / "missing.npz"))


def test_the_file_datamodule_takes_every_from_tensors_argument() -> None:
    # partition (row ids or a function of the pool) is a Python object, not a file's flag.
    given = {"x", "y", "global_test", "partition"}
    builder = set(inspect.signature(FederatedDataModule.from_tensors).parameters) - given
    own = set(inspect.signature(TensorFileFederated.__init__).parameters) - {"self", "path", "channels_last"}
    assert own == builder
    for name in builder:  # and each is documented (the CLI help shows these docs)
        assert f"        {name}: " in TensorFileFederated.__doc__, name
