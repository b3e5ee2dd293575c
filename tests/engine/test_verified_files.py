"""Checkpoint files written atomically with a content hash and checked when read: a changed byte
or a cut-off file is refused by name (with the last good file beside it), and a write that fails
(a full disk) leaves the previous file whole."""

from __future__ import annotations

import errno
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest
import torch

from lightning_fedcluster.engine import verified_files
from lightning_fedcluster.engine.verified_files import (
    HASH_KEY,
    CorruptCheckpointError,
    content_hash,
    load_verified,
    save_verified,
)

WEIGHT = 0.0779


def checkpoint() -> dict:
    return {
        "state_dict": {"w": torch.full((64,), WEIGHT), "b": torch.zeros(3, dtype=torch.bfloat16)},
        "client_state": {"omega": torch.full((4, 2), 0.5, dtype=torch.float64)},
        "metrics": [{"train/loss": 1.5}],
        "epoch": 3,
    }


def flip(path, pattern: bytes, offset: int = 2) -> None:
    """Change one byte inside the first occurrence of ``pattern`` in the file (a tensor's bytes)."""
    data = bytearray(path.read_bytes())
    at = data.index(pattern) + offset
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_saved_file_reads_back_verified_and_equal(tmp_path):
    path = tmp_path / "run.pt"
    save_verified(checkpoint(), path)
    loaded, verified = load_verified(path)
    assert verified and loaded[HASH_KEY].startswith("sha256:")
    assert torch.equal(loaded["state_dict"]["w"], checkpoint()["state_dict"]["w"]) and loaded["epoch"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"], "no temporary file is left"


def test_the_hash_covers_tensor_bytes_dtypes_shapes_and_plain_values():
    base = content_hash(checkpoint())
    assert content_hash(checkpoint()) == base
    changed = [checkpoint() for _ in range(4)]
    changed[0]["state_dict"]["w"][5] = -79.81
    changed[1]["state_dict"]["b"] = torch.zeros(3, dtype=torch.float16)
    changed[2]["client_state"]["omega"] = torch.full((2, 4), 0.5, dtype=torch.float64)
    changed[3]["epoch"] = 4
    assert len({base, *(content_hash(c) for c in changed)}) == 5
    assert content_hash({**checkpoint(), "opaque": object()}) == content_hash(
        {**checkpoint(), "opaque": object()}
    )


@pytest.mark.parametrize(
    ("pattern", "what"),
    [(struct.pack("<f", WEIGHT) * 4, "a weight"), (struct.pack("<d", 0.5) * 2, "an ω entry")],
)
def test_a_flipped_byte_is_refused_naming_the_file_and_the_last_good_one(tmp_path, pattern, what):
    good, bad = tmp_path / "epoch=1.ckpt", tmp_path / "epoch=2.ckpt"
    save_verified(checkpoint(), good)
    save_verified(checkpoint(), bad)
    flip(bad, pattern)
    assert torch.load(bad, weights_only=True), f"torch.load alone accepts {what} changed on disk"
    with pytest.raises(CorruptCheckpointError, match="do not match the content hash") as error:
        load_verified(bad)
    assert str(bad) in str(error.value) and f"The last good checkpoint beside it is {good}" in str(
        error.value
    )


def test_a_truncated_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "last.ckpt"
    save_verified(checkpoint(), path)
    path.write_bytes(path.read_bytes()[:700])
    with pytest.raises(CorruptCheckpointError, match="cannot be read as a checkpoint") as error:
        load_verified(path)
    assert str(path) in str(error.value) and "No verified checkpoint is beside it" in str(error.value)


def test_a_write_that_fails_midway_keeps_the_previous_file(tmp_path, monkeypatch):
    """A full disk, simulated: the write stops with ENOSPC after half the bytes."""
    path = tmp_path / "last.ckpt"
    save_verified(checkpoint(), path)
    before = path.read_bytes()

    def half_then_full(obj, file):
        file.write(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(verified_files.torch, "save", half_then_full)
    with pytest.raises(
        OSError, match=f"could not write {path} .No space left on device.; the file that was there"
    ):
        save_verified({**checkpoint(), "epoch": 4}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    monkeypatch.undo()
    assert load_verified(path)[0]["epoch"] == 3


FULL_DISK = textwrap.dedent(
    """
    import errno, sys, torch
    from pathlib import Path
    from lightning_fedcluster.engine.verified_files import load_verified, save_verified

    disk = Path(sys.argv[1])
    save_verified({"w": torch.ones(1000)}, disk / "run.pt")  # 4 kB: fits
    try:
        save_verified({"w": torch.ones(200_000)}, disk / "run.pt")  # 800 kB: does not
    except OSError as error:
        assert error.errno == errno.ENOSPC, error
        print("refused:", error)
    loaded, verified = load_verified(disk / "run.pt")
    assert verified and loaded["w"].shape == (1000,), "the previous file is whole"
    assert sorted(p.name for p in disk.iterdir()) == ["run.pt"], "no temporary file is left"
    print("previous file intact")
    """
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a private tmpfs")
def test_a_real_full_disk_keeps_the_previous_file(tmp_path):
    """A 256 kB tmpfs, mounted in a private user and mount namespace (no root needed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(FULL_DISK)
    mount = f"mount -t tmpfs -o size=256k tmpfs {disk} && exec {sys.executable} {script} {disk}"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", mount], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "mount" in done.stderr and "refused" not in done.stdout:
        pytest.skip(f"no private tmpfs here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No space left on device" in done.stdout and "previous file intact" in done.stdout
