"""The plain Flower app of ``flower_app_side_by_side.py``, written as a Flower user writes one with
flwr 1.42's Message API: a ``ClientApp`` whose ``train`` runs an ordinary PyTorch loop (DataLoader,
``torch.optim.SGD``, cross-entropy) on its partition, and a ``ServerApp`` running Flower's own
``flwr.serverapp.strategy.FedAvg``. It imports only torch and flwr (not this library), so Ray's
workers load what a Flower user's would.

The run's settings travel the Flower way, in the ``ConfigRecord`` the strategy sends each round
(``data``: a ``torch.save`` file of the clients' (x, y) pairs; ``model``, ``lr``, ``momentum``,
``batch-size``, ``local-epochs``, ``seed``, ``threads``). The models are the library's reference
models written as plain modules: the same layers in the same order, the same parameter names and
memory format, so that the same seed gives the same initial weights and the same kernels run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class CNN(nn.Module):
    """The FedRC/FedEM papers' FashionMNIST network (``lightning_fedcluster.models.FashionCNN``):
    conv(32, 5x5) -> pool -> conv(64, 5x5) -> pool -> fc 2048 -> logits, weights channels-last."""

    def __init__(self, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * side * side, 2048), nn.ReLU(), nn.Linear(2048, num_classes)
        )
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class Linear(nn.Module):
    """A linear classifier (``lightning_fedcluster.models.MLPClassifier(hidden=())``)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


def build_model(name: str) -> nn.Module:
    """``"cnn"``: the CNN on [1, 28, 28] images, 10 classes; ``"linear-150-2"``: 150 features, 2 classes."""
    if name == "cnn":
        return CNN()
    kind, features, classes = name.split("-")
    if kind != "linear":
        raise ValueError(f"unknown model {name!r}: 'cnn' or 'linear-<features>-<classes>'")
    return Linear(int(features), int(classes))


_DATA: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}


def load_partition(path: str, partition_id: int) -> TensorDataset:
    """One client's rows; the file is read once per worker process (as a Flower user caches a
    ``FederatedDataset``)."""
    if path not in _DATA:
        _DATA[path] = torch.load(path)
    x, y = _DATA[path][partition_id]
    return TensorDataset(x, y)


client_app = ClientApp()


def local_train(
    weights: dict[str, torch.Tensor], data: TensorDataset, config: Any, partition_id: int
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The ClientApp's local training: ``local-epochs`` passes of shuffled minibatches with a fresh
    SGD, on a model built for this client from ``weights``. Returns the trained weights and the
    mean training loss of the steps."""
    model = build_model(str(config["model"]))
    model.load_state_dict(weights)
    seed = int(config["seed"]) * 1_000_003 + int(config["server-round"]) * 1_009 + partition_id
    shuffle = torch.Generator().manual_seed(seed)
    loader = DataLoader(data, batch_size=int(config["batch-size"]), shuffle=True, generator=shuffle)
    lr, momentum = float(config["lr"]), float(config["momentum"])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    total, count = 0.0, 0
    for _ in range(int(config["local-epochs"])):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total, count = total + float(loss) * len(y), count + len(y)
    return model.state_dict(), {"train-loss": total / max(count, 1)}


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training (``local_train``) on this node's partition, with the round's weights."""
    config = msg.content["config"]
    torch.set_num_threads(int(config["threads"]))
    partition_id = int(context.node_config["partition-id"])
    data = load_partition(str(config["data"]), partition_id)
    weights = msg.content["arrays"].to_torch_state_dict()
    state, metrics = local_train(weights, data, config, partition_id)
    record = MetricRecord({**metrics, "num-examples": len(data)})
    content = RecordDict({"arrays": ArrayRecord(state), "metrics": record})
    return Message(content=content, reply_to=msg)


def server_app(
    initial: dict[str, torch.Tensor],
    rounds: int,
    config: dict[str, Any],
    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None],
    result: dict[str, Any],
) -> ServerApp:
    """A ServerApp running Flower's FedAvg over every node for ``rounds`` rounds (no client-side
    evaluation); ``evaluate_fn`` is Flower's server-side evaluation hook, called before the first
    round and after each; the final weights go into ``result["arrays"]``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
        outcome = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(initial),
            num_rounds=rounds,
            train_config=ConfigRecord(config),
            evaluate_fn=evaluate_fn,
        )
        result["arrays"] = outcome.arrays

    return app
