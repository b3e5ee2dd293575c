"""benchmarks/fall_probe.py's probe: its momentum norms are those of the persisted store, and its
momentum restart after round R makes round R + 1 start from fresh local-optimizer state, as
``optimizer_state="reset"`` does every round (so a 2-round fit restarted after round 1 equals a
reset fit to the bit, and without the restart it does not); its local gradient norms are taken
before ``gradient_clip_val`` clips them, one per client and step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fall_probe import FallProbe

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

SCRIPT = Path(__file__).resolve().parents[1] / "fall_probe.py"


def _fit(optimizer_state: str, probe: FallProbe | None = None, clip: float | None = None):
    strategy = lf.FedRCStrategy(2, local_steps=2, clients_per_round=None, executor="loop",
                                optimizer_state=optimizer_state, seed=0, gradient_clip_val=clip)  # fmt: skip
    trainer = make_trainer(strategy, max_epochs=2, callbacks=[] if probe is None else [probe])
    torch.manual_seed(0)
    data = DigitsFederated(num_clients=6, concepts=2, seed=0)
    trainer.fit(MLPClassifier(lr=0.05, momentum=0.9), datamodule=data)
    return trainer.lightning_module


def _weights(module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in module.state_dict().values()]


def test_the_probe_reads_the_persisted_momentum_of_every_client():
    probe = FallProbe(restart_after=None)
    module = _fit("persist", probe)
    state, layout = module.client_state, module.optimizer_layout
    row = probe.rows[-1]
    assert [r["round"] for r in probe.rows] == [1, 2] and sorted(row["clusters"]) == [0, 1]
    for k in (0, 1):
        norms = [
            float(torch.cat([v[e.offset : e.offset + e.numel] for e in layout.copy_entries(k)]).norm())
            for v in state.optimizer.values()
        ]
        assert len(norms) == 6 and min(norms) > 0
        assert row["clusters"][k]["momentum_mean"] == pytest.approx(sum(norms) / 6, rel=1e-6)
        assert row["clusters"][k]["momentum_max"] == pytest.approx(max(norms), rel=1e-6)
    assert row["omega_max_mean"] == pytest.approx(float(state.omega.max(1).values.mean()))


def test_a_restart_after_round_one_makes_round_two_start_fresh_as_reset_does():
    reset = _weights(_fit("reset"))
    restarted = _weights(_fit("persist", FallProbe(restart_after=1)))
    kept = _weights(_fit("persist", FallProbe(restart_after=None)))
    assert all(torch.equal(a, b) for a, b in zip(reset, restarted, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(reset, kept, strict=True))


def test_the_k_event_probes_drop_or_move_every_k_event_and_nothing_else():
    from fall_probe import probe_options

    options = {"group_round": 15, "label_stats_floor": 0.1, "merge_threshold": 0.5, "merge_after": 25,
               "retire_after": 25, "removal_threshold": 0.1, "removal_after": 25}  # fmt: skip
    dropped = probe_options(options, no_k_events=True, k_events_after=None)
    assert dropped == {"group_round": 15, "label_stats_floor": 0.1}
    moved = probe_options(options, no_k_events=False, k_events_after=30)
    assert moved == {**options, "merge_after": 30, "retire_after": 30, "removal_after": 30}
    # a configuration without merges gets no merge_after
    assert probe_options({"retire_after": 25}, no_k_events=False, k_events_after=30) == {"retire_after": 30}
    assert probe_options(options, no_k_events=False, k_events_after=None) == options
    held = probe_options(options, no_k_events=False, k_events_after=None, group_hold=40)
    assert held == {**options, "group_hold": 40}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--restart-momentum-after", "40"], "--restart-momentum-after must be a round in 1..31"),
        (["--k-events-after", "32"], "--k-events-after must be in 0..31"),
        (["--no-k-events", "--k-events-after", "30"], "contradict each other"),
        (["--config", "fedavg"], "is not a FedRC configuration"),
        (["--config", "fedrc", "--group-hold", "40"], "needs a configuration with the grouping"),
        (["--group-hold", "0"], "--group-hold must be >= 1"),
    ],
)
def test_the_probe_refuses_rounds_that_would_never_act_before_training(tmp_path, flags, message):
    command = [sys.executable, str(SCRIPT), "--data-root", str(tmp_path),
               "--rounds", "32", *flags]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr


def test_the_probe_records_each_step_gradient_norm_before_clipping_and_unwraps_after_the_fit():
    from lightning_fedcluster.engine.executors import loop

    original = loop.clip_copy_gradients
    probe = FallProbe(restart_after=None)
    _fit("persist", probe, clip=1e-3)
    assert loop.clip_copy_gradients is original
    for row in probe.rows:
        for k in (0, 1):
            norms = row["clusters"][k]["gradient_norm"]
            assert norms["median"] <= norms["p90"] <= norms["max"]
            assert norms["median"] > 1e-2  # the norms before the clip to 1e-3
            assert norms["steps"] == 6 * 2  # every client, both local steps
    assert len(probe.gradients.norms) == 0  # every round's norms were taken
