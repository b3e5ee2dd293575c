"""What the reply checks (engine/reply_checks.py) cost per client, against the client's own turn.

Every client's trained copies are checked before they enter the round's sums: finite tensors and
ω on the simplex always, the update norm ‖θ_local − θ_k‖ with ``max_update_norm``. This times the
check of one client on the W1 model (FashionCNN, K = 3 trained copies) and, for scale, one local
SGD step of one copy on a batch of 128 (a W1 client runs 5 steps on each of its copies).

    OMP_NUM_THREADS=1 python benchmarks/reply_checks.py
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks._common import command_line, machine_line, set_threads
from lightning_fedcluster.engine.reply_checks import ReplyLimits, client_problems
from lightning_fedcluster.models import FashionCNN


def timed(function, repeats: int = 20) -> float:
    function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    set_threads(1)
    torch.manual_seed(0)
    models = [FashionCNN() for _ in range(3)]
    reference = [[p.detach().clone() for p in m.parameters()] for m in models]
    local = [[p.detach() + 1e-3 * torch.randn_like(p) for p in m.parameters()] for m in models]
    updates = [(f"cluster {k}", local[k], reference[k]) for k in range(3)]
    omega = torch.full((3,), 1 / 3, dtype=torch.float64)
    alive = torch.ones(3, dtype=torch.bool)
    finite = timed(lambda: client_problems(0, updates, omega, alive, ReplyLimits()))
    bounded = timed(lambda: client_problems(0, updates, omega, alive, ReplyLimits(max_update_norm=10.0)))
    model, x, y = models[0], torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    sgd = timed(step, repeats=5)
    size = sum(p.numel() for p in models[0].parameters())
    print(machine_line())
    print(command_line())
    print(f"FashionCNN: {size:,} parameters per copy, K = 3 copies checked per client")
    print(f"{'per client':<40}{'ms':>10}")
    print(f"{'check: finite + simplex':<40}{finite * 1e3:>10.2f}")
    print(f"{'check: + update norm (max_update_norm)':<40}{bounded * 1e3:>10.2f}")
    print(f"{'one local SGD step (1 copy, batch 128)':<40}{sgd * 1e3:>10.2f}")
    print(f"{'a W1 client: 5 steps x 3 copies':<40}{15 * sgd * 1e3:>10.2f}")


if __name__ == "__main__":
    main()
