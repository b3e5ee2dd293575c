"""The text entries a run wrote to TensorBoard, read back from its event files."""

from __future__ import annotations

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from lightning_fedcluster.engine.federation import EVENTS_TAG


def event_texts(log_dir: str, tag: str = EVENTS_TAG) -> dict[int, str]:
    """``tag``'s text entries under ``log_dir`` by step (default: the rounds' server actions)."""
    events = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    events.Reload()
    name = f"{tag}/text_summary"
    if name not in events.Tags()["tensors"]:
        return {}
    return {e.step: tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in events.Tensors(name)}
