"""Concept shift: label permutations that give each concept its own labelling of the classes.

Concept 0 is the identity, 1 reverses the classes and c >= 2 shifts them cyclically (FedRC
App. H.8), so `max_concepts(C)` pairwise distinct maps exist for C classes.
"""

from __future__ import annotations

from numbers import Integral

import torch
from torch import Tensor

__all__ = ["label_map", "labelled_alike", "max_concepts"]


def max_concepts(num_classes: int) -> int:
    """Number of distinct label maps `label_map` offers for `num_classes` classes.

    The shifts y -> (y + s) mod C give C maps and the reversal y -> C-1-y one more, which is a
    shift only when C == 2.
    """
    _check_num_classes(num_classes)
    return 2 if num_classes == 2 else int(num_classes) + 1


def label_map(concept: int, num_classes: int) -> Tensor:
    """Permutation table of concept `concept`: the new label of class y is `table[y]`.

    Concept 0 is the identity, 1 is y -> C-1-y, 2 is y -> (y+1) mod C and c >= 3 is
    y -> (y+c-1) mod C, so concepts 0..max_concepts(C)-1 are pairwise distinct.
    """
    limit = max_concepts(num_classes)
    if isinstance(concept, bool) or not isinstance(concept, Integral) or not 0 <= concept < limit:
        raise ValueError(
            f"concept must be an integer in [0, {limit}) for num_classes={num_classes} "
            f"(only {limit} distinct label maps exist), got {concept!r}; use fewer concepts"
        )
    y = torch.arange(int(num_classes), dtype=torch.long)
    if concept == 0:
        return y
    if concept == 1:
        return num_classes - 1 - y
    return (y + int(concept) - 1) % num_classes


def labelled_alike(labels: Tensor, concept: int, num_concepts: int, num_classes: int) -> Tensor:
    """[num_concepts]: the share of a client's rows that each concept's map labels as concept
    `concept` (the client's own) does; entry `concept` is 1.

    Two maps can agree on some classes (for 10 classes concepts 1 and 2 both give class 4 the
    label 5 and class 9 the label 0). A client that holds mostly such classes, as a label skew
    allows, is then (nearly) as well explained by the other concept: no clustering can be asked to
    place it by its concept. `labels` are the client's labels under its own concept.
    """
    if isinstance(num_concepts, bool) or not isinstance(num_concepts, Integral) or not (
        0 < num_concepts <= max_concepts(num_classes)
    ):
        raise ValueError(
            f"num_concepts must be in [1, {max_concepts(num_classes)}] for num_classes={num_classes}, "
            f"got {num_concepts!r}"
        )
    if isinstance(concept, bool) or not isinstance(concept, Integral) or not 0 <= concept < num_concepts:
        raise ValueError(f"concept must be an integer in [0, {num_concepts}) (num_concepts), got {concept!r}")
    maps = torch.stack([label_map(k, num_classes) for k in range(num_concepts)])
    labels = torch.as_tensor(labels).long().flatten()
    if labels.numel() == 0:
        raise ValueError("labels is empty: a client without rows has no share to measure")
    if int(labels.min()) < 0 or int(labels.max()) >= num_classes:
        found = f"{int(labels.min())}..{int(labels.max())}"
        raise ValueError(f"labels must lie in [0, {num_classes}) (num_classes), got {found}")
    classes = maps[concept].argsort()[labels]  # the class each row's label stands for under `concept`
    return (maps[:, classes] == labels).double().mean(dim=1)


def _check_num_classes(num_classes: int) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, Integral) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
