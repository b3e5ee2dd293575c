"""The authors' side of ``authors_trace.py`` (run in a child process): their unmodified
``run_experiment`` on the trace's clients, initial weights and minibatches, recorded round by round.
What is replaced at run time, and why, is listed in ``authors_trace.py``'s docstring.

With ``args.native`` (``authors_takeoff.py``) their own randomness is kept instead: their seeded
initial weights, their shuffled training loader (``shuffle=True, drop_last=True``, as their loader
builds it), no per-round evaluation (``log_freq`` beyond the last round); each round records ω and
log C only, and the cluster weights at the rounds in ``args.keep_weights``.
``args.shared_batches`` keeps that, but gives all K learners of a client the same minibatches in a
round (one seeded permutation per client and round, as the library draws them), instead of each
learner its own shuffle."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from authors_trace import BATCH, LR, METHODS, K, flat, trace_order


class StopTrace(Exception):
    pass


def authors_side(args: argparse.Namespace) -> None:
    """Their run_experiment on the trace's clients; see the module docstring for what is replaced."""
    torch.set_num_threads(1)
    data, out = Path(args.data).resolve(), Path(args.out).resolve()
    manifest = json.loads((data / "manifest.json").read_text())
    native = bool(getattr(args, "native", False))
    # native, but every learner of a client takes the same minibatches in a round (the library's
    # way): isolates the effect of their per-learner shuffles
    shared_batches = bool(getattr(args, "shared_batches", False))
    keep_weights = set(getattr(args, "keep_weights", ()))
    initial: torch.Tensor | None = None if native else torch.load(out / "library.pt")["initial"]
    work = out / "authors-cwd"
    (work / "logs" / "fmnist-c").mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    sys.path.insert(0, str(Path(args.authors).resolve()))
    for name in ("learners.autoencoder", "cvxpy"):
        sys.modules[name] = types.ModuleType(name)
    import pickle

    import run_experiment as rx  # the authors' module
    from torch.utils.data import DataLoader, Sampler

    class Round:
        index = 0

    class TraceBatches(Sampler):
        """Their training loader's batches: the trace's permutation of this round, full batches."""

        def __init__(self, client: int, n: int) -> None:
            self.client, self.n = client, n

        def __len__(self) -> int:
            return self.n // BATCH

        def __iter__(self) -> Iterator[list[int]]:
            order = trace_order(args.seed, Round.index, self.client, self.n).tolist()
            for b in range(len(self)):
                yield order[b * BATCH : (b + 1) * BATCH]

    class NoWriter:
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        def add_scalar(self, *a: Any, **k: Any) -> None:
            pass

    original_ensemble = rx.get_learners_ensemble

    def ensemble_with_library_init(*a: Any, **kw: Any) -> Any:
        ensemble = original_ensemble(*a, **kw)
        assert initial is not None
        for k, learner in enumerate(ensemble.learners):
            params = list(learner.model.parameters())
            if sum(p.numel() for p in params) != initial.shape[1]:
                raise SystemExit("the authors' model and the library's FashionCNN differ in size")
            torch.nn.utils.vector_to_parameters(initial[k].clone(), params)
        return ensemble

    def loaders(images: Any, labels: Any, train: range, test: range, client: int | None) -> tuple:
        make = rx.SubFEMNISTC
        train_set, test_set = make(list(train), images, labels), make(list(test), images, labels)
        val_set = make(list(train), images, labels)
        if client is None:  # a global client: never trained
            train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=False, drop_last=True)
        elif native and not shared_batches:  # their loader's training iterator (utils/utils.py get_loaders)
            train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True, drop_last=True)
        else:
            train_loader = DataLoader(train_set, batch_sampler=TraceBatches(client, len(train)))
        return (
            train_loader,
            DataLoader(val_set, batch_size=BATCH, shuffle=False),
            DataLoader(test_set, batch_size=BATCH, shuffle=False),
        )

    def init_clients(args_: Any, root_path: str, logs_dir: str) -> list[Any]:
        test = "test" in root_path
        entries = manifest["global"] if test else manifest["clients"]
        clients = []
        for i, entry in enumerate(entries):
            record = pickle.loads((data / entry["file"]).read_bytes())
            n_train = entry["adapt"] if test else entry["train"]
            n_all = len(record["labels"])
            rows = (range(n_train), range(n_train, n_all))
            its = loaders(record["images"], record["labels"], *rows, None if test else i)
            ensemble = rx.get_learners_ensemble(
                n_learners=args_.n_learners, client_type=rx.CLIENT_TYPE[args_.method], name=args_.experiment,
                device=args_.device, optimizer_name=args_.optimizer, scheduler_name=args_.lr_scheduler,
                initial_lr=args_.lr, input_dim=None, output_dim=None, n_rounds=args_.n_rounds,
                seed=args_.seed, mu=args_.mu, n_gmm=args_.n_gmm, embedding_dim=None,
                hard_cluster=args_.hard_cluster, binary=args_.binary, phi_model=args_.phi_model,
            )  # fmt: skip
            clients.append(
                rx.get_client(
                    client_type=rx.CLIENT_TYPE[args_.method], learners_ensemble=ensemble, q=args_.q,
                    train_iterator=its[0], val_iterator=its[1], test_iterator=its[2], logger=NoWriter(),
                    local_steps=args_.local_steps, tune_locally=False, data_type=record["type"],
                    feature_type=[0] * n_all, class_number=10,
                )
            )  # fmt: skip
        return clients

    stash: dict[int, torch.Tensor] = {}
    ensemble_class = rx.LearnersEnsemble
    original_gather = ensemble_class.gather_losses

    def gather_losses(self: Any, iterator: Any) -> torch.Tensor:
        losses = original_gather(self, iterator)
        stash[id(self)] = losses.detach().clone()
        return losses

    rounds: list[dict[str, Any]] = []
    aggregator_class = rx.CentralizedAggregator
    original_mix = aggregator_class.mix
    clock = [time.process_time()]

    def weights_of(client: Any) -> torch.Tensor:
        return torch.as_tensor(client.learners_ensemble.learners_weights).float()

    def record_native(aggregator: Any) -> None:
        learners0 = aggregator.clients[0].learners_ensemble.learners
        now = time.process_time()
        entry = {
            "omega": torch.stack([weights_of(c) for c in aggregator.clients]),
            "log_c": torch.log(torch.tensor([list(map(float, lr.labels_weights)) for lr in learners0])).T,
            "cpu_s": now - clock[0],
        }
        if aggregator.c_round in keep_weights:
            entry["weights"] = torch.stack(
                [flat(learner.model.parameters()) for learner in aggregator.global_learners_ensemble.learners]
            )
        rounds.append(entry)
        clock[0] = now

    def record(aggregator: Any) -> None:
        clients = aggregator.clients
        global_learners = aggregator.global_learners_ensemble.learners
        learners0 = clients[0].learners_ensemble.learners
        accuracies = []
        for g in aggregator.test_clients:
            _, acc = g.learners_ensemble.evaluate_iterator(g.test_iterator)
            accuracies.append(float(acc))
        now = time.process_time()
        rounds.append(
            {
                "weights": torch.stack([flat(learner.model.parameters()) for learner in global_learners]),
                "omega": torch.stack([weights_of(c) for c in clients]),
                "log_c": torch.log(torch.tensor([list(map(float, lr.labels_weights)) for lr in learners0])).T,
                "losses": [stash[id(c.learners_ensemble)].T.float().clone() for c in clients],
                "gamma": [c.samples_weights.T.float().clone() for c in clients],
                "their_acc": accuracies,
                "their_test_omega": [weights_of(g) for g in aggregator.test_clients],
                "cpu_s": now - clock[0],
            }
        )  # fmt: skip
        clock[0] = now

    def mix(self: Any, *a: Any, **kw: Any) -> Any:
        if self.c_round > 0:
            (record_native if native else record)(self)
            print(f"authors: round {self.c_round} recorded", flush=True)
            if self.c_round == args.rounds:
                raise StopTrace
        Round.index = self.c_round
        return original_mix(self, *a, **kw)

    if not native:
        rx.get_learners_ensemble = ensemble_with_library_init
    rx.init_clients = init_clients
    rx.get_data_dir = lambda experiment: "data/fmnist-c"
    rx.SummaryWriter = NoWriter
    ensemble_class.gather_losses = gather_losses
    aggregator_class.mix = mix
    namespace = argparse.Namespace(
        experiment="fmnist-c", method=METHODS[args.algorithm], n_learners=K, n_rounds=args.rounds, bz=BATCH,
        lr=LR, lr_scheduler="constant", optimizer="sgd", local_steps=1, device="cpu",
        log_freq=args.rounds + 1 if native else 1,
        seed=args.authors_seed, sampling_rate=1.0, mu=0, n_gmm=1, embedding_dimension=None,
        hard_cluster=False, binary=False, phi_model=False, split=False, decentralized=False, lr_lambda=0.0,
        q=1.0, communication_probability=0.1, verbose=0, suffix="trace", domain_disc=False, em_step=1,
        gamma=0.05, validation=False, locally_tune_clients=False, input_dimension=None,
        output_dimension=None, logs_dir=str(work / "logs" / "trace"),
    )  # fmt: skip
    rx.args = namespace  # run_experiment reads the module-level `args` once (args.phi_model)
    with open(work / "stdout.txt", "w") as log, contextlib.redirect_stdout(log):
        try:
            rx.run_experiment(namespace)
        except StopTrace:
            pass
    target = out / (f"authors-seed{args.authors_seed}.pt" if native else "authors.pt")
    torch.save({"rounds": rounds, "seed": args.authors_seed}, target)
    print(f"authors: {len(rounds)} rounds recorded in {target}", flush=True)
