"""The data and models of the concept-discovery benchmarks (``discovery_probe.py``,
``discovery_cells.py``): a tabular concept-shift set whose concepts are labelling rules, and the
digits-28 image recipe off the take-off cells.

The tabular set (``concept_set``): every client draws Gaussian inputs x ~ N(0, I_9) and labels them
with its concept's rule (``labelling_rules``: ``"mixed"``, a half-space, an exclusive or and a
radial threshold on disjoint features; ``"linear"``, three orthonormal half-spaces); any two rules
agree on half of the rows and each rule is balanced. 30 clients of 150–450 training rows (plus a
fifth held out for validation and test), concept c = client mod 3; one global test client per
concept (1,000 rows labelled by its rule). With ``concepts=1`` every client (and the one global
client) uses the same rule, the seed's rule ``seed % 3``, from the same draws.

The image recipe (``digits_set``): scikit-learn's digits at 28×28 in the FedRC scenario
(``from_tensors``: 30 clients, three label-map concepts), for a CNN with 16/32 channels and 128
hidden units (``digits_model``).

Seeds 100–119 (``HELD_ASIDE``) are held aside for checking a discovery policy on data it was not
chosen on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from authors_data import digits_28

from lightning_fedcluster import FederatedDataModule
from lightning_fedcluster.models import FashionCNN, MLPClassifier

HELD_ASIDE = range(100, 120)
FEATURES, CONCEPTS = 9, 3
CHI2_4_MEDIAN = 3.357  # the median of a chi-square with 4 degrees of freedom


def labelling_rules(kind: str, generator: torch.Generator) -> Any:
    """The three concepts' rules, as a function (x [N, 9], concept) -> labels [N] (long).

    ``"linear"``: y = 1[w_c · x > 0] with three orthonormal w_c (random, from the generator).
    ``"mixed"``: three rules of different kinds on disjoint features, each balanced: concept 0 a
    random half-space of x_0..x_2, concept 1 the sign pattern x_3 · x_4 > 0 (an exclusive or),
    concept 2 a radial threshold ‖x_5..x_8‖² > 3.357 (the median of χ²_4). Either way any two
    rules agree on half of the rows."""
    if kind == "linear":
        w = torch.linalg.qr(torch.randn(FEATURES, FEATURES, generator=generator))[0][:, :CONCEPTS].T  # [3, 9]
        return lambda x, c: (x @ w[c] > 0).long()
    if kind != "mixed":
        raise ValueError(f"kind must be 'linear' or 'mixed', got {kind!r}")
    w0 = torch.randn(3, generator=generator)
    rules = (
        lambda x: x[:, :3] @ w0 > 0,
        lambda x: x[:, 3] * x[:, 4] > 0,
        lambda x: x[:, 5:].square().sum(1) > CHI2_4_MEDIAN,
    )
    return lambda x, c: rules[c](x).long()


def concept_set(
    seed: int,
    kind: str = "mixed",
    num_clients: int = 30,
    global_rows: int = 1000,
    batch_size: int = 32,
    concepts: int = CONCEPTS,
) -> FederatedDataModule:
    """The tabular concept-shift set of the module docstring, built with ``from_partition``.

    ``concepts``: 3 (client i has concept i mod 3) or 1 (every client the seed's rule ``seed % 3``;
    the inputs and sizes are the same draws as with 3)."""
    if concepts not in (1, CONCEPTS):
        raise ValueError(f"concepts must be 1 or {CONCEPTS}, got {concepts!r}")
    generator = torch.Generator().manual_seed(seed)
    label = labelling_rules(kind, generator)
    rule = [seed % CONCEPTS] if concepts == 1 else list(range(CONCEPTS))  # concept c labels by rule[c]
    train_rows = torch.randint(150, 451, (num_clients,), generator=generator)
    rows = torch.ceil(train_rows / 0.8).long()  # a fifth held out for validation and test
    concept = [i % concepts for i in range(num_clients)]
    xs, ys, parts, start = [], [], [], 0
    for i in range(num_clients):
        x = torch.randn(int(rows[i]), FEATURES, generator=generator)
        xs.append(x)
        ys.append(label(x, rule[concept[i]]))
        parts.append(torch.arange(start, start + x.shape[0]))
        start += x.shape[0]
    global_test = []
    for c in range(concepts):
        x = torch.randn(global_rows, FEATURES, generator=generator)
        global_test.append((x, label(x, rule[c])))
    return FederatedDataModule.from_partition(
        torch.cat(xs), torch.cat(ys), [p.numpy() for p in parts], concept=concept, global_test=global_test,
        global_concept=list(range(concepts)), num_classes=2, batch_size=batch_size, seed=seed,
    )  # fmt: skip


def rule_agreement(seed: int, kind: str, rows: int = 100_000) -> list[float]:
    """The share of rows on which each pair of the seed's rules gives the same label, and each
    rule's share of label 1."""
    generator = torch.Generator().manual_seed(seed)
    label = labelling_rules(kind, generator)
    x = torch.randn(rows, FEATURES, generator=generator)
    labels = torch.stack([label(x, c) for c in range(CONCEPTS)], 1)
    pairs = [float((labels[:, a] == labels[:, b]).float().mean()) for a in range(3) for b in range(a + 1, 3)]
    return pairs + [float(v) for v in labels.float().mean(0)]


def tabular_model() -> MLPClassifier:
    """The tabular set's model: an MLP (64, 64), SGD lr 0.05, momentum 0.9."""
    return MLPClassifier(in_features=FEATURES, num_classes=2, hidden=(64, 64), lr=0.05, momentum=0.9)


def digits_set(seed: int) -> FederatedDataModule:
    """digits-28 in the FedRC scenario: 30 clients, three label-map concepts, batches of 32."""
    images, labels = digits_28()
    return FederatedDataModule.from_tensors(
        images, labels, num_clients=30, concepts=3, batch_size=32, seed=seed
    )


def digits_model() -> FashionCNN:
    """The image recipe's CNN: 16/32 channels, 128 hidden units, SGD lr 0.05, momentum 0.9."""
    return FashionCNN(lr=0.05, momentum=0.9, channels=(16, 32), hidden=128)


def append_record(path: Path | None, record: dict[str, Any]) -> None:
    """Append ``record`` to the JSON-lines file ``path`` (nothing when ``path`` is None)."""
    if path is not None:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
