"""Can an input-intensity probe place the clients whose images are inverted (a1's miss)?

On digits-28 under the authors' label skew (cell ``a1`` of ``takeoff_runs.py``) the robust grouping
misplaces the two clients with ``inverse`` corruption (client 17: blend 0.8, client 18: blend
0.4 of the inverted image), and FedRC's E-step keeps them there. A feature shift that is an affine
map of pixel intensities (inversion, contrast) can be undone at the input, a concept shift (a
label permutation) cannot. The probe: for every client and cluster, freeze the cluster's model and
fit ``x -> a * x + b`` (two scalars, Adam, from each of ``--starts`` for a) on the client's
training rows; the cluster with the lowest cross-entropy after the fit is where the probe would
place the client.

The script trains a ``takeoff_runs.py`` configuration for ``--rounds`` rounds (the robust one's
late pass acts after round 20), then prints, per client: its concept and style, its ω, the
cross-entropy per cluster at the identity (what the E-step's likelihood sees) and after the fit,
and whether each argmin is the client's concept's cluster (the cluster that holds most of the
concept's clean clients). Offline study: nothing here is in the library.

    python benchmarks/input_probe_study.py --data /work/takeoff/a1 --seed 0 --rounds 20
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import authors_comparison as ac  # noqa: E402
from _common import set_threads  # noqa: E402
from takeoff_configs import CONFIGS  # noqa: E402


def probe_loss(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, start: float = 1.0
) -> float:
    """Cross-entropy of the frozen ``model`` on (a·x + b, y) after ``steps`` Adam steps on a, b
    from a = ``start``, b = 0."""
    a = torch.full((), float(start), requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.Adam([a, b], lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(a * x + b), y).backward()
        optimizer.step()
    with torch.no_grad():
        return float(F.cross_entropy(model(a * x + b), y))


def concept_clusters(omega: torch.Tensor, concepts: list[int], clean: list[bool]) -> dict[int, int]:
    """Each concept's cluster: the argmax-ω cluster of most of its clean clients."""
    owner = omega.argmax(1)
    found = {}
    for concept in sorted(set(concepts)):
        members = [int(owner[i]) for i, c in enumerate(concepts) if c == concept and clean[i]]
        found[concept] = max(set(members), key=members.count)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a directory written by authors_comparison.py write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=20)
    fedrc = [name for name, (kind, _, _) in CONFIGS.items() if kind == "fedrc"]
    parser.add_argument("--config", default="robust", choices=fedrc, help="a takeoff_runs.py configuration")
    parser.add_argument("--steps", type=int, default=30, help="Adam steps of the probe (lr 0.1)")
    parser.add_argument(
        "--starts",
        type=float,
        nargs="+",
        default=[1.0],
        help="initial scales a of the probe; the lowest cross-entropy over them counts (e.g. 1 -1)",
    )
    args = parser.parse_args()
    ac.quiet()
    set_threads(1)  # with OMP_NUM_THREADS, or the launcher resets it to the cores
    dm, _, manifest = ac.read(Path(args.data))
    _, k, options = CONFIGS[args.config]
    torch.manual_seed(args.seed)
    model, _ = ac.authors_model()
    strategy, _ = ac.make_strategy("persist", args.seed, dict(options), k)
    trainer = ac.make_trainer(strategy, args.rounds, validate=False, callbacks=[])
    trainer.fit(model, datamodule=dm)
    module = trainer.lightning_module
    models = [module.cluster_module(c).eval().requires_grad_(False) for c in range(k)]
    omega = module.client_state.omega
    clients = manifest["clients"]
    concepts = [c["concept"] for c in clients]
    styles = [c["feature_style"] for c in clients]
    home = concept_clusters(omega, concepts, [s == "clean" for s in styles])
    print(f"{args.data}, seed {args.seed}, {args.config} after {args.rounds} rounds; concept: cluster {home}")
    names = f"{'omega':<20} {'CE identity':<22} {'CE probed':<22} right (identity/probed)"
    print(f"{'client':>6} {'concept':>7} {'style':<17} {names}")
    for i in range(dm.num_clients):
        x, y = dm.train_split(i)
        with torch.no_grad():
            identity = [float(F.cross_entropy(m(x), y)) for m in models]
        probed = [min(probe_loss(m, x, y, args.steps, a) for a in args.starts) for m in models]
        right = home[concepts[i]]
        marks = "/".join(str(int(min(range(k), key=ce.__getitem__) == right)) for ce in (identity, probed))
        print(
            f"{i:>6} {concepts[i]:>7} {styles[i]:<17} {str([round(float(w), 2) for w in omega[i]]):<20} "
            f"{str([round(v, 2) for v in identity]):<22} {str([round(v, 2) for v in probed]):<22} {marks}"
        )


if __name__ == "__main__":
    main()
