"""discovery_round_cost.py: a short real run of both sides prints the table row and the machine."""

from __future__ import annotations

import pytest
from discovery_round_cost import RoundClock, main


def test_both_sides_run_and_the_row_holds_their_seconds_and_ratio(capsys, threads_restored):
    main(["--cells", "tabular-mixed", "--repeats", "1", "--rounds", "8"])
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    (row,) = [line for line in out.splitlines() if line.startswith("| tabular-mixed |")]
    paper, policy, ratio = (float(cell) for cell in row.strip("| ").split(" | ")[1:])
    assert paper > 0 and policy > 0 and 0.2 < ratio < 5


def test_the_clock_stops_the_fit_after_its_rounds_and_keeps_one_time_each():
    class Trainer:
        should_stop = False

    clock, trainer = RoundClock(stop_after=2), Trainer()
    for _ in range(2):
        clock.on_train_epoch_start(trainer, None)
        assert not trainer.should_stop
        clock.on_train_epoch_end(trainer, None)
    assert trainer.should_stop and len(clock.seconds) == 2 and min(clock.seconds) >= 0


def test_too_short_a_run_is_refused_before_training(capsys):
    with pytest.raises(SystemExit):
        main(["--rounds", "4"])
    assert "--rounds at least 8" in capsys.readouterr().err
