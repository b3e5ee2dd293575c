"""metrics/clustering.py: the concept ARI and concept shares of a clients x clusters ω, by hand."""

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_fedcluster.metrics.clustering import (
    concept_ari,
    concept_shares,
    grouping_ari,
    misplaced_clients,
)

# --- clustering metrics ------------------------------------------------------------------------


def omega_for(assignments: list[int], k: int = 3) -> torch.Tensor:
    """ω rows peaked on the given clusters."""
    omega = torch.full((len(assignments), k), 0.1, dtype=torch.float64)
    omega[torch.arange(len(assignments)), torch.tensor(assignments)] = 1.0 - 0.1 * (k - 1)
    return omega


def test_concept_ari_perfect_relabelled_clustering() -> None:
    concept = torch.tensor([0, 0, 1, 1, 2, 2])
    omega = omega_for([2, 2, 0, 0, 1, 1])  # same partition, different cluster names
    assert concept_ari(omega, concept) == pytest.approx(1.0, abs=1e-12)


def test_concept_ari_by_hand() -> None:
    # true [0,0,0,1,1,1], clusters [0,0,1,1,1,1]: contingency [[2,1],[0,3]].
    # Σ C(n_ij, 2) = 1 + 0 + 0 + 3 = 4; rows 3, 3 -> 3 + 3 = 6; columns 2, 4 -> 1 + 6 = 7; C(6, 2) = 15.
    # ARI = (4 − 6·7/15) / ((6 + 7)/2 − 6·7/15) = 1.2 / 3.7
    omega = omega_for([0, 0, 1, 1, 1, 1], k=2)
    assert concept_ari(omega, torch.tensor([0, 0, 0, 1, 1, 1])) == pytest.approx(1.2 / 3.7, abs=1e-12)


def test_grouping_ari_by_hand_and_label_free() -> None:
    # The contingency of the test above, with group names 7 and 3: ARI 1.2 / 3.7, as concept_ari.
    assert grouping_ari(torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([7, 7, 3, 3, 3, 3])) == pytest.approx(
        1.2 / 3.7, abs=1e-12
    )
    assert grouping_ari(torch.tensor([0, 0, 1, 1]), torch.tensor([1, 1, 0, 0])) == 1.0


def test_concept_ari_nan_with_fewer_than_two_seen_clients() -> None:
    omega = omega_for([0, 1, 2])
    concept = torch.tensor([0, 1, 2])
    assert math.isnan(concept_ari(omega, concept, seen=torch.tensor([False, True, False])))
    assert math.isnan(concept_ari(omega, concept, seen=torch.zeros(3, dtype=torch.bool)))
    assert math.isnan(concept_ari(omega[:1], concept[:1]))


def test_concept_ari_uses_only_seen_clients() -> None:
    concept = torch.tensor([0, 0, 1, 1, 0, 1])
    # the last two clients (never seen, still at their initial ω) would break the clustering
    omega = omega_for([1, 1, 0, 0, 0, 1], k=2)
    seen = torch.tensor([True, True, True, True, False, False])
    assert concept_ari(omega, concept, seen=seen) == pytest.approx(1.0, abs=1e-12)
    assert concept_ari(omega, concept) < 0.5


def test_concept_shares_by_hand() -> None:
    omega = torch.tensor([[0.8, 0.2], [0.4, 0.6], [0.1, 0.9]], dtype=torch.float32)
    concept = torch.tensor([0, 0, 1])
    sizes = torch.tensor([10, 20, 5])
    shares = concept_shares(omega, concept, sizes)
    # concept 0: 10·[0.8, 0.2] + 20·[0.4, 0.6] = [16, 14] over 30; concept 1: 5·[0.1, 0.9] over 5.
    expected = torch.tensor([[16 / 30, 14 / 30], [0.1, 0.9]], dtype=torch.float64)
    assert shares.dtype == torch.float64
    assert_close(shares, expected, rtol=1e-7, atol=1e-7)  # ω given in float32
    assert_close(shares.sum(dim=1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)
    # an explicit num_concepts adds an all-zero row for a concept with no clients
    padded = concept_shares(omega, concept, sizes, num_concepts=3)
    assert padded.shape == (3, 2)
    assert_close(padded[:2], expected, rtol=1e-7, atol=1e-7)
    assert torch.equal(padded[2], torch.zeros(2, dtype=torch.float64))


def test_concept_ari_is_undefined_with_one_concept() -> None:
    """One true concept: every clustering scores 0 (or 1 if it has one group), which means nothing."""
    omega = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], dtype=torch.float64)
    assert math.isnan(concept_ari(omega, torch.zeros(3, dtype=torch.long)))
    concept = torch.tensor([0, 0, 1])  # two concepts, but the seen clients hold only concept 0
    assert math.isnan(concept_ari(omega, concept, seen=torch.tensor([True, True, False])))
    assert not math.isnan(concept_ari(omega, concept))


# --- misplaced clients -----------------------------------------------------------------------------


def test_misplaced_clients_by_hand() -> None:
    # concepts [0,0,0,1,1,1,2,2,2], clusters named freely: concept 0 -> cluster 7 (3 clients),
    # concept 1 -> cluster 5 (2 of 3; client 5 sits in cluster 7), concept 2 -> cluster 4 (2 of 3;
    # client 8 sits in cluster 5). Any other matching keeps fewer clients in place.
    concept = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    groups = torch.tensor([7, 7, 7, 5, 5, 7, 4, 4, 5])
    assert misplaced_clients(groups, concept).tolist() == [5, 8]
    assert misplaced_clients(concept.clone(), concept).tolist() == []


def test_misplaced_clients_more_or_fewer_clusters_than_concepts() -> None:
    concept = torch.tensor([0, 0, 1, 1, 2, 2])
    # four clusters: concept 1 split over clusters 1 and 3; one of its clients is misplaced
    assert misplaced_clients(torch.tensor([0, 0, 1, 3, 2, 2]), concept).tolist() == [3]
    # two clusters: concepts 1 and 2 share cluster 1, which only one of them can be matched to;
    # the other concept is left without a cluster and its two clients are misplaced
    misplaced = misplaced_clients(torch.tensor([0, 0, 1, 1, 1, 1]), concept).tolist()
    assert misplaced in ([2, 3], [4, 5])
    # a swapped pair between two clusters: two misplaced, whichever way the tie is matched
    assert len(misplaced_clients(torch.tensor([0, 1, 1, 0, 2, 2]), concept)) == 2


def test_misplaced_clients_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="one length"):
        misplaced_clients(torch.tensor([0, 1]), torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="integer labels"):
        misplaced_clients(torch.tensor([[0.9, 0.1], [0.2, 0.8]]).max(1).values, torch.tensor([0, 1]))
