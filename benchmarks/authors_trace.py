"""A differential trace of this library's FedRC / FedEM against the authors' code, round by round.

Both sides train on the same clients (a scenario written by ``authors_comparison.py write``), from
the same K initial models (the library's, loaded into the authors' learners), with the same
minibatches (one seeded permutation per client and round, which both sides consume), and the
authors' FashionMNIST-C recipe: the FashionMNIST CNN, SGD lr 0.06, momentum 0.9 kept per (client,
cluster), weight decay 5e-4, batch 128, one local epoch with the partial batch dropped (their
``--local_steps 1``), every client every round, K = 3.

    library   FedRCStrategy / FedEMStrategy(local_epochs=1, drop_last=True, executor="loop",
              optimizer_state="persist"); the engine's minibatch permutation is replaced by the
              trace's, and each client's E-step (per-sample losses, γ) is recorded.
    authors   (``_authors_side.py``) their ``run_experiment.run_experiment`` unmodified, imported
              from a checkout given by --authors (never part of this repository), with: the two
              modules it imports but does not use for these methods (learners.autoencoder, absent
              from their repository, and cvxpy) replaced by empty modules; ``init_clients``
              building their clients and learners with their own functions from the scenario's
              rows (train rows = their train and E-step rows, local test rows = their test rows;
              global clients: adapt rows / score rows) instead of their loader's fixed 300 clients
              and random 90/10 split; training loaders that yield the trace's minibatches; the
              library's initial weights loaded into every learner; TensorBoard writers off. Their
              round loop, E-step, local training, aggregation and C update run as published.
    compare   the round-by-round table: max |Δ| and relative L2 difference of every cluster
              model's weights, max |Δ| of γ, ω, mean γ per cluster, log C_{y,k}, the E-step losses
              and the local (γ-weighted minibatch) losses, and the global accuracy per concept of
              each side's models under one rule (the library's: ω iterated on the adapt rows,
              accuracy on the score rows), plus the authors' own evaluation (one warm-started
              E-step per round without C) of their side.
    run       library, then authors (in a child process: their modules have top-level names such
              as ``utils`` and ``models``), then compare.

    python benchmarks/authors_comparison.py write --out /tmp/trace8 --clients 8 --train 160 --test 40 --seed 0
    OMP_NUM_THREADS=1 python benchmarks/authors_trace.py run --data /tmp/trace8 --authors /work/authors \\
        --rounds 12 --out /tmp/trace8-out
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

K, BATCH, LR = 3, 128, 0.06
METHODS = {"fedrc": "fedrc", "fedem": "FedEM"}  # this script's name -> the authors' method name


def trace_order(seed: int, round_index: int, client: int, n: int) -> torch.Tensor:
    """The minibatch permutation of ``client`` in round ``round_index`` (0-based), used by both sides."""
    state = np.random.SeedSequence([seed, round_index, client, 19]).generate_state(1, np.uint64)
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(state[0] >> np.uint64(1))))


def flat(tensors: Any) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors])


# ---------------------------------------------------------------------------------------------
# library side


class LibraryRecorder:
    """Lightning callback: the initial cluster weights, and after every round the global weights,
    ω, log C and each client's E-step losses and γ (captured by ``patched_library``)."""

    def __init__(self, perturb: float = 0.0) -> None:
        self.perturb = perturb
        self.initial: torch.Tensor | None = None
        self.rounds: list[dict[str, Any]] = []
        self.e_steps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seconds = time.process_time()

    def weights(self, module: Any) -> torch.Tensor:
        return torch.stack([flat(module.copies.cluster_tensors(k)) for k in range(module.num_clusters)])

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.initial = self.weights(module)
        if self.perturb:  # the float-drift control: θ ← θ (1 + ε z), z ~ N(0, 1), after recording θ
            generator = torch.Generator().manual_seed(19)
            with torch.no_grad():
                for k in range(module.num_clusters):
                    for t in module.copies.cluster_tensors(k):
                        t.mul_(1 + self.perturb * torch.randn(t.shape, generator=generator).to(t))

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        state = module.client_state
        stats = module.rule.log_label_stats(state)
        clients = sorted(self.e_steps)
        now = time.process_time()
        self.rounds.append(
            {
                "weights": self.weights(module),
                "omega": state.omega.clone().float(),
                "log_c": None if stats is None else stats.float().cpu(),
                "losses": [self.e_steps[c][0] for c in clients],
                "gamma": [self.e_steps[c][1] for c in clients],
                "cpu_s": now - self.seconds,
            }
        )
        self.seconds = now
        self.e_steps = {}


@contextlib.contextmanager
def patched_library(seed: int, recorder: LibraryRecorder) -> Iterator[None]:
    """The engine's minibatch permutation replaced by ``trace_order``; each client's E-step recorded."""
    import lightning_fedcluster.engine.client as engine_client
    import lightning_fedcluster.engine.executors.loop as loop

    for module, name in ((engine_client, "minibatch_order"), (loop, "minibatch_order"), (loop, "prepare")):
        if not hasattr(module, name):
            raise SystemExit(f"{module.__name__}.{name} is gone: adapt the trace's hooks to the engine")
    original_order, original_prepare = engine_client.minibatch_order, loop.prepare

    def order(_seed: int, round_index: int, client: int, n: int, epoch: int = 0) -> torch.Tensor:
        if epoch:
            raise SystemExit("the trace drives one local epoch only (--train rows < 2 x batch)")
        return trace_order(seed, round_index, client, n)

    def prepare(rule: Any, losses: torch.Tensor, labels: torch.Tensor, *rest: Any, **kw: Any) -> Any:
        works = original_prepare(rule, losses, labels, *rest, **kw)
        for work in works:
            rows = slice(work.start, work.stop)
            recorder.e_steps[work.client] = (losses[rows].float().cpu(), work.report.gamma.float().cpu())
        return works

    engine_client.minibatch_order = loop.minibatch_order = order
    loop.prepare = prepare
    try:
        yield
    finally:
        engine_client.minibatch_order = loop.minibatch_order = original_order
        loop.prepare = original_prepare


def library_side(args: argparse.Namespace) -> None:
    import lightning.pytorch as pl
    from _common import make_trainer, quiet
    from authors_comparison import authors_model, read

    from lightning_fedcluster import FedEMStrategy, FedRCStrategy

    quiet()
    torch.set_num_threads(1)
    dm, _, manifest = read(Path(args.data))
    sizes = dm.train_sizes
    if int(sizes.max()) >= 2 * BATCH or int(sizes.min()) < BATCH:
        raise SystemExit(f"the trace needs {BATCH} <= train rows < {2 * BATCH} (one full batch per epoch)")
    torch.manual_seed(args.seed)
    model, _ = authors_model()
    strategy_class = FedRCStrategy if args.algorithm == "fedrc" else FedEMStrategy
    strategy = strategy_class(
        K, local_epochs=1, drop_last=True, executor="loop", optimizer_state="persist",
        clients_per_round=None, seed=args.seed,
    )  # fmt: skip
    recorder = LibraryRecorder(args.perturb)
    callback = type("Recorder", (pl.Callback,), {})()
    callback.on_train_start = recorder.on_train_start  # type: ignore[method-assign]
    callback.on_train_epoch_end = recorder.on_train_epoch_end  # type: ignore[method-assign]
    with patched_library(args.seed, recorder):
        trainer = make_trainer(strategy, args.rounds, validate=False, callbacks=[callback])
        trainer.fit(model, datamodule=dm)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"initial": recorder.initial, "rounds": recorder.rounds, "seed": manifest["seed"]}
    torch.save(record, out / "library.pt")
    print(f"library: {len(recorder.rounds)} rounds recorded in {out / 'library.pt'}", flush=True)


# ---------------------------------------------------------------------------------------------
# comparison


class Scorer:
    """Global accuracy per concept of K weight vectors: ω by the library's rule (the E-step iterated
    on the adapt rows, with C for FedRC) or by the authors' (one E-step per round, warm-started, no C)."""

    def __init__(self, data: Path, algorithm: str) -> None:
        from authors_comparison import read

        from lightning_fedcluster.algorithms.fedrc import FedRC
        from lightning_fedcluster.models import FashionCNN

        _, self.global_clients, _ = read(data)
        self.model = FashionCNN(10).eval()
        self.rule = FedRC(K, use_label_stats=algorithm == "fedrc")

    @torch.no_grad()
    def outputs(self, weights: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per global client: adapt-row losses [N, K] and score-row probabilities [K, N, C]."""
        result = []
        for _, xa, ya, xs, _ in self.global_clients:
            losses, probs = [], []
            for k in range(weights.shape[0]):
                torch.nn.utils.vector_to_parameters(weights[k].clone(), self.model.parameters())
                losses.append(torch.nn.functional.cross_entropy(self.model(xa), ya, reduction="none"))
                probs.append(torch.softmax(self.model(xs), 1))
            result.append((torch.stack(losses, 1), torch.stack(probs)))
        return result

    def accuracy(self, outputs: Any, omegas: list[torch.Tensor]) -> list[float]:
        from lightning_fedcluster.algorithms.mixture import mixture_probabilities

        return [
            float((mixture_probabilities(probs, omega.float()).argmax(1) == g[4]).float().mean())
            for (_, probs), omega, g in zip(outputs, omegas, self.global_clients, strict=True)
        ]

    def library_rule(self, outputs: Any, log_c: torch.Tensor | None) -> list[torch.Tensor]:
        stats = log_c if self.rule.uses_label_stats else None
        return [
            self.rule.unseen_client_mixture(losses, g[2], stats)
            for (losses, _), g in zip(outputs, self.global_clients, strict=True)
        ]

    @staticmethod
    def authors_rule(outputs: Any, previous: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            torch.softmax(omega.double().log() - losses.double(), 1).mean(0)
            for (losses, _), omega in zip(outputs, previous, strict=True)
        ]


def max_abs(a: Any, b: Any) -> float:
    if isinstance(a, list):
        return max(max_abs(x, y) for x, y in zip(a, b, strict=True))
    return float((a.double() - b.double()).abs().max())


def cluster_shares(gamma: list[torch.Tensor], sizes: torch.Tensor) -> torch.Tensor:
    """[K]: mean γ per cluster over all clients' training rows."""
    return torch.stack([g.double().mean(0) for g in gamma]).T @ sizes / sizes.sum()


def local_losses(rec: dict[str, Any], seed: int, round_index: int) -> torch.Tensor:
    """[M, K]: each client's local loss (1/B) Σ_batch γ f of its round's minibatch, at the global weights."""
    rows = []
    for client, (losses, gamma) in enumerate(zip(rec["losses"], rec["gamma"], strict=True)):
        batch = trace_order(seed, round_index, client, losses.shape[0])[:BATCH]
        rows.append((gamma[batch].double() * losses[batch].double()).sum(0) / BATCH)
    return torch.stack(rows)


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = Path(args.out)
    lib = torch.load(out / "library.pt")
    aut = torch.load(args.against or out / "authors.pt")
    scorer = Scorer(Path(args.data), args.algorithm)
    sizes = torch.tensor([g.shape[0] for g in lib["rounds"][0]["gamma"]], dtype=torch.float64)
    first = scorer.outputs(lib["initial"])
    uniform = [torch.full((K,), 1.0 / K, dtype=torch.float64)] * len(first)
    their_omega_lib = Scorer.authors_rule(first, uniform)  # their evaluation at aggregator start
    their_omega_aut = their_omega_lib
    rows = []
    for t, (L, A) in enumerate(zip(lib["rounds"], aut["rounds"], strict=False)):
        diff = L["weights"].double() - A["weights"].double()
        rel = max(float(diff[k].norm() / A["weights"][k].double().norm()) for k in range(diff.shape[0]))
        mean_gamma = [cluster_shares(r["gamma"], sizes) for r in (L, A)]
        lib_out, aut_out = scorer.outputs(L["weights"]), scorer.outputs(A["weights"])
        their_omega_lib = Scorer.authors_rule(lib_out, their_omega_lib)
        their_omega_aut = Scorer.authors_rule(aut_out, their_omega_aut)
        row = {
            "round": t + 1,
            "w_abs": float(diff.abs().max()),
            "w_rel": rel,
            "gamma": max_abs(L["gamma"], A["gamma"]),
            "omega": max_abs(L["omega"], A["omega"]),
            "mean_gamma": max_abs(mean_gamma[0], mean_gamma[1]),
            "mean_gamma_lib": mean_gamma[0].tolist(),
            "log_c": max_abs(L["log_c"], A["log_c"]) if L["log_c"] is not None else float("nan"),
            "loss": max_abs(L["losses"], A["losses"]),
            "local": max_abs(local_losses(L, args.seed, t), local_losses(A, args.seed, t)),
            "acc_lib": scorer.accuracy(lib_out, scorer.library_rule(lib_out, L["log_c"])),
            "acc_aut": scorer.accuracy(aut_out, scorer.library_rule(aut_out, A["log_c"])),
            "their_lib": scorer.accuracy(lib_out, their_omega_lib),
            "their_aut": A.get("their_acc", scorer.accuracy(aut_out, their_omega_aut)),
            "cpu_lib": L["cpu_s"],
            "cpu_aut": A["cpu_s"],
        }
        rows.append(row)
    print_table(rows, args)
    cpu = [float(np.median([r[key] for r in rows])) for key in ("cpu_lib", "cpu_aut")]
    print(
        f"CPU seconds per round, median (one torch thread): library {cpu[0]:.1f}, other side {cpu[1]:.1f} "
        "(the authors' round includes their per-round evaluation of every client)"
    )
    (out / "table.json").write_text(json.dumps(rows, indent=1))
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from _common import machine_line, set_clock

    set_clock("cpu")  # both sides' rounds were timed with time.process_time
    print(machine_line())
    print(f"{args.algorithm}: library vs authors, same clients, initial weights, minibatches ({args.data})")
    print(
        "max |Δ| of: w = cluster weights (rel = max_k ‖Δθ_k‖/‖θ_k‖), γ, ω, mean γ per cluster, log C, "
        "E-step losses, local (γ-weighted minibatch) losses; acc = mean over concepts (each in table.json)"
    )
    names = ["round", "w |Δ|", "w rel", "γ", "ω", "mean γ", "log C", "losses", "local"]
    names += ["acc L/A", "their L/A"]
    print("".join(f"{n:>11}" for n in names))
    for r in rows:
        keys = ("w_abs", "w_rel", "gamma", "omega", "mean_gamma", "log_c", "loss", "local")
        cells = [f"{r['round']}"] + [f"{r[key]:.1e}" if r[key] == r[key] else "n/a" for key in keys]
        cells.append(f"{100 * np.mean(r['acc_lib']):.1f}/{100 * np.mean(r['acc_aut']):.1f}")
        cells.append(f"{100 * np.mean(r['their_lib']):.1f}/{100 * np.mean(r['their_aut']):.1f}")
        print("".join(f"{c:>11}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "library", "authors", "compare"))
    parser.add_argument("--data", required=True, help="a scenario written by authors_comparison.py write")
    parser.add_argument("--authors", help="a checkout of LINs-lab/FedRC (outside this repository)")
    parser.add_argument("--out", required=True, help="folder for the traces (library.pt, authors.pt)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--algorithm", choices=tuple(METHODS), default="fedrc")
    parser.add_argument("--seed", type=int, default=0, help="the library's seed and the minibatch orders'")
    parser.add_argument("--authors-seed", type=int, default=1234, help="their --seed (client order only)")
    parser.add_argument("--perturb", type=float, default=0.0, help="library: ε of the float-drift control")
    parser.add_argument("--against", help="compare: another library.pt in place of the authors' trace")
    args = parser.parse_args()
    if args.command in ("run", "authors") and not args.authors:
        parser.error("--authors DIR is needed to run the authors' side")
    if args.command in ("run", "library"):
        library_side(args)
    if args.command == "authors":
        from _authors_side import authors_side

        authors_side(args)
    if args.command == "run":
        command = [sys.executable, __file__, "authors", *sys.argv[2:]]
        subprocess.run(command, check=True)
    if args.command in ("run", "compare"):
        compare(args)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
