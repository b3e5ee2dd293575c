"""The take-off study's configurations and jobs (``takeoff_runs.py`` runs them, ``takeoff_runs.py
configs`` prints them): each configuration is a strategy kind, the K it starts from and the FedRC
options; each option set keeps, beside it, the measurement that led to it (the take-off study,
``results/takeoff.md``). ``job_list`` orders the jobs by priority.

    fedrc      plain FedRC, K = 3 (today's baseline)
    group      concept grouping after round 15 with the C floor 0.01 (the screening's best)
    group+merge  the same and cluster merging (0.5 nats per sample, from round 25 on)
    robust+merge the robust grouping below, merging as above and ``retire_after=25`` (K from the
               data: on the one-concept scenario and with K started at 6)
    robust     the grouping with group_assign="mean", group_margin=0.7, group_hold=5 and
               group_late_round=20
    robust10   the same with group_hold=10 (first in priority)
    robust10+merge  robust10 with merges and retirement as in robust+merge
    robust10+removal  robust10 with FedRC's adaptive K (App. F) at removal_threshold=0.1
    robust10+removal25  the same from round 25 on (removal_after=25); robust10+removal15 from 15
    robust10+merge+removal  robust10 with merges, retirement and the removal, all from round 25
    robust10+merge+removal+floor05 / +floor10  the same with label_stats_floor 0.05 / 0.1;
               +floor10-late without the late pass; +floor10+ramp4 with group_ramp=4;
               +ramp4+events30 the same with every K event from round 30; +retire15 with
               retire_after=15; +gretire / +gretire10 with group_retire 0 / 0.1 (+gretire10-k6, run
               on all four cells, was the docs' first K-from-the-data block;
               +gretire10+hold30-k6, the same with group_hold=30 and every K event from round
               50, the block that replaced it, also run from K = 3 on the one-concept
               scenario; +hold20-k6: group_hold=20, K events from round 40;
               +hold30+release-k6, the block after it: the 30-round hold with
               group_release=0.25 in 5 rounds in a row);
               -k6 suffixes: K started at 6
    fedavg     FedAvgStrategy (one model)
    ...+omegaw  the same FedRC options with the server weighing each copy by N_i · ω_ik
               (omega_weighting_from=0), screened after the ceiling's models trained faster;
               +omegaw15 the same from the round after the grouping (omega_weighting_from=15);
               +omegaw15r10 / r30 the same started in steps over 10 / 30 rounds
               (omega_weighting_ramp; first run as a benchmark variant, bit-identical)
               +omegaw15s50 the same ending at α = 0.5 (omega_weighting_strength; first run
               as an edit of the same formula); +omegaw15c5 the full weighting with every
               local gradient clipped to norm 5 per cluster copy (the strategy's
               gradient_clip_val; first run as an edit of the same operation, checked
               bit-identical)
    true       the ceiling: K = 3 with every client's γ and ω one-hot at its concept from round 1
               (``TrueConceptFedRC``: FedAvg per concept); floor 0.1, as the recommended block,
               for the recorded E-step scores
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CELLS = ("a1", "a10", "m1", "m10")
MNIST_CELLS = ("m1", "m10")
ONE_CONCEPT = "m10-one"
GROUP = {"group_round": 15, "label_stats_floor": 0.01}
MERGE = {"merge_threshold": 0.5, "merge_after": 25}
# The robust grouping screened on the CPU on 2026-11-26 (results/takeoff.md): the mean assignment,
# the margin, the hold and the late pass for the clients the margin leaves out.
ROBUST = {**GROUP, "group_assign": "mean", "group_margin": 0.7, "group_hold": 5, "group_late_round": 20}
# K from the data on the take-off cells: the robust grouping, merges of 0.5 nats and the retirement
# of clusters no client owns, both from round 25 (not measured on these cells before).
ROBUST_MERGE = {**ROBUST, **MERGE, "retire_after": 25}
# The hold of 10 rounds: the drift after a 5-round hold did not happen on the two digits-28 seeds it
# hit, in 30 rounds.
ROBUST10 = {**ROBUST, "group_hold": 10}
ROBUST10_MERGE = {**ROBUST10, **MERGE, "retire_after": 25}
# K from the data by FedRC's own adaptive K (App. F, ``removal_threshold``) above the paper's 0.05: with
# K = 6 the grouping puts the two inverted-image clients (concepts 0 and 1) in a fourth group of
# their own (8 % of the data), which merging never fuses.
ROBUST10_REMOVAL = {**ROBUST10, "removal_threshold": 0.1}
# The same removal from round 25 or 15 on (``removal_after``): from round 0 it also removed before
# the grouping, and one concept's last model fell to chance; it fell with 15 too.
ROBUST10_REMOVAL25 = {**ROBUST10_REMOVAL, "removal_after": 25}
# From the round after the grouping (group_round = 15), while its hold keeps ω as grouped.
ROBUST10_REMOVAL15 = {**ROBUST10_REMOVAL, "removal_after": 15}
# Both: merges and retirement of unowned clusters (one concept's emptied clusters) and the removal
# of owned-but-small ones (the inverted-image pair under K = 6), all from round 25, after the
# grouping's hold.
ROBUST10_MERGE_REMOVAL = {**ROBUST10_MERGE, "removal_threshold": 0.1, "removal_after": 25}
# The same with a higher floor under C_{y,k}: after the hold, a client whose own cluster fits it
# poorly drifts to the cluster where its main label is rarest, pulled by 1 / C at the floor 0.01
# (a1 seed 0: the label-8 client 21 to concept 1's cluster, the label-0 client 12 to concept 2's).
# A floor of 0.05 caps that pull at 20x, 0.1 (uniform over 10 labels) removes it.
ROBUST10_MERGE_REMOVAL_FLOOR05 = {**ROBUST10_MERGE_REMOVAL, "label_stats_floor": 0.05}
ROBUST10_MERGE_REMOVAL_FLOOR10 = {**ROBUST10_MERGE_REMOVAL, "label_stats_floor": 0.1}
# With the floor at 0.1, FedRC's E-step placed a1's inverted-image clients right in rounds 16-19
# on 3 of 4 seeds, and the late pass (round 20) moved them back: the same without it.
ROBUST10_MERGE_REMOVAL_FLOOR10_NOLATE = {
    key: value for key, value in ROBUST10_MERGE_REMOVAL_FLOOR10.items() if key != "group_late_round"
}
# The floor-0.1 configuration with the hold's ramp: one concept's grouped cluster, handed 0.9 of
# every sample at once, died on 2 of 5 seeds; the ramp blends γ into the hold.
ROBUST10_MERGE_REMOVAL_FLOOR10_RAMP4 = {**ROBUST10_MERGE_REMOVAL_FLOOR10, "group_ramp": 4}
# The same with every K event (merge, retirement, removal) from round 30, five rounds after the
# hold (rounds 16-25): with one concept the events of rounds 25-26 removed the two working models,
# nobody's largest ω only because the hold kept ω as grouped.
K_EVENTS = ("merge_threshold", "retire_after", "removal_threshold")  # each K event's switch
K_EVENT_ROUNDS = ("merge_after", "retire_after", "removal_after")  # and the round it starts from


def k_events_from(options: dict[str, Any], first_round: int) -> dict[str, Any]:
    """``options`` with each K event it switches on (merge, retirement, removal) starting at
    ``first_round`` instead."""
    pairs = zip(K_EVENT_ROUNDS, K_EVENTS, strict=True)
    return {**options, **{key: first_round for key, switch in pairs if switch in options}}


RAMP4_EVENTS30 = k_events_from(ROBUST10_MERGE_REMOVAL_FLOOR10_RAMP4, 30)
# K = 6: the clusters no group took stay to round 30 at the (1 - share) leftover ω and take the
# samples the concept clusters fit worst; retiring them then made the concept models' updates grow.
# Retiring them the round after the grouping (all clusters, one concept included),
# with the grouping when it formed two or more groups (group_retire=0), and that with no cluster for
# a group under FedRC's removal share (0.1): its clients wait for the late pass instead.
RAMP4_EVENTS30_RETIRE15 = {**RAMP4_EVENTS30, "retire_after": 15}
RAMP4_EVENTS30_GROUP_RETIRE = {**RAMP4_EVENTS30, "group_retire": 0.0}
RAMP4_EVENTS30_GROUP_RETIRE10 = {**RAMP4_EVENTS30, "group_retire": 0.1}
# The docs' block with a 30-round hold and the K events from round 50: from K = 6 on digits-28 per
# class, one concept's model blew up at rounds 27-30 with ω held as well (its update 0.19 -> 0.81,
# accuracy 78.6 -> 64.7 %), and recovered while held (89.1 % at round 50); released at round 25, its
# clients left during the blow-up and the concept was lost.
RAMP4_GROUP_RETIRE10_HOLD30 = k_events_from({**RAMP4_EVENTS30_GROUP_RETIRE10, "group_hold": 30}, 50)
# Between the two: under the authors' skew (a1 seed 1) the 30-round hold kept a wrong grouping to
# round 45 and the removal at round 53 moved clients into the wrong clusters (-9 points against the
# 10-round hold); a 20-round hold with the K events from round 40 is probed there and on
# digits-28 per class, where the 10-round hold lost a concept.
RAMP4_GROUP_RETIRE10_HOLD20 = k_events_from({**RAMP4_EVENTS30_GROUP_RETIRE10, "group_hold": 20}, 40)
# The 30-round hold with a release of one client at a time (``group_release``): a held client whose
# E-step scores another cluster over 0.25 nats per sample higher in 5 held rounds in a row is freed.
# Screened offline on the 30-round hold's recorded scores (``placement.py release``): it
# frees 7 of a1's 19 and 8 of m1's 13 misplaced clients, 2 placed right on each, none on a10 or m10.
RAMP4_GROUP_RETIRE10_HOLD30_RELEASE = {
    **RAMP4_GROUP_RETIRE10_HOLD30, "group_release": 0.25, "group_release_rounds": 5
}  # fmt: skip
# The server weighing copies by ω from the round after the grouping, and the ramp that
# starts it in steps over 10 or 30 rounds, after two of its per-class runs blew up.
OMEGAW15 = {**RAMP4_GROUP_RETIRE10_HOLD30_RELEASE, "omega_weighting_from": 15}
CONFIGS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "fedrc": ("fedrc", 3, {}),
    "group": ("fedrc", 3, GROUP),
    "group+merge": ("fedrc", 3, {**GROUP, **MERGE}),
    "group+merge-k6": ("fedrc", 6, {**GROUP, **MERGE}),
    "robust": ("fedrc", 3, ROBUST),
    "robust10": ("fedrc", 3, ROBUST10),
    "robust10+merge": ("fedrc", 3, ROBUST10_MERGE),
    "robust10+merge-k6": ("fedrc", 6, ROBUST10_MERGE),
    "robust10+removal": ("fedrc", 3, ROBUST10_REMOVAL),
    "robust10+removal-k6": ("fedrc", 6, ROBUST10_REMOVAL),
    "robust10+removal25": ("fedrc", 3, ROBUST10_REMOVAL25),
    "robust10+removal15": ("fedrc", 3, ROBUST10_REMOVAL15),
    "robust10+removal25-k6": ("fedrc", 6, ROBUST10_REMOVAL25),
    "robust10+merge+removal": ("fedrc", 3, ROBUST10_MERGE_REMOVAL),
    "robust10+merge+removal-k6": ("fedrc", 6, ROBUST10_MERGE_REMOVAL),
    "robust10+merge+removal+floor05": ("fedrc", 3, ROBUST10_MERGE_REMOVAL_FLOOR05),
    "robust10+merge+removal+floor10": ("fedrc", 3, ROBUST10_MERGE_REMOVAL_FLOOR10),
    "robust10+merge+removal+floor10-k6": ("fedrc", 6, ROBUST10_MERGE_REMOVAL_FLOOR10),
    "robust10+merge+removal+floor10+ramp4": ("fedrc", 3, ROBUST10_MERGE_REMOVAL_FLOOR10_RAMP4),
    "robust10+merge+removal+floor10+ramp4-k6": ("fedrc", 6, ROBUST10_MERGE_REMOVAL_FLOOR10_RAMP4),
    "robust10+merge+removal+floor10+ramp4+events30": ("fedrc", 3, RAMP4_EVENTS30),
    "robust10+merge+removal+floor10+ramp4+events30-k6": ("fedrc", 6, RAMP4_EVENTS30),
    "robust10+merge+removal+floor10+ramp4+events30+retire15": ("fedrc", 3, RAMP4_EVENTS30_RETIRE15),
    "robust10+merge+removal+floor10+ramp4+events30+retire15-k6": ("fedrc", 6, RAMP4_EVENTS30_RETIRE15),
    "robust10+merge+removal+floor10+ramp4+events30+gretire": ("fedrc", 3, RAMP4_EVENTS30_GROUP_RETIRE),
    "robust10+merge+removal+floor10+ramp4+events30+gretire-k6": ("fedrc", 6, RAMP4_EVENTS30_GROUP_RETIRE),
    "robust10+merge+removal+floor10+ramp4+events30+gretire10": ("fedrc", 3, RAMP4_EVENTS30_GROUP_RETIRE10),
    "robust10+merge+removal+floor10+ramp4+events30+gretire10-k6": ("fedrc", 6, RAMP4_EVENTS30_GROUP_RETIRE10),
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30": ("fedrc", 3, RAMP4_GROUP_RETIRE10_HOLD30),
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30-k6": ("fedrc", 6, RAMP4_GROUP_RETIRE10_HOLD30),
    "robust10+merge+removal+floor10+ramp4+gretire10+hold20-k6": ("fedrc", 6, RAMP4_GROUP_RETIRE10_HOLD20),
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30+release-k6": (
        "fedrc", 6, RAMP4_GROUP_RETIRE10_HOLD30_RELEASE
    ),  # fmt: skip
    "robust10+merge+removal+floor10-late": ("fedrc", 3, ROBUST10_MERGE_REMOVAL_FLOOR10_NOLATE),
    "robust+merge": ("fedrc", 3, ROBUST_MERGE),
    "robust+merge-k6": ("fedrc", 6, ROBUST_MERGE),
    "fedavg": ("fedavg", 1, {}),
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30+release+omegaw-k6": (
        "fedrc", 6, {**RAMP4_GROUP_RETIRE10_HOLD30_RELEASE, "omega_weighting_from": 0}
    ),  # fmt: skip
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30+release+omegaw15-k6": (
        "fedrc", 6, OMEGAW15
    ),  # fmt: skip
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30+release+omegaw15r10-k6": (
        "fedrc", 6, {**OMEGAW15, "omega_weighting_ramp": 10}
    ),  # fmt: skip
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30+release+omegaw15s50-k6": (
        "fedrc", 6, {**OMEGAW15, "omega_weighting_strength": 0.5}
    ),
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30+release+omegaw15c5-k6": (
        "fedrc", 6, {**OMEGAW15, "gradient_clip_val": 5.0}
    ),
    "robust10+merge+removal+floor10+ramp4+gretire10+hold30+release+omegaw15r30-k6": (
        "fedrc", 6, {**OMEGAW15, "omega_weighting_ramp": 30}
    ),  # fmt: skip
    "true": ("true", 3, {"label_stats_floor": 0.1}),
}


@dataclass(frozen=True)
class Job:
    config: str
    cell: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.config}/{self.cell}/s{self.seed}"


def job_list(seeds: list[int]) -> list[Job]:
    """Every job, in priority order."""
    both = "robust10+merge+removal"
    jobs = [Job(f"{both}-k6", "m10", s) for s in seeds]
    jobs += [Job(config, ONE_CONCEPT, s) for config in (both, "fedavg") for s in seeds]
    jobs += [Job(f"{both}-k6", "m1", s) for s in seeds]
    jobs += [Job(both, cell, s) for cell in CELLS for s in seeds]
    jobs += [Job("robust10", cell, s) for cell in CELLS for s in seeds]
    floors = ("05", "10", "10-late")
    jobs += [Job(f"{both}+floor{f}", cell, s) for f in floors for cell in CELLS for s in seeds]
    jobs += [Job(f"{both}+floor10-k6", cell, s) for cell in MNIST_CELLS for s in seeds]
    jobs += [Job(f"{both}+floor10", ONE_CONCEPT, s) for s in seeds]
    jobs += [Job(f"{both}+floor10+ramp4", cell, s) for cell in (ONE_CONCEPT, *CELLS) for s in seeds]
    jobs += [Job(f"{both}+floor10+ramp4-k6", cell, s) for cell in MNIST_CELLS for s in seeds]
    jobs += [Job(f"{both}+floor10+ramp4+events30", ONE_CONCEPT, s) for s in seeds]
    jobs += [Job(f"{both}+floor10+ramp4+events30-k6", cell, s) for cell in MNIST_CELLS for s in seeds]
    for retire in ("retire15", "gretire", "gretire10"):
        config = f"{both}+floor10+ramp4+events30+{retire}"
        jobs += [Job(f"{config}-k6", cell, s) for cell in MNIST_CELLS for s in seeds]
        jobs += [Job(config, ONE_CONCEPT, s) for s in seeds]
    recommended = f"{both}+floor10+ramp4+events30+gretire10-k6"  # the docs' K-from-the-data block
    jobs += [Job(recommended, cell, s) for cell in ("a10", "a1") for s in seeds]
    held30 = f"{both}+floor10+ramp4+gretire10+hold30-k6"
    jobs += [Job(held30, cell, s) for cell in ("a10", *MNIST_CELLS) for s in seeds]
    jobs += [Job(config, ONE_CONCEPT, s) for config in (held30, held30.removesuffix("-k6")) for s in seeds]
    jobs += [Job(held30, "a1", s) for s in seeds]
    held20 = held30.replace("hold30", "hold20")
    jobs += [Job(held20, cell, s) for cell in ("a1", "a10") for s in seeds]
    # seed-major, so a run stopped early keeps the MNIST cells at the same number of seeds
    jobs += [Job(held20, cell, s) for s in seeds for cell in MNIST_CELLS]
    jobs += [Job(held20, ONE_CONCEPT, s) for s in seeds]
    released = held30.replace("hold30", "hold30+release")  # the cells where it frees clients first
    jobs += [Job(released, cell, s) for s in seeds for cell in ("a1", "m1")]
    jobs += [Job(released, cell, s) for cell in (ONE_CONCEPT, "a10", "m10") for s in seeds]
    # seed-major, the unmet targets first
    for weighted in ("omegaw15", "omegaw", "omegaw15r10", "omegaw15r30", "omegaw15s50", "omegaw15c5"):
        weighted = released.replace("release", f"release+{weighted}")
        jobs += [Job(weighted, cell, s) for s in seeds for cell in ("m1", "a1")]
        jobs += [Job(weighted, cell, s) for s in seeds for cell in ("a10", "m10", ONE_CONCEPT)]
    # the ceiling: seed-major, the cells with the unmet targets first
    for cells in (("m1", "a1"), ("m10", "a10")):
        jobs += [Job("true", cell, s) for s in seeds for cell in cells]
    jobs += [Job("robust10+merge", ONE_CONCEPT, s) for s in seeds]
    jobs += [Job("robust10+merge-k6", "m10", s) for s in seeds]
    jobs += [Job("robust10+removal-k6", cell, s) for cell in MNIST_CELLS for s in seeds]
    jobs += [Job("robust10+removal", ONE_CONCEPT, s) for s in seeds]
    jobs += [Job("robust10+removal25", ONE_CONCEPT, s) for s in seeds]
    jobs += [Job("robust10+removal15", ONE_CONCEPT, s) for s in seeds]
    jobs += [Job("robust10+removal25-k6", cell, s) for cell in MNIST_CELLS for s in seeds]
    jobs += [Job("robust", cell, s) for cell in CELLS for s in seeds]
    jobs += [Job("robust+merge", ONE_CONCEPT, s) for s in seeds]
    jobs += [Job("robust+merge-k6", "m10", s) for s in seeds]
    jobs += [Job("group", cell, s) for cell in CELLS for s in seeds]
    jobs += [Job("fedrc", cell, s) for cell in CELLS for s in seeds]
    jobs += [Job("group+merge", ONE_CONCEPT, s) for s in seeds]
    jobs += [Job("group+merge-k6", "m10", s) for s in seeds]
    return jobs
