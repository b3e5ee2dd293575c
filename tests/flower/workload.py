"""The tiny federation every Flower test trains: 6 digit clients with 2 concepts, 3 rounds.
Importable by a deployed Flower app (the factories take no arguments)."""

from __future__ import annotations

import lightning_fedcluster as lf
from lightning_fedcluster.algorithms import FedRC
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.helpers.mechanisms import EVERY_MECHANISM

ROUNDS = 3
STRATEGIES = {
    # Every client-side state the Flower node keeps: FedRC-Adam γ, persistent momentum, label
    # noise; cluster removal on the server; 4 of 6 clients a round.
    "fedrc": lambda: lf.FedRCStrategy(
        3,
        clients_per_round=4,
        local_steps=2,
        config=FedRC.Config(adam_gamma=True, label_noise_std=0.1, removal_threshold=0.33),
        optimizer_state="persist",
        executor="loop",
    ),
    "fedem": lambda: lf.FedEMStrategy(2, local_epochs=1, executor="loop"),
    "ifca": lambda: lf.IFCAStrategy(2, local_steps=3, executor="loop"),
    "fedavg": lambda: lf.FedAvgStrategy(clients_per_round=5, local_steps=2, executor="loop"),
    # Estimation passes on the nodes, selection and importance on the server, personal models on
    # the nodes; 3 of 6 clients per cluster, estimation every 2 rounds.
    "fedsoft": lambda: lf.FedSoftStrategy(2, selection_size=3, local_steps=2, executor="loop"),
    # The server reads per-client vectors: CFL's updates (thresholds that split at once; the
    # new clusters and the movers' ω go back to the nodes), FeSEM/WeCFL's first-round models
    # for the centres, then reassignment by model distances on the nodes.
    "cfl": lambda: lf.CFLStrategy(3, eps1=10.0, eps2=1e-3, local_steps=2, executor="loop"),
    "fesem": lambda: lf.FeSEMStrategy(2, local_steps=2, executor="loop"),
    "wecfl": lambda: lf.WeCFLStrategy(2, clients_per_round=4, local_steps=2, executor="loop"),
    # The server's own optimizer (FedAdam) on the aggregated updates.
    "fedrc_server_adam": lambda: lf.FedRCStrategy(
        2, local_steps=2, server_optimizer="adam", server_lr=0.01, executor="loop"
    ),
    # Concept grouping after round 0 from the nodes' signatures (ω goes back to the nodes), held
    # with a one-round ramp (the nodes blend their E-step's γ with ω); the groups of one client get
    # no cluster and the two clusters no group took retire with it (group_retire), then a merge
    # after round 2 from the clients' reported cluster scores (a threshold that always merges);
    # the clients another cluster scores higher are released from the hold after round 1; from
    # round index 1 the server weighs each copy by N_i · (3/4 + ω_ik/4), from 2 by N_i · (1/2 + ω_ik/2)
    # (omega_weighting_from with a one-round omega_weighting_ramp to omega_weighting_strength 1/2);
    # each copy's local gradient is clipped to norm 0.5 (gradient_clip_val).
    "fedrc_grouping": lambda: lf.FedRCStrategy(
        4,
        local_steps=2,
        config=EVERY_MECHANISM,
        gradient_clip_val=0.5,
        executor="loop",
    ),
    # K = 4 on two concepts: after round 1 the server retires the clusters no client owns (ω
    # renormalised on the nodes from the alive clusters each message carries).
    "fedrc_retire": lambda: lf.FedRCStrategy(
        4, local_steps=2, config=FedRC.Config(retire_after=1), executor="loop",
    ),
    # The concept-discovery policy from K = 4: placements from the clients' reported cluster
    # scores, placed clients' γ ramped towards their cluster, unplaced copies weighed by ω.
    "fedrc_discovery": lambda: lf.FedRCStrategy(
        4, discovery=lf.ConceptDiscovery(), local_steps=2, executor="loop",
    ),
    # One shared feature layer, K heads: the nodes also send the shared layers' update.
    "fedrc_shared": lambda: lf.FedRCStrategy(2, shared_layers=("net.0",), local_steps=2, executor="loop"),
}  # fmt: skip


class MomentumMLP(MLPClassifier):
    def configure_optimizers(self):
        import torch

        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def make_module() -> MLPClassifier:
    return MomentumMLP()


def make_datamodule() -> DigitsFederated:
    return DigitsFederated(num_clients=6, concepts=2, seed=0, batch_size=16)


def fedrc_strategy() -> lf.FedRCStrategy:
    return STRATEGIES["fedrc"]()
