"""The FedRC paper's FashionMNIST CNN on this machine: one local step and one no-grad pass in
NCHW and channels-last memory format, in float32 and under bfloat16 autocast.

A FedRC round of the authors' recipe is, per client, one local step of batch 128 on K models
and an E-step pass over the client's rows on the same K models; these two kernels are the
round's compute. The four settings run interleaved (one of each per repetition), so a change of
machine load hits all of them alike; the table gives medians over ``--repeats`` after two
warm-up repetitions, and "round" = ``--clients`` × K × (step + pass), the compute of one round.

    OMP_NUM_THREADS=1 python benchmarks/cnn_step_formats.py --clock cpu
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import CLOCK_HELP, clock, machine_line, set_clock, set_threads
from torch import Tensor, nn

from lightning_fedcluster.models import FashionCNN

SETTINGS = (
    ("NCHW, float32", torch.contiguous_format, False),
    ("channels-last, float32", torch.channels_last, False),
    ("NCHW, bf16 autocast", torch.contiguous_format, True),
    ("channels-last, bf16 autocast", torch.channels_last, True),
)


def timed_pair(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[Tensor, Tensor], rows: Tensor, bf16: bool
) -> tuple[float, float]:
    """Seconds of one local step (forward, backward, SGD step) on ``batch`` and of one no-grad
    pass over ``rows``."""
    x, y = batch
    start = clock()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step = clock() - start
    start = clock()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        model(rows)
    return step, clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128, help="local step batch (the authors' 128)")
    parser.add_argument(
        "--rows", type=int, default=160, help="rows of one E-step pass (a client's train rows)"
    )
    parser.add_argument("--clients", type=int, default=25)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help=CLOCK_HELP)
    args = parser.parse_args()
    set_clock(args.clock)
    set_threads(args.threads)
    torch.manual_seed(0)
    batch = (torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,)))
    rows = torch.randn(args.rows, 1, 28, 28)
    models, optimizers = [], []
    for _, memory_format, _ in SETTINGS:
        model = FashionCNN(lr=0.06, momentum=0.9, weight_decay=5e-4).to(memory_format=memory_format)
        models.append(model)
        optimizers.append(model.configure_optimizers())
    times: list[list[tuple[float, float]]] = [[] for _ in SETTINGS]
    for _ in range(args.repeats + 2):
        for i, (_, _, bf16) in enumerate(SETTINGS):
            times[i].append(timed_pair(models[i], optimizers[i], batch, rows, bf16))
    print(machine_line())
    print(f"FashionCNN, step batch {args.batch}, pass {args.rows} rows, {args.repeats} repeats; round = "
          f"{args.clients} clients x K={args.clusters} x (step + pass)")  # fmt: skip
    print(f"{'setting':<30}{'step ms':>10}{'pass ms':>10}{'round s':>10}{'speed-up':>10}")
    base = None
    for (name, _, _), measured in zip(SETTINGS, times, strict=True):
        step = statistics.median(s for s, _ in measured[2:])
        passed = statistics.median(p for _, p in measured[2:])
        round_s = args.clients * args.clusters * (step + passed)
        base = base or round_s
        print(f"{name:<30}{1e3 * step:>10.1f}{1e3 * passed:>10.1f}{round_s:>10.2f}{base / round_s:>9.2f}x")


if __name__ == "__main__":
    main()
