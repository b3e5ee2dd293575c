"""benchmarks/split_signal.py: the partition in two and its numbers on hand-made distances, each
client's gradient against a hand-computed one, and a real short run whose measurement in the middle
of the run leaves the run as it would have been."""

from __future__ import annotations

import pytest
import torch
from split_signal import client_gradients, main, run, two_way


def test_two_tight_groups_far_apart_give_a_clear_partition_and_its_concepts():
    # clients 0-2 and 3-6: 0.1 apart inside a group, 1.0 across
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    distances = torch.where(groups[:, None] == groups[None, :], 0.1, 1.0).double()
    distances.fill_diagonal_(0.0)
    found = two_way(distances, [5, 5, 5, 7, 7, 7, 7])
    assert found == {"silhouette": 0.9, "smaller_group": 3, "ari": 1.0}  # s_i = (1.0 - 0.1) / 1.0
    assert two_way(distances, [5] * 7)["ari"] is None  # one concept: nothing to compare with


def test_each_clients_gradient_is_its_own_mean_loss_gradient():
    model = torch.nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    rows = [(torch.tensor([[1.0], [3.0]]), torch.tensor([0, 0])), (torch.tensor([[2.0]]), torch.tensor([1]))]
    gradients, predictions = client_gradients(model, rows)
    # zero weights: softmax (1/2, 1/2); d loss / d w_c = mean_j (p_c - [y_j = c]) x_j
    assert torch.allclose(gradients[0], torch.tensor([-1.0, 1.0], dtype=torch.float64))  # mean x = 2
    assert torch.allclose(gradients[1], torch.tensor([1.0, -1.0], dtype=torch.float64))
    assert model.weight.grad is None or not model.weight.grad.any()
    assert all(torch.allclose(p, torch.full_like(p, 0.5)) for p in predictions)  # the same forward's softmax


def test_measuring_during_the_run_leaves_the_run_unchanged(threads_restored):
    alone = run("tabular-mixed", 100, 3)
    measured = run("tabular-mixed", 100, 3, at=[2])
    assert alone and all(line["round"] == 3 for line in alone)
    during = [line for line in measured if line["round"] == 2]
    assert during and [line for line in measured if line["round"] == 3] == alone
    for line in alone + during:
        assert sum(line["concepts"].values()) == line["clients"] >= 4
        assert -1.0 <= line["gradient"]["silhouette"] <= 1.0 and 0.0 <= line["cfl_ratio"] <= 1.0


def test_an_unknown_cell_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--cell", "mnist"])
    assert "invalid choice" in capsys.readouterr().err
