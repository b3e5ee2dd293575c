"""algorithms/server_view.py: what a rule's server hook sees is the server's state, as copies."""

from __future__ import annotations

import torch

from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.server_view import ClientStoreView, RoundOutcome, ServerView


def _view() -> tuple[ServerView, ClientState, list[list[torch.Tensor]]]:
    state = ClientState.initial(3, 2, 2)
    state.extra["flag"] = torch.tensor(0.0)
    clusters = [
        [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])],
        [torch.tensor([4.0, 5.0]), torch.tensor([[6.0]])],
    ]
    outcome = RoundOutcome(2, torch.tensor([0, 2]), torch.full((2, 2), 0.5), torch.ones(2), torch.ones(3))
    return ServerView(outcome, state, clusters), state, clusters


def test_the_view_shows_the_models_per_tensor_and_as_a_flat_vector():
    view, _, _ = _view()
    assert view.round_index == 2 and view.num_clusters == 2
    assert [t.tolist() for t in view.cluster_tensors(1)] == [[4.0, 5.0], [[6.0]]]
    vector = view.cluster_vector(0)
    assert vector.dtype == torch.float64 and vector.tolist() == [1.0, 2.0, 3.0]
    assert view.cluster_vector(1, torch.float32).dtype == torch.float32
    assert view.active.tolist() == [True, True]
    assert view.outcome.clients.tolist() == [0, 2]


def test_nothing_the_view_hands_out_writes_into_the_server():
    view, state, clusters = _view()
    view.cluster_tensors(0)[0].fill_(-1.0)
    view.cluster_vector(0).fill_(-1.0)
    store = view.client_state
    assert isinstance(store, ClientStoreView)
    for tensor in (store.omega, store.label_sums, store.seen, store.active, view.active, store.extra["flag"]):
        tensor.zero_()
    assert clusters[0][0].tolist() == [1.0, 2.0]
    assert torch.equal(state.omega, torch.full((3, 2), 0.5, dtype=torch.float64))
    assert bool(state.active.all()) and float(state.extra["flag"]) == 0.0
    assert (store.num_clients, store.num_clusters) == (3, 2)


def test_the_view_reads_the_store_as_it_is_now():
    view, state, _ = _view()
    state.remove_clusters(torch.tensor([False, True]))  # the store replaces its tensors
    assert view.active.tolist() == [True, False]
    assert view.client_state.omega[:, 1].tolist() == [0.0, 0.0, 0.0]
