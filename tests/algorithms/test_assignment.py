"""algorithms/assignment.py: a hard assignment's report is one-hot at its cluster in ω and in
every row of γ, and its label sums count the client's labels in that cluster's column."""

import torch

from lightning_fedcluster.algorithms.assignment import assignment_report


def test_a_client_assigned_to_cluster_1_reports_one_hot_rows_and_its_label_counts() -> None:
    losses = torch.tensor([[0.5, 2.0, 1.0], [0.1, 0.2, 0.3], [3.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    labels = torch.tensor([0, 2, 2, 1])
    report = assignment_report(1, losses, labels, num_classes=4)
    assert report.omega.dtype == torch.float64
    assert report.omega.tolist() == [0.0, 1.0, 0.0]
    assert report.gamma.tolist() == [[0.0, 1.0, 0.0]] * 4  # the losses do not matter
    # label y's row counts the client's samples of class y, all in column 1; class 3 is absent
    assert report.label_sums.tolist() == [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]


def test_gamma_rows_are_independent_tensors_and_regression_has_no_label_sums() -> None:
    report = assignment_report(0, torch.zeros(3, 2), torch.zeros(3), num_classes=0)
    report.gamma[0, 0] = 0.5  # rows are not views of ω
    assert report.omega.tolist() == [1.0, 0.0] and report.gamma[1].tolist() == [1.0, 0.0]
    assert report.label_sums.shape == (0, 2)
