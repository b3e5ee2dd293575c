"""benchmarks/discovery_cells.py: a real two-round run writes a line with every field (validation
and test disjoint, the best-validation round within the run), ``--summarise`` prints the cell's
table, the ``policy`` configuration is refused before training where the package has none, and the
one-concept tabular set is the three-concept set's draws labelled by one rule."""

from __future__ import annotations

import json

import pytest
import torch
from _discovery_data import CONCEPTS, concept_set, labelling_rules
from discovery_cells import main, summarise

FIELDS = {
    "cell", "config", "seed", "rounds", "global_last", "ari_last", "global_best", "ari_best", "best_round",
    "val_global_best", "local_last", "models_end", "val_test_shared_rows", "wall_s", "torch_threads",
    "platform", "cpu", "cpu_count", "load_start", "load_end", "torch", "commit",
}  # fmt: skip


def test_two_rounds_write_every_field_and_the_summary_prints_the_table(tmp_path, capsys, threads_restored):
    out = tmp_path / "cells.jsonl"
    arguments = ["--cells", "tabular-mixed", "--configs", "fedrc3", "--seeds", "100", "--rounds", "2"]
    main([*arguments, "--out", str(out)])
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert set(record) == FIELDS
    assert (record["cell"], record["config"], record["seed"], record["rounds"]) == (
        "tabular-mixed",
        "fedrc3",
        100,
        2,
    )
    assert 0.0 <= record["global_last"] <= 1.0 and 0.0 <= record["global_best"] <= 1.0
    assert 1 <= record["best_round"] <= 2 and record["models_end"] == 3
    assert record["val_test_shared_rows"] == 0 and record["torch_threads"] == 1
    assert record["ari_last"] is not None and -1.0 <= record["ari_last"] <= 1.0
    assert record["cpu_count"] >= 1 and len(record["load_end"]) == 3

    main([*arguments, "--out", str(out), "--skip-done"])  # the run is there: nothing appended
    assert len(out.read_text().splitlines()) == 1
    capsys.readouterr()
    main(["--summarise", str(out)])
    table = capsys.readouterr().out
    assert "### tabular-mixed" in table
    assert f"| fedrc3 | 2 | 100 | {record['global_last']:.3f} | {record['global_best']:.3f} |" in table
    assert summarise(out).strip() == table.strip()

    earlier = {**record, "config": "policy-first"}  # a configuration the script no longer runs
    out.write_text(out.read_text() + json.dumps(earlier) + "\n")
    rows = [line for line in summarise(out).splitlines() if line.startswith("| ") and "| 2 |" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| fedrc3", "| policy-first"]


def test_the_policy_runs_from_six_clusters_and_records_its_models(tmp_path, threads_restored):
    out = tmp_path / "cells.jsonl"
    arguments = ["--cells", "tabular-one", "--configs", "policy", "--seeds", "100", "--rounds", "3"]
    main([*arguments, "--out", str(out)])
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["cell"], record["config"], record["rounds"]) == ("tabular-one", "policy", 3)
    assert 1 <= record["models_end"] <= 6
    assert 0.0 <= record["global_last"] <= 1.0


def test_one_concept_is_the_same_draws_labelled_by_the_seeds_rule():
    seed = 101
    three, one = concept_set(seed), concept_set(seed, concepts=1)
    for dm in (three, one):
        dm.setup("fit")
    assert one.metadata.concept.unique().tolist() == [0] and one.num_global_clients == 1
    label = labelling_rules("mixed", torch.Generator().manual_seed(seed))  # the set's first draws
    rule = seed % CONCEPTS
    for i in range(three.num_clients):
        x3, y3 = three.train_split(i)
        x1, y1 = one.train_split(i)
        assert torch.equal(x3, x1)
        assert torch.equal(y1, label(x1, rule))
        assert torch.equal(y3, label(x3, int(three.metadata.concept[i])))
    x, y = one.global_split(0)
    assert torch.equal(x, three.global_split(0)[0]) and torch.equal(y, label(x, rule))
    with pytest.raises(ValueError, match="concepts must be 1 or 3"):
        concept_set(seed, concepts=2)
