"""Diagnostics of a federated scenario: per-client label distribution and client types.

`client_rows` gives one row per client (concept, feature style, sizes, label mix), `format_summary`
a printable table plus a client-type count, and `summary_figure` the same as a matplotlib figure
(matplotlib is imported only there). Ground truth comes from the datamodule's metadata.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import Tensor

from lightning_fedcluster.datamodules.federated import FederatedDataModule

__all__ = ["client_rows", "client_type_counts", "format_summary", "label_counts", "summary_figure"]


def _check(dm: Any) -> FederatedDataModule:
    if not isinstance(dm, FederatedDataModule):
        raise TypeError(f"expected a FederatedDataModule, got {type(dm).__name__}")
    return dm


def _per_client(y: Tensor, offsets: Tensor, num_classes: int) -> Tensor:
    owner = torch.repeat_interleave(torch.arange(offsets.numel() - 1), offsets.diff())
    counts = torch.zeros(offsets.numel() - 1, num_classes, dtype=torch.long)
    counts.index_put_((owner, y), torch.ones_like(y), accumulate=True)
    return counts


def label_counts(dm: FederatedDataModule, split: str = "all") -> Tensor:
    """Label counts per client, LongTensor [M, C] (classification only).

    `split`: "train", "val", "test" or "all" (train + validation + test: every row of the
    client); "global" gives the global clients' [G, C].
    """
    dm = _check(dm)
    if dm.num_classes is None:
        raise ValueError("label_counts needs a classification task; this datamodule is a regression task")
    c = dm.num_classes
    if split == "train":
        return _per_client(dm.train_y, dm.train_offsets, c)
    if split == "val":
        return _per_client(dm.val_y, dm.val_offsets, c)
    if split == "test":
        return _per_client(dm.test_y, dm.test_offsets, c)
    if split == "all":
        return sum(label_counts(dm, part) for part in ("train", "val", "test"))
    if split == "global":
        return _per_client(dm.global_y, dm.global_offsets, c)
    raise ValueError(f"split must be 'train', 'val', 'test', 'all' or 'global', got {split!r}")


def client_rows(dm: FederatedDataModule) -> list[dict[str, Any]]:
    """One dict per participating client: client, concept, feature_style, train_size, val_size,
    test_size, and label_shares (list over classes, all its rows) for classification or
    target_mean / target_std for regression; `mixture` (list) when the metadata has true
    mixtures."""
    dm = _check(dm)
    meta = dm.metadata
    counts = label_counts(dm) if dm.task == "classification" else None
    rows = []
    for i in range(dm.num_clients):
        row: dict[str, Any] = {
            "client": i,
            "concept": int(meta.concept[i]),
            "feature_style": meta.feature_style[i],
            "train_size": int(dm.train_sizes[i]),
            "val_size": int(dm.val_sizes[i]),
            "test_size": int(dm.test_sizes[i]),
        }
        if counts is not None:
            total = max(1, int(counts[i].sum()))
            row["label_shares"] = [round(int(n) / total, 4) for n in counts[i]]
        else:
            y = torch.cat([dm.train_split(i)[1], dm.val_split(i)[1], dm.test_split(i)[1]]).double()
            row["target_mean"] = float(y.mean())
            row["target_std"] = float(y.std()) if y.shape[0] > 1 else 0.0
        if meta.mixture is not None:
            row["mixture"] = [round(float(w), 4) for w in meta.mixture[i]]
        rows.append(row)
    return rows


def client_type_counts(dm: FederatedDataModule) -> dict[tuple[int, str], int]:
    """Number of clients per (concept, feature kind), the kind being "clean" or the corruption
    name without its severity."""
    dm = _check(dm)
    kinds = [s.split(":")[0] for s in dm.metadata.feature_style]
    return dict(sorted(Counter(zip(dm.metadata.concept.tolist(), kinds, strict=True)).items()))


def _label_text(shares: list[float], top: int = 3) -> str:
    order = sorted(range(len(shares)), key=lambda c: -shares[c])[:top]
    return " ".join(f"{c}:{shares[c]:.2f}" for c in order if shares[c] > 0)


def format_summary(dm: FederatedDataModule, max_rows: int | None = 50) -> str:
    """A plain-text table: one line per client (the first `max_rows`), then the client-type
    counts, then the global test clients."""
    dm = _check(dm)
    rows = client_rows(dm)
    regression = dm.task == "regression"
    last = "target mean±std" if regression else "top labels (share)"
    lines = [f"{'client':>6} {'concept':>7} {'feature':<20} {'train':>6} {'val':>5} {'test':>5}  {last}"]
    for row in rows[: max_rows if max_rows is not None else len(rows)]:
        if regression:
            tail = f"{row['target_mean']:.3g}±{row['target_std']:.3g}"
        else:
            tail = _label_text(row["label_shares"])
        if "mixture" in row:
            tail += "  mixture " + "/".join(f"{w:.2f}" for w in row["mixture"])
        lines.append(
            f"{row['client']:>6} {row['concept']:>7} {row['feature_style']:<20} "
            f"{row['train_size']:>6} {row['val_size']:>5} {row['test_size']:>5}  {tail}"
        )
    if max_rows is not None and len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more clients")
    lines += ["", f"{'concept':>7} {'feature':<20} {'clients':>7}"]
    for (concept, kind), count in client_type_counts(dm).items():
        lines.append(f"{concept:>7} {kind:<20} {count:>7}")
    if dm.num_global_clients:
        sizes = dm.global_offsets.diff().tolist()
        lines += [
            "",
            "global test clients: "
            + ", ".join(
                f"#{g} concept {int(dm.metadata.global_concept[g])} ({sizes[g]} samples)"
                for g in range(dm.num_global_clients)
            ),
        ]
    return "\n".join(lines)


def summary_figure(dm: FederatedDataModule) -> Any:
    """A matplotlib Figure (`lightning_fedcluster.figures.data_summary_figure`): per-client label
    shares (or target spread) and split sizes with the clients sorted by concept, and the
    concept × input-style client counts."""
    dm = _check(dm)
    try:
        from lightning_fedcluster.figures import data_summary_figure
    except ImportError as error:
        raise ImportError(
            "summary_figure draws with matplotlib, which is not installed: pip install matplotlib "
            "(format_summary gives the same information as text)"
        ) from error

    shares = targets = None
    if dm.task == "classification":
        counts = label_counts(dm).double()
        shares = counts / counts.sum(dim=1, keepdim=True).clamp_min(1)
    else:
        rows = client_rows(dm)
        targets = torch.tensor([[row["target_mean"], row["target_std"]] for row in rows])
    concepts = int(dm.metadata.concept.max()) + 1 if dm.num_clients else 0
    title = f"Data: {dm.num_clients} clients, {concepts} concepts"
    if dm.num_classes is not None:
        title += f", {dm.num_classes} classes"
    title += f"; {dm.num_global_clients} global test clients"
    return data_summary_figure(
        dm.metadata.concept,
        torch.stack([dm.train_sizes, dm.val_sizes, dm.test_sizes], dim=1),
        client_type_counts(dm),
        label_shares=shares,
        targets=targets,
        title=title,
    )
