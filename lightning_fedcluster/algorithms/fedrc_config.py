"""FedRC's (and FedEM's) options, ``FedRC.Config``: defaults, checks and docs in one place (the
rule in ``fedrc.py`` and ``FedRCStrategy`` read them; nothing else repeats them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_fedcluster.algorithms.discovery.grouping import ConceptGrouping, check_grouping_values
from lightning_fedcluster.algorithms.discovery.merging import ClusterMerging
from lightning_fedcluster.algorithms.discovery.protocol import Component
from lightning_fedcluster.algorithms.discovery.release import HoldRelease, check_release_values
from lightning_fedcluster.algorithms.discovery.removal import ClusterRemoval
from lightning_fedcluster.algorithms.discovery.reseed import ClusterReseed
from lightning_fedcluster.algorithms.discovery.retirement import ClusterRetirement
from lightning_fedcluster.algorithms.discovery.weighting import OmegaWeighting
from lightning_fedcluster.algorithms.mixture import LABEL_STATS_FLOOR


@dataclass(frozen=True)
class FedRCConfig:
    """FedRC's (and FedEM's) options, ``FedRC.Config``: defaults, checks and docs in one place.

    Args:
        use_label_stats: divide by C_{y,k} (FedRC); False gives FedEM (C ≡ 1; works for regression).
        hard_prediction: predict with the argmax-ω model only (TeHC) instead of the ω-mixture.
        hard_training: train only the argmax-ω model, every sample with weight 1 (TrHC; it hurts,
            paper Table 15: ablations only).
        adam_gamma: FedRC-Adam (App. H.3): Adam steps on γ with g = γ_prev − γ_E-step, γ kept per
            sample between rounds.
        label_noise_std: σ_i of the Gaussian noise each client adds to its label sums (privacy,
            App. E); one value for all clients, or one per client.
        removal_threshold: δ of adaptive K (App. F, e.g. 0.05): start with a generous
            ``num_clusters`` and, after each round, remove clusters whose share of γ over all seen
            clients' data is below δ (None: never).
        removal_after: adaptive K removes no cluster in the first this-many rounds, the first
            removal may come at the end of round ``removal_after + 1`` (rounds counted from 1; needs
            ``removal_threshold``; 0, the paper's, from the first round). With grouping,
            ``group_round`` or later removes the clusters the grouping left small instead of those
            the nearly uniform shares before it happen to put under δ
            (``docs/how-clusters-form.md``, "Finding K from an upper bound").
        label_stats_floor: the smallest C_{y,k} the E-step divides by (the authors' 1e-8). A
            cluster that holds almost no rows of label y otherwise pulls every label-y sample of
            every client towards itself by up to 1/floor, which breaks up concept clusters whose
            clients lack some labels (strong label skew, few clients per cluster); e.g. 0.01 caps
            the pull at 100x.
        reseed_threshold: a remedy for dead clusters, off by default and in the paper presets
            (e.g. 0.05): after a round, the emptiest cluster whose share of γ is below it restarts
            as a copy of the largest cluster, which hands it a seeded random half of its clients
            (`reseed`); a server optimizer restarts its state for the re-seeded cluster. Not
            with ``removal_threshold`` or ``adam_gamma``.
        reseed_seed: seeds the random half of clients a re-seeding moves (a strategy passes its
            ``seed``).
        group_round: concept grouping, a take-off mechanism
            ([`grouping`][lightning_fedcluster.algorithms.discovery.grouping], ours; off by
            default and in the paper presets): in the rounds before it, clients compute a
            label-conditioned prediction signature in their E-step; after round ``group_round``
            the server groups them by k-medoids and gives each group's clients ω ``group_share``
            on one cluster (docs: "How clusters form").
        group_share: the grouped clients' ω on their group's cluster (needs ``group_round``).
        group_assign: "medoid" (k-medoids' groups, the default) or "mean": each client then moves
            to the group whose members are closest on average, weighted by the labels the two
            share, which keeps clients with noisy signatures (corrupted images, few shared
            labels) from dragging a group
            ([`grouping`][lightning_fedcluster.algorithms.discovery.grouping]; needs ``group_round``).
        group_margin: e.g. 0.7: group only the clients whose best group score is below this
            times the second best; the others get uniform ω and FedRC's E-step places them
            (None: group every client; needs ``group_round``).
        group_hold: e.g. 10: for this many rounds after the grouping, a grouped client gives
            every sample γ = its ω, so that each concept's cluster learns all of the concept's
            labels before FedRC's E-step may move samples again (0: never; needs ``group_round``).
        group_late_round: e.g. 20, with ``group_margin``: after this many rounds, each client the
            margin left ungrouped goes to the cluster whose grouped clients' signatures are
            closest on average, and is held for ``group_hold`` rounds
            ([`grouping`][lightning_fedcluster.algorithms.discovery.grouping]; None:
            FedRC's E-step places them; needs ``group_round``).
        group_ramp: e.g. 4, with ``group_hold``: in the first this-many held rounds a held
            client's γ is α·ω + (1 − α)·(the E-step's γ), α = h / (group_ramp + 1) in held round h,
            so that a cluster that had fitted only some samples is not handed 0.9 of every
            sample at once (0: γ = ω from the first held round; below ``group_hold``).
        group_retire: K from the data, with the grouping (e.g. 0.1, with ``group_margin``): a
            group holding less than this share of the rows gets no cluster (its clients wait for
            the late pass), and the clusters no group went to retire when two or more groups got
            one ([`grouping`][lightning_fedcluster.algorithms.discovery.grouping]; 0: only the
            latter; None: neither; needs ``group_round``).
        group_release: e.g. 0.25, with ``group_hold``: release a held client from the hold early
            when the E-step score (mean −loss − log C per sample) of another cluster in use (some
            client's largest ω) exceeds its own cluster's by more than this (nats) in
            ``group_release_rounds`` held rounds in a row; its ω may then move
            ([`release`][lightning_fedcluster.algorithms.discovery.release]; None: every client is held to the
            end).
        group_release_rounds: the held rounds in a row of ``group_release`` (needs it).
        merge_threshold: merging ([`merging`][lightning_fedcluster.algorithms.discovery.merging], ours):
            after the first ``merge_after`` rounds, at a round's end, retire one of the two
            clusters whose members' mean log-likelihood per sample differs least between them,
            when that gap is below this (nats); None: never. With grouping, ``num_clusters`` is
            then an upper bound on K.
        merge_after: no merge in the first this-many rounds, the first may come at the end of
            round ``merge_after + 1`` (needs ``merge_threshold``).
        retire_after: retirement ([`retirement`][lightning_fedcluster.algorithms.discovery.retirement]): after
            the first this-many rounds, at the end of every round, retire the clusters that no seen
            client's largest ω points to, so that the models held are the clusters in use (None:
            never). With grouping, at least ``group_round``; not with ``reseed_threshold``, which
            revives such clusters. With a hold, start it (and ``merge_after``, ``removal_after``)
            a few rounds after the hold ends, e.g. ``group_round + group_hold + 5``: while ω is
            held as grouped, a cluster nobody's largest ω points to may still be the one that fits
            (How clusters form).
        omega_weighting_from: e.g. ``group_round``: after the first this-many rounds (from round
            ``omega_weighting_from + 1`` on, the first after a grouping at ``group_round``), the
            server weighs client i's copy of cluster k by N_i · ω_ik instead of the authors' N_i (ours). Each
            sample's γ already scales its gradient, so with N_i a cluster serving a third of the
            data moves at about a third of FedAvg's rate; with ω it moves at about the rate of
            FedAvg over its own clients. Uniform ω gives the same weights as N_i. Off by default
            (None: N_i); recommended with the strategy's ``gradient_clip_val`` (5 on the take-off
            cells and the main job): alone it blew up a concept model on 2 of 10 per-class runs,
            with the clip no run fell (How clusters form, "The configuration we recommend").
        omega_weighting_ramp: e.g. 10, with ``omega_weighting_from``: in the first this-many
            rounds of the weighting, client i's copy of cluster k weighs N_i · ((1 − α) + α · ω_ik),
            α = h / (ramp + 1) in the weighting's round h, so that a cluster's rate rises from the
            authors' to FedAvg's over its own clients in steps (0: N_i · ω_ik from the first round).
        omega_weighting_strength: in (0, 1], with ``omega_weighting_from``: the α the weighting
            (or its ramp) ends at, weight N_i · ((1 − α) + α · ω_ik) (ours). With three equal
            concepts 1 moves a cluster at about three times the authors' rate and 0.5 at about 1.5
            times; 0.5 kept the two per-class runs the full rate blew up (How clusters form).
    """

    use_label_stats: bool = True
    hard_prediction: bool = False
    hard_training: bool = False
    adam_gamma: bool = False
    label_noise_std: float | tuple[float, ...] = 0.0
    removal_threshold: float | None = None
    removal_after: int = 0
    label_stats_floor: float = LABEL_STATS_FLOOR
    reseed_threshold: float | None = None
    reseed_seed: int = 0
    group_round: int | None = None
    group_share: float = 0.9
    group_assign: str = "medoid"
    group_margin: float | None = None
    group_hold: int = 0
    group_late_round: int | None = None
    group_ramp: int = 0
    group_retire: float | None = None
    group_release: float | None = None
    group_release_rounds: int = 5
    merge_threshold: float | None = None
    merge_after: int = 0
    retire_after: int | None = None
    omega_weighting_from: int | None = None
    omega_weighting_ramp: int = 0
    omega_weighting_strength: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.label_noise_std, (int, float)):  # one σ per client: kept as a tuple
            object.__setattr__(self, "label_noise_std", tuple(self.label_noise_std))
        check_options(
            self.use_label_stats,
            self.label_noise_std,
            self.removal_threshold,
            self.reseed_threshold,
            self.adam_gamma,
        )
        floor = self.label_stats_floor
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor < 1:
            raise ValueError(f"label_stats_floor must be in (0, 1) (the authors' 1e-8), got {floor!r}")
        for name, on in (
            ("group_round", self.group_round is not None),
            ("merge_threshold", self.merge_threshold is not None),
        ):
            if on and self.adam_gamma:
                raise ValueError(f"{name} cannot be combined with adam_gamma: use one or the other")
        # Each value on its own first, so that a bad one is named before a missing option it needs.
        check_grouping_values(
            self.group_share,
            self.group_assign,
            self.group_margin,
            self.group_hold,
            self.group_ramp,
            self.group_retire,
            self.group_late_round,
        )
        check_release_values(self.group_release, self.group_release_rounds)
        rounds = {
            "removal_after": self.removal_after,
            "merge_after": self.merge_after,
            "omega_weighting_ramp": self.omega_weighting_ramp,
        }
        if self.omega_weighting_from is not None:  # None: off
            rounds["omega_weighting_from"] = self.omega_weighting_from
        for name, index in rounds.items():
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise ValueError(f"{name} must be a number of rounds >= 0, got {index!r}")
        strength = self.omega_weighting_strength
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not 0 < strength <= 1:
            raise ValueError(
                f"omega_weighting_strength must be a number in (0, 1] (1: N_i · ω_ik), got {strength!r}"
            )
        for name, value, default, needs, on in (
            ("group_share", self.group_share, 0.9, "group_round", self.group_round is not None),
            ("group_assign", self.group_assign, "medoid", "group_round", self.group_round is not None),
            ("group_margin", self.group_margin, None, "group_round", self.group_round is not None),
            ("group_hold", self.group_hold, 0, "group_round", self.group_round is not None),
            ("group_late_round", self.group_late_round, None, "group_round", self.group_round is not None),
            ("group_ramp", self.group_ramp, 0, "group_round", self.group_round is not None),
            ("group_retire", self.group_retire, None, "group_round", self.group_round is not None),
            ("group_release", self.group_release, None, "group_hold", bool(self.group_hold)),
            (
                "group_release_rounds",
                self.group_release_rounds,
                5,
                "group_release",
                self.group_release is not None,
            ),
            ("merge_after", self.merge_after, 0, "merge_threshold", self.merge_threshold is not None),
            ("removal_after", self.removal_after, 0, "removal_threshold", self.removal_threshold is not None),
            (
                "omega_weighting_ramp",
                self.omega_weighting_ramp,
                0,
                "omega_weighting_from",
                self.omega_weighting_from is not None,
            ),
            (
                "omega_weighting_strength",
                self.omega_weighting_strength,
                1.0,
                "omega_weighting_from",
                self.omega_weighting_from is not None,
            ),
        ):
            if not on and value != default:
                raise ValueError(
                    f"{name}={value!r} has no effect without {needs}: set {needs} too, or drop it"
                )
        self.grouping, self.release, self.merging, self.retirement  # noqa: B018 - their own checks of the values
        if self.retire_after is not None and self.reseed_threshold is not None:
            raise ValueError(
                "retire_after cannot be combined with reseed_threshold (one retires the clusters the "
                "other revives): use one or the other"
            )
        grouped_by = self.group_round
        if self.retire_after is not None and grouped_by is not None and self.retire_after < grouped_by:
            raise ValueError(
                f"retire_after={self.retire_after!r} must be >= group_round={grouped_by!r}: before the "
                "grouping ω is nearly uniform and clusters are owned by chance"
            )

    def round_options(self) -> dict[str, int]:
        """The round options that are set, each with its value: the rounds that come before it acts
        (every round option counts rounds, as ``max_epochs`` does)."""
        named = {
            "group_round": self.group_round,
            "group_late_round": self.group_late_round,
            "removal_after": self.removal_after if self.removal_threshold is not None else None,
            "merge_after": self.merge_after if self.merge_threshold is not None else None,
            "retire_after": self.retire_after,
            "omega_weighting_from": self.omega_weighting_from,
        }
        return {name: value for name, value in named.items() if value is not None}

    def components(self) -> tuple[Component, ...]:
        """The mechanisms these options turn on, as discovery components in the order FedRC runs
        them: concept grouping, the hold's release, merging, retirement, re-seeding, removal
        (App. F), the ω weighting of the copies (none: the paper's FedRC)."""
        weighting = None
        if self.omega_weighting_from is not None:
            weighting = OmegaWeighting(
                self.omega_weighting_from, self.omega_weighting_ramp, self.omega_weighting_strength
            )
        reseed = None
        if self.reseed_threshold is not None:
            reseed = ClusterReseed(self.reseed_threshold, self.reseed_seed)
        removal = None
        if self.removal_threshold is not None:
            removal = ClusterRemoval(self.removal_threshold, self.removal_after)
        built = (self.grouping, self.release, self.merging, self.retirement, reseed, removal, weighting)
        return tuple(component for component in built if component is not None)

    @property
    def grouping(self) -> ConceptGrouping | None:
        """Concept grouping as configured (None: off)."""
        if self.group_round is None:
            return None
        return ConceptGrouping(
            self.group_round,
            self.group_share,
            self.group_assign,
            self.group_margin,
            self.group_hold,
            self.group_late_round,
            self.group_ramp,
            self.group_retire,
        )

    @property
    def release(self) -> HoldRelease | None:
        """The early release from the grouping's hold as configured (None: off)."""
        if self.group_release is None or self.grouping is None:
            return None
        return HoldRelease(self.grouping, self.group_release, self.group_release_rounds)

    @property
    def retirement(self) -> ClusterRetirement | None:
        """Retirement of unowned clusters as configured (None: off)."""
        return None if self.retire_after is None else ClusterRetirement(self.retire_after)

    @property
    def merging(self) -> ClusterMerging | None:
        """Cluster merging as configured (None: off)."""
        return (
            None if self.merge_threshold is None else ClusterMerging(self.merge_threshold, self.merge_after)
        )


def check_options(
    use_label_stats: bool,
    label_noise_std: float | Sequence[float],
    removal_threshold: float | None,
    reseed_threshold: float | None,
    adam_gamma: bool,
) -> None:
    """ValueError, naming the option, for FedRC options out of range or in conflict."""
    stds = [label_noise_std] if isinstance(label_noise_std, (int, float)) else list(label_noise_std)
    if any(isinstance(s, bool) or not isinstance(s, (int, float)) or not s >= 0 for s in stds):
        raise ValueError(
            f"label_noise_std must be >= 0 (one value or one per client), got {label_noise_std!r}"
        )
    if not use_label_stats and label_noise_std != 0.0:
        raise ValueError("label_noise_std applies to FedRC's label statistics; FedEM has none")
    if removal_threshold is not None and not 0 < removal_threshold < 1:
        raise ValueError(
            f"removal_threshold must be in (0, 1) (the paper uses 0.05), got {removal_threshold!r}"
        )
    if reseed_threshold is None:
        return
    threshold = reseed_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ValueError(f"reseed_threshold must be in (0, 1) (e.g. 0.05), got {threshold!r}")
    conflicts = {
        "removal_threshold": removal_threshold is not None,  # one removes the clusters the other revives
        "adam_gamma": adam_gamma,  # per-sample γ would have to be split too
    }
    named = [name for name, on in conflicts.items() if on]
    if named:
        raise ValueError(f"reseed_threshold cannot be combined with {', '.join(named)}: use one or the other")
