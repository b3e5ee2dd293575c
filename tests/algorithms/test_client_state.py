"""algorithms/client_state.py: the per-client state store: initial values, rows touched, round trip,
shape checks."""

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.algorithms.client_state import ClientState
from tests.helpers.algorithms import F64, TIGHT, t

# --- client state -------------------------------------------------------------------------------------


def test_client_state_initial() -> None:
    state = ClientState.initial(num_clients=4, num_classes=3, num_clusters=2)
    assert state.num_clients == 4 and state.num_clusters == 2
    assert state.omega.dtype == F64 and state.label_sums.dtype == F64 and state.seen.dtype == torch.bool
    assert torch.equal(state.omega, torch.full((4, 2), 0.5, dtype=F64))
    assert torch.equal(state.label_sums, torch.zeros(4, 3, 2, dtype=F64))
    assert not state.seen.any()
    assert_close(ClientState.initial(2, 2, 3).omega, torch.full((2, 3), 1 / 3, dtype=F64), **TIGHT)


def test_client_state_record_touches_only_given_rows() -> None:
    state = ClientState.initial(num_clients=4, num_classes=2, num_clusters=2)
    omega = t([[0.9, 0.1], [0.2, 0.8]], torch.float32)
    sums = t([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]], torch.float32)
    state.record(torch.tensor([1, 3]), omega, sums)
    assert state.omega.dtype == F64 and state.label_sums.dtype == F64
    assert torch.equal(state.seen, torch.tensor([False, True, False, True]))
    assert torch.equal(state.omega[[0, 2]], torch.full((2, 2), 0.5, dtype=F64))
    assert torch.equal(state.omega[[1, 3]], omega.double())
    assert torch.equal(state.label_sums[[0, 2]], torch.zeros(2, 2, 2, dtype=F64))
    assert torch.equal(state.label_sums[[1, 3]], sums.double())


def test_client_state_round_trip() -> None:
    state = ClientState.initial(num_clients=3, num_classes=2, num_clusters=2)
    state.record(torch.tensor([2]), t([[0.25, 0.75]]), t([[[1.0, 0.0], [0.5, 2.0]]]))
    saved = state.state_dict()
    assert set(saved) == {"omega", "label_sums", "seen", "active"}
    state.record(torch.tensor([0]), t([[0.1, 0.9]]), t([[[9.0, 9.0], [9.0, 9.0]]]))  # after saving
    assert torch.equal(saved["seen"], torch.tensor([False, False, True]))  # the dict holds copies

    restored = ClientState.initial(num_clients=3, num_classes=2, num_clusters=2)
    restored.load_state_dict(saved)
    assert torch.equal(restored.omega, t([[0.5, 0.5], [0.5, 0.5], [0.25, 0.75]]))
    assert torch.equal(restored.label_sums[2], t([[1.0, 0.0], [0.5, 2.0]]))
    assert torch.equal(restored.label_sums[:2], torch.zeros(2, 2, 2, dtype=F64))
    assert torch.equal(restored.seen, torch.tensor([False, False, True]))
    for name in ("omega", "label_sums", "seen"):
        assert torch.equal(restored.state_dict()[name], saved[name])


@pytest.mark.parametrize(("clients", "classes", "clusters"), [(4, 2, 2), (3, 5, 2), (3, 2, 3)])
def test_client_state_shape_mismatch(clients: int, classes: int, clusters: int) -> None:
    saved = ClientState.initial(num_clients=3, num_classes=2, num_clusters=2).state_dict()
    other = ClientState.initial(clients, classes, clusters)
    with pytest.raises(ValueError, match="resume with the same datamodule"):
        other.load_state_dict(saved)


def test_a_classes_dimension_is_the_label_count() -> None:
    from lightning_fedcluster.algorithms.client_state import CLASSES, Scope, StateEntry
    from lightning_fedcluster.algorithms.fedrc import FedRC

    entry = StateEntry("signature", Scope.CLIENT, (CLASSES, CLASSES), reported=True)
    assert entry.full_shape(4, 100, 3, num_classes=10) == (4, 10, 10)
    assert entry.initial_value(2, 0, 3, num_classes=5).shape == (2, 5, 5)
    # FedRC with grouping declares a C x C signature; the store resolves it from its label count.
    state = ClientState.initial(3, 7, 2, entries=FedRC(2, group_round=2).state_entries())
    assert state.extra["signature"].shape == (3, 7, 7)
    assert state.extra["signature_rows"].shape == (3, 7)
    assert not FedRC(2).capabilities.client_outputs  # plain FedRC never asks for the outputs
