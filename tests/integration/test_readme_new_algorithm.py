"""The docs' "Adding an algorithm" example (docs/how-to/new-algorithm.md) runs as written, on both
the loop and the evaluation paths, with its server action carried out by the engine."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "new-algorithm.md"


def _example() -> dict:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    (code,) = [b for b in blocks if "class PrunedIFCAStrategy" in b]
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own example
    return namespace


def test_the_readme_algorithm_trains_and_its_action_runs():
    example = _example()
    dm = DigitsFederated(num_clients=6, concepts=1, seed=0)
    strategy = example["PrunedIFCAStrategy"](num_clusters=4, local_steps=2)
    trainer = make_trainer(strategy, max_epochs=3)
    trainer.fit(MLPClassifier(), datamodule=dm)
    state = trainer.lightning_module.client_state
    # Six clients of one concept cannot fill four clusters: the rule pruned the empty ones.
    assert int(state.active.sum()) < 4
    assert torch.all(state.omega[:, ~state.active] == 0)
    metrics = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]
    assert metrics["test/local_acc"] > 0.3
