"""Two SuperNodes (``fedcluster flower supernode``) each load their partition of a Hugging Face
parquet file with a Flower Datasets partitioner, the node config's partition-id choosing it, and
the deployed run ends with the weights and client store of the same run on an in-process Flower
``Grid`` (``local_grid.py``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("flwr_datasets")

from lightning_fedcluster.flower import FlowerApps  # noqa: E402
from tests.flower import hf_workload  # noqa: E402
from tests.flower.local_grid import partitions, run_local  # noqa: E402
from tests.flower.test_apps import Deployment, command, free_port  # noqa: E402

APP = '''"""A Hugging Face federation: each node loads its partition with the partitioner."""

from lightning_fedcluster.flower import FlowerApps
from tests.flower import hf_workload

apps = FlowerApps(
    hf_workload.make_strategy, hf_workload.make_module, hf_workload.make_datamodule,
    num_rounds=hf_workload.ROUNDS,
)
server = apps.server_app()
client = apps.client_app()
'''


def test_two_supernodes_load_their_partitions_and_match_the_in_process_run(
    tmp_path, monkeypatch, task_identity
):
    parquet = tmp_path / "digits.parquet"
    hf_workload.write_digits(parquet)
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    for name, value in {hf_workload.PARQUET: str(parquet), **offline}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "deployment").mkdir()
    deployment = Deployment(tmp_path / "deployment")
    deployment.env.update({hf_workload.PARQUET: str(parquet), **offline})
    (deployment.app / "fedcluster_app.py").write_text(APP)
    try:
        deployment.start(
            "superlink", [command("flower-superlink"), "--insecure", "--port", str(deployment.link_port)]
        )
        for partition in range(2):
            deployment.start(
                f"supernode{partition}",
                [
                    command("fedcluster"), "flower", "supernode", "--insecure",
                    "--superlink", f"127.0.0.1:{deployment.link_port}", "--port", str(free_port()),
                    "--node-config", f"partition-id={partition} num-partitions=2",
                ],
            )  # fmt: skip
        deployment.wait_until_ready(nodes=2)
        saved = tmp_path / "run.pt"
        result = deployment.run(f'save-path="{saved}"')
        assert result.returncode == 0 and saved.exists(), (
            result.stdout[-3000:] + result.stderr[-3000:] + deployment.logs()
        )
    finally:
        for name in list(deployment.processes):
            deployment.kill(name)
    run = torch.load(saved)
    assert len(run["metrics"]) == hf_workload.ROUNDS and not run["dropped"]

    apps = FlowerApps(
        hf_workload.make_strategy, hf_workload.make_module, hf_workload.make_datamodule,
        num_rounds=hf_workload.ROUNDS,
    )  # fmt: skip
    simulated, _ = run_local(apps, partitions(2))
    for name, tensor in simulated.state_dict().items():
        torch.testing.assert_close(run["state_dict"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    store = simulated.client_state.state_dict()
    for name in ("omega", "label_sums", "seen"):
        torch.testing.assert_close(run["client_state"][name], store[name], rtol=1e-6, atol=1e-7, msg=name)
