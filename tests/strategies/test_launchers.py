"""Two real gloo processes on CPU (Lightning's subprocess launcher) against one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent.parent / "helpers" / "scripts" / "train_digits.py"
ROOT = Path(__file__).parent.parent.parent
DISTRIBUTED_VARIABLES = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
}


STRATEGIES = [
    "fedrc_options", "fedrc_persist", "fedrc_persist_file", "fedrc_plateau", "fedrc_bf16",
    "fedrc_server_adam", "fedrc_reseed", "fedrc_merge", "fedrc_grouping", "fedrc_retire", "fedem", "dfedem",
    "fedrc_discovery",
    "ifca",
    "fesem", "wecfl", "fedsoft", "cfl", "fedavg", "fedprox",
]  # fmt: skip
EXECUTORS = ["loop", "vectorized"]
RUNS = [f"{name}:{executor}" for name in ("fedrc", "fedrc_reuse") for executor in EXECUTORS] + STRATEGIES


def _start(devices: int, out: Path, runs: list[str], log: Path) -> subprocess.Popen:
    # Same thread count per process in both runs: GEMM results depend on it.
    # Drop the rendezvous variables that in-process trainers of this test session exported.
    inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    env = {**inherited, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(SCRIPT), "--devices", str(devices), "--rounds", "3", "--out", str(out)]
    with log.open("w") as sink:  # a file, not a pipe: the two processes run at once
        return subprocess.Popen(
            [*command, "--runs", *runs], cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a kill reaches the started rank too
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Every run trained once on one process and once on two, both at once (one process start
    each: the interpreter and Lightning start-up dominate a 3-round run; one torch thread per
    process, so the one-process run takes the core the two processes leave while they wait on
    each other)."""
    root = tmp_path_factory.mktemp("distributed")
    logs = [root / "one.log", root / "two.log"]
    started = [_start(1, root / "one", RUNS, logs[0]), _start(2, root / "two", RUNS, logs[1])]
    try:
        for process, log in zip(started, logs, strict=True):
            assert process.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:  # one failed or timed out: the other (with its started rank) does not outlive the session
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return root / "one", root / "two"


def _clients(path: Path) -> set[tuple[int, int]]:
    return {tuple(pair) for pair in json.loads(path.read_text())}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_two_processes_give_the_same_weights_as_one_and_split_the_clients(runs, executor):
    one, two = (path / f"fedrc@{executor}" for path in runs)
    assert (two / "executor.txt").read_text() == executor
    first, second = torch.load(one / "result.pt"), torch.load(two / "result.pt")
    for key, value in first["weights"].items():
        assert torch.equal(value, second["weights"][key]), key
    for key, value in first["client_state"].items():
        assert torch.equal(value, second["client_state"][key]), key
    rank0, rank1 = _clients(two / "clients_rank0.json"), _clients(two / "clients_rank1.json")
    assert rank0 and rank1 and not rank0 & rank1  # both processes worked, never on the same client
    assert rank0 | rank1 == _clients(one / "clients_rank0.json")
    assert len(rank0 | rank1) == 3 * 10  # 3 rounds x 10 clients


def _prediction_rows(predictions: dict[str, torch.Tensor]) -> dict[tuple[int, int, int], int]:
    """(client, global client, row) of every predicted row -> its position."""
    keys = zip(*(predictions[k].tolist() for k in ("client", "global_client", "row")), strict=True)
    positions = {tuple(key): i for i, key in enumerate(keys)}
    assert len(positions) == predictions["row"].shape[0], "a row was predicted twice"
    return positions


@pytest.mark.parametrize("executor", EXECUTORS)
def test_two_processes_share_trainer_predict_and_together_equal_one(runs, executor):
    """trainer.predict on 2 processes: each predicts its share of the rows, never the same row,
    and together they give exactly the 1-process predictions (ω, probabilities, classes)."""
    one, two = (path / f"fedrc@{executor}" for path in runs)
    alone = torch.load(one / "predictions_rank0.pt")
    shares = [torch.load(two / f"predictions_rank{r}.pt") for r in (0, 1)]
    assert all(share["row"].numel() for share in shares), "both processes predict"
    joined = {key: torch.cat([share[key] for share in shares]) for key in alone}
    where, reference = _prediction_rows(joined), _prediction_rows(alone)
    assert set(where) == set(reference)
    order = torch.tensor([where[key] for key in reference])
    for key, value in alone.items():
        torch.testing.assert_close(joined[key][order], value, rtol=1e-6, atol=1e-7, msg=key)
    assert torch.equal(joined["preds"][order], alone["preds"])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_gives_the_same_result_on_two_processes(runs, strategy):
    """Weights, client state (personal models, per-sample γ, split clusters) and test metrics agree."""
    one, two = (path / strategy for path in runs)
    first, second = torch.load(one / "result.pt"), torch.load(two / "result.pt")
    for key, value in first["weights"].items():
        assert torch.equal(value, second["weights"][key]), key
    assert set(first["client_state"]) == set(second["client_state"])
    for key, value in first["client_state"].items():
        assert torch.equal(value, second["client_state"][key]), key
    assert first["metrics"] == pytest.approx(second["metrics"], abs=1e-6)
    assert set(first["server_optimizer"]) == set(second["server_optimizer"])
    assert bool(first["server_optimizer"]) == (strategy == "fedrc_server_adam")
    for key, value in first["server_optimizer"].items():
        assert torch.equal(value, second["server_optimizer"][key]), key
    rank0, rank1 = _clients(two / "clients_rank0.json"), _clients(two / "clients_rank1.json")
    assert rank0 and rank1 and not rank0 & rank1


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_e_step_forward_reused_is_exact_on_two_processes_and_near_the_plain_run(runs, executor):
    """``reuse_estep_forward=True``: the same weights and client store on 1 and 2 processes, and the
    plain run's weights up to float rounding (``tests/engine/test_estep_reuse.py``)."""
    one, two = (torch.load(path / f"fedrc_reuse@{executor}" / "result.pt") for path in runs)
    assert (runs[1] / f"fedrc_reuse@{executor}" / "executor.txt").read_text() == executor
    for key, value in one["weights"].items():
        assert torch.equal(value, two["weights"][key]), key
    for key, value in one["client_state"].items():
        assert torch.equal(value, two["client_state"][key]), key
    plain = torch.load(runs[0] / f"fedrc@{executor}" / "result.pt")["weights"]
    for key, value in plain.items():
        torch.testing.assert_close(one["weights"][key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_retirement_retired_the_same_clusters_on_both_process_counts(runs):
    """``fedrc_retire`` (K = 6 on three concepts, retirement from round index 1) retired clusters;
    the decision is taken from the all-reduced client store, identical on every process."""
    one, two = (torch.load(path / "fedrc_retire" / "result.pt")["client_state"]["active"] for path in runs)
    assert 1 <= int(one.sum()) < 6 and torch.equal(one, two)


def test_the_hold_released_the_same_clients_on_both_process_counts(runs):
    """``fedrc_grouping`` released clients from the grouping's hold (``group_release``); streaks and
    releases are decided from the all-reduced client store, identical on every process."""
    one, two = (torch.load(path / "fedrc_grouping" / "result.pt")["client_state"] for path in runs)
    for key in ("extra.group_held", "extra.group_release_streak"):
        assert torch.equal(one[key], two[key]), key
    assert bool((one["extra.group_held"] == 3.0).any())  # grouping.RELEASED


def test_the_docs_merge_rule_merged_on_both_process_counts(runs):
    """``fedrc_merge`` (the docs' one-file rule) merged a pair after each of its first two rounds;
    the merges are decided from the all-reduced models, identical on every process."""
    for path in runs:
        state = torch.load(path / "fedrc_merge" / "result.pt")["client_state"]
        assert state["active"].tolist().count(True) == 1
        torch.testing.assert_close(state["omega"].sum(1), torch.ones(12, dtype=torch.float64))


def test_the_file_store_trains_exactly_as_the_memory_store_on_both_process_counts(runs):
    """optimizer_state_dir moves the persistent store into a file; nothing else may change."""
    for path in runs:
        memory, in_file = (
            torch.load(path / name / "result.pt") for name in ("fedrc_persist", "fedrc_persist_file")
        )
        assert "optimizer.vectors" in in_file["client_state"]
        for part in ("weights", "client_state"):
            assert set(memory[part]) == set(in_file[part])
            for key, value in memory[part].items():
                assert torch.equal(value, in_file[part][key]), (path.name, key)


def test_bf16_mixed_runs_on_the_loop_and_moves_the_float32_weights_by_rounding_only(runs):
    """``fedrc_bf16`` is ``fedrc@loop`` under Trainer(precision="bf16-mixed"): "auto" picks the
    loop, and its weights differ from float32's (autocast ran) by bfloat16 rounding only."""
    for path in runs:
        assert (path / "fedrc_bf16" / "executor.txt").read_text() == "loop"
        plain, mixed = (
            torch.load(path / name / "result.pt")["weights"] for name in ("fedrc@loop", "fedrc_bf16")
        )
        gaps = [float((plain[key] - mixed[key]).abs().max()) for key in plain]
        assert 0 < max(gaps) < 0.05, gaps


EXIT_PROBE = """
import atexit
import os
import sys
import lightning.pytorch as pl
import torch.distributed as dist
import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier



def say(line):
    # One os.write per line: both ranks share the stdout pipe, and print's pieces can interleave.
    sys.stdout.flush()
    os.write(1, (line + "\\n").encode())


# Registered first, so it runs after the strategy's own exit handler (atexit is last-in, first-out).
atexit.register(lambda: say(f"group alive at exit: {dist.is_initialized()}"))
trainer = pl.Trainer(strategy=lf.FedAvgStrategy(local_steps=1), accelerator="cpu", devices=int(sys.argv[1]),
                     max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(MLPClassifier(), datamodule=DigitsFederated(num_clients=4, seed=0))
say(f"group alive after fit: {dist.is_initialized()}")
"""


def _probe(tmp_path: Path, devices: int) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    env = {**inherited, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    script = tmp_path / "probe.py"  # a file: Lightning's launcher re-runs it for rank 1
    script.write_text(EXIT_PROBE)
    done = subprocess.run(
        [sys.executable, str(script), str(devices)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_gloo_group_is_destroyed_before_the_interpreter_exits(tmp_path):
    """A gloo group left to interpreter finalisation can abort a finished run (SIGABRT)."""
    done = _probe(tmp_path, 2)
    assert done.stdout.count("group alive after fit: True") == 2
    assert done.stdout.count("group alive at exit: False") == 2


def test_one_process_creates_no_process_group_and_prints_no_ddp_banner(tmp_path):
    done = _probe(tmp_path, 1)
    assert "group alive after fit: False" in done.stdout
    assert "Starting with 1 processes" not in done.stdout + done.stderr
    assert "Initializing distributed" not in done.stdout + done.stderr


SEQUENCE_PROBE = """
import os
import sys
import lightning.pytorch as pl
import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier

NAMES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


def fit(devices):
    trainer = pl.Trainer(strategy=lf.FedAvgStrategy(local_steps=1), accelerator="cpu", devices=devices,
                         max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(MLPClassifier(), datamodule=DigitsFederated(num_clients=4, seed=0))
    return trainer


before = {name: os.environ.get(name) for name in NAMES}
fit(1)
after = {name: os.environ.get(name) for name in NAMES}
if before["LOCAL_RANK"] is None:  # the first process (the others inherit its launch's variables)
    os.write(1, f"environment kept: {before == after}\\n".encode())
trainer = fit(2)
os.write(1, f"rank {trainer.global_rank} of {trainer.world_size} finished\\n".encode())
"""


def test_a_fit_leaves_the_environment_as_found_so_a_later_two_process_fit_starts(tmp_path):
    """Lightning's launcher exports MASTER_PORT, LOCAL_RANK, ... and leaves them: a later devices=2
    fit then took itself for an externally launched rank and waited forever for rank 1."""
    inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    script = tmp_path / "sequence.py"
    script.write_text(SEQUENCE_PROBE)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**inherited, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,  # a regression hangs: fail instead
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "environment kept: True" in done.stdout
    assert "rank 0 of 2 finished" in done.stdout and "rank 1 of 2 finished" in done.stdout


THREADS_PROBE = """
import os
import torch
import lightning.pytorch as pl
import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier

torch.set_num_threads(1)
trainer = pl.Trainer(strategy=lf.FedAvgStrategy(local_steps=1), accelerator="cpu", devices=1, max_epochs=1,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(MLPClassifier(), datamodule=DigitsFederated(num_clients=4, seed=0))
variable = os.environ.get("OMP_NUM_THREADS")
os.write(1, f"threads {torch.get_num_threads()} OMP_NUM_THREADS {variable}\\n".encode())
"""


def test_a_one_process_fit_keeps_the_users_thread_count_and_environment(tmp_path):
    """Lightning's launcher set torch's threads to the cores (2 here, from the user's 1) and
    exported OMP_NUM_THREADS=2 for the rest of the process; plain single-device Lightning does
    neither."""
    script = tmp_path / "threads.py"
    script.write_text(THREADS_PROBE)
    inherited = {k: v for k, v in os.environ.items() if k not in {*DISTRIBUTED_VARIABLES, "OMP_NUM_THREADS"}}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**inherited, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "threads 1 OMP_NUM_THREADS None" in done.stdout


def test_variables_left_by_another_processs_launch_are_removed_with_a_warning(monkeypatch):
    """A process started (by other means than the launcher) from the first process of a running
    multi-process fit inherits its variables: they are stale here and removed, with a warning."""
    from lightning_fedcluster.strategies.launchers import MARKER, remove_stale_variables

    stale = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41883", "NODE_RANK": "0", "LOCAL_RANK": "0"}
    for name, value in {**stale, MARKER: "4194305:41883"}.items():  # above any pid: another process
        monkeypatch.setenv(name, value)
    with pytest.warns(UserWarning, match="left by the multi-process run of process 4194305 .* removed"):
        remove_stale_variables()
    assert not {*stale, MARKER} & set(os.environ)


@pytest.mark.parametrize("launch", ["own", "parent", "other-port"])
def test_variables_of_this_launch_or_of_another_launcher_are_kept(monkeypatch, launch):
    """This process's own launch, its parent's (a started rank), or a port another launcher set
    since (torchrun): the variables are live and stay."""
    from lightning_fedcluster.strategies.launchers import MARKER, remove_stale_variables

    # Read here, not at collection: parallel test workers are other processes.
    marker = {
        "own": f"{os.getpid()}:41883", "parent": f"{os.getppid()}:41883", "other-port": "4194305:29500"
    }[launch]

    monkeypatch.setenv("MASTER_PORT", "41883")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv(MARKER, marker)
    remove_stale_variables()
    assert os.environ["LOCAL_RANK"] == "1" and os.environ["MASTER_PORT"] == "41883"


STEP_PROBE = """
import os
import sys
import warnings
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.models import MLPClassifier

warnings.filterwarnings("ignore")
RUNS = {  # 5 of 6 clients and local_epochs over unequal clients: the processes' shares are unequal
    "loop": dict(executor="loop", local_steps=2, clients_per_round=5),
    "loop_epochs": dict(executor="loop", local_epochs=1),
    "vectorized_epochs": dict(executor="vectorized", local_epochs=1, clients_per_chunk=2),
}
devices, out = int(sys.argv[1]), sys.argv[2]
for name, options in RUNS.items():
    saver = ModelCheckpoint(dirpath=f"{out}/{name}", save_top_k=-1)
    trainer = pl.Trainer(strategy=lf.FedRCStrategy(2, **options), accelerator="cpu", devices=devices,
                         max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[saver])
    dm = DigitsFederated(num_clients=6, concepts=2, dirichlet_alpha=1.0, seed=0, batch_size=64)
    trainer.fit(MLPClassifier(), datamodule=dm)
    files = sorted(os.listdir(f"{out}/{name}"))
    os.write(1, f"{name} rank {trainer.global_rank}: {trainer.global_step} {files}\\n".encode())
"""


def test_global_step_and_checkpoint_names_are_the_same_on_one_and_two_processes(tmp_path):
    """global_step counts rounds, one step per round on every process: a process's share of a
    round (fewer clients, clients with more local steps, unequal local epochs) never changes it
    (2 processes once named a round's checkpoint step=750 where 1 process wrote step=1500)."""
    inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    script = tmp_path / "steps.py"
    script.write_text(STEP_PROBE)
    lines = {}
    for devices in (1, 2):
        done = subprocess.run(
            [sys.executable, str(script), str(devices), str(tmp_path / str(devices))],
            cwd=tmp_path,
            env={**inherited, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lines[devices] = sorted(line for line in done.stdout.splitlines() if " rank " in line)
    one = {line.split(" rank ")[0]: line.split(": ", 1)[1] for line in lines[1]}
    assert len(lines[2]) == 2 * len(one) == 6
    for line in lines[2]:  # both ranks: the same step count and checkpoint names as one process
        name, result = line.split(" rank ")[0], line.split(": ", 1)[1]
        assert result == one[name], (name, result, one[name])
    for name in ("loop", "loop_epochs", "vectorized_epochs"):  # one step per round, named by it
        assert one[name] == "2 " + str(["epoch=0-step=1.ckpt", "epoch=1-step=2.ckpt"]), one[name]
