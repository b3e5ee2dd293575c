"""callbacks/data_summary.py: at fit start, rank 0 logs the scenario's table (and figure) at step 0
to the loggers that take text (and images), prints it when asked, and checks ``max_rows``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lightning_fedcluster.callbacks import data_summary
from lightning_fedcluster.callbacks.data_summary import DataSummary
from lightning_fedcluster.datamodules.summary import format_summary


class TextExperiment:
    """A logger's experiment that takes text only (no ``add_image``)."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str, int]] = []

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        self.texts.append((tag, text, global_step))


def trainer_with(datamodule, experiment, is_global_zero: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        datamodule=datamodule, is_global_zero=is_global_zero, loggers=[SimpleNamespace(experiment=experiment)]
    )


def test_the_table_is_logged_as_text_at_step_0_and_printed_when_asked(digits, capsys) -> None:
    experiment = TextExperiment()
    DataSummary(print_table=True, max_rows=2, figures=False).on_fit_start(
        trainer_with(digits, experiment), None
    )
    table = format_summary(digits, 2)
    assert len(table.splitlines()) < len(format_summary(digits, None).splitlines())  # max_rows is passed on
    assert capsys.readouterr().out == table + "\n"
    assert experiment.texts == [("data/summary_table", "```\n" + table + "\n```", 0)]


def test_the_figure_is_drawn_from_the_datamodule_and_logged_at_step_0(digits, monkeypatch) -> None:
    logged = []
    monkeypatch.setattr(
        data_summary, "log_figure", lambda trainer, tag, draw, step: logged.append((tag, draw(), step))
    )
    monkeypatch.setattr(data_summary, "summary_figure", lambda dm: ("figure of", dm))
    DataSummary().on_fit_start(trainer_with(digits, TextExperiment()), None)
    assert logged == [("data/summary", ("figure of", digits), 0)]


def test_other_ranks_and_other_datamodules_log_nothing(digits, capsys) -> None:
    for trainer in (
        trainer_with(digits, TextExperiment(), is_global_zero=False),
        trainer_with(object(), TextExperiment()),
    ):
        DataSummary(print_table=True, figures=False).on_fit_start(trainer, None)
        assert trainer.loggers[0].experiment.texts == []
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("max_rows", [0, -3, True, 2.5, "10"])
def test_a_bad_max_rows_is_refused_by_name(max_rows) -> None:
    with pytest.raises(ValueError, match="max_rows must be a positive integer or None"):
        DataSummary(max_rows=max_rows)
    assert DataSummary(max_rows=None).max_rows is None
