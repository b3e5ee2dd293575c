"""The FedRC paper's FashionMNIST CNN on this machine: one local step and one no-grad pass in
NCHW and channels-last memory format, in float32 and under bfloat16 autocast.

A FedRC round of the authors' recipe is, per client, one local step of batch 128 on K models
and an E-step pass over the client's rows on the same K models; these two kernels are the
round's compute. The four settings run interleaved (one of each per repetition), so a change of
machine load hits all of them alike; the table gives medians over ``--repeats`` after two
warm-up repetitions, and "round" = ``--clients`` × K × (step + pass), the compute of one round.

    OMP_NUM_THREADS=1 python benchmarks/cnn_step_formats.py --clock cpu

``--ceiling`` asks how cheap a float32 round of this recipe can get on this
CPU. It counts the round's floating-point operations (``torch.utils.flop_counter``) and sets the
channels-last float32 kernels of today's round (a) against three ways to compute less or
better, each as the round's compute:

    (a) step: forward + backward of the 128-row batch; pass: no-grad forward of the 160 rows
    (b) the E-step's forward reused for the first step: forward with grad of the 128 batch rows
        (their losses serve the E-step and the step), no-grad forward of the other 32, backward
    (c) the K = 3 models of a client on one shared batch in one torch.func call (vmap over the
        clusters) for the step and the pass
    (d) (b) and (c) together

    OMP_NUM_THREADS=1 python benchmarks/cnn_step_formats.py --clock cpu --ceiling
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


def round_flops(batch: int, rows: int, clients: int, clusters: int) -> tuple[float, float]:
    """Floating-point operations of one round of (a) and of (b): ``clients`` x K x (step + pass)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = FashionCNN()
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as step_counter:
        nn.functional.cross_entropy(model(x), y).backward()
    with FlopCounterMode(display=False) as pass_counter, torch.no_grad():
        model(torch.randn(rows, 1, 28, 28))
    with FlopCounterMode(display=False) as rest_counter, torch.no_grad():
        model(torch.randn(max(rows - batch, 0), 1, 28, 28))
    pairs = clients * clusters
    today = pairs * (step_counter.get_total_flops() + pass_counter.get_total_flops())
    reused = pairs * (step_counter.get_total_flops() + rest_counter.get_total_flops())
    return float(today), float(reused)


def ceiling(args: argparse.Namespace) -> None:
    """The float32 round's compute, and what computing less or better saves."""
    from torch.func import functional_call, grad, stack_module_state, vmap

    torch.manual_seed(0)
    k, lr = args.clusters, 0.06
    x, y = torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,))
    rows = torch.cat([x, torch.randn(args.rows - args.batch, 1, 28, 28)])
    models = [FashionCNN(lr=lr) for _ in range(k)]
    template = FashionCNN().to("meta")
    params, buffers = stack_module_state(models)
    params = {n: p.detach().clone() for n, p in params.items()}

    def loss_of(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return nn.functional.cross_entropy(functional_call(template, (p, buffers), (xb,)), yb)

    def logits_of(p: dict[str, Tensor], xb: Tensor) -> Tensor:
        return functional_call(template, (p, buffers), (xb,))

    step_k = vmap(grad(loss_of), in_dims=(0, None, None))
    pass_k = vmap(logits_of, in_dims=(0, None))

    def today() -> None:  # (a) K x (step on the batch + pass over the rows)
        for model in models:
            model.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(lr * p.grad)
                model(rows)

    def reused() -> None:  # (b) the batch's forward serves the E-step and the step
        for model in models:
            model.zero_grad()
            logits = model(x)
            with torch.no_grad():
                model(rows[args.batch :])
            nn.functional.cross_entropy(logits, y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(lr * p.grad)

    def vectorised() -> None:  # (c) the K models at once, one shared batch
        grads = step_k(params, x, y)
        with torch.no_grad():
            for n in params:
                params[n].sub_(lr * grads[n])
            pass_k(params, rows)

    def both() -> None:  # (d) (b) and (c): the pass covers only the rows outside the batch
        grads = step_k(params, x, y)
        with torch.no_grad():
            for n in params:
                params[n].sub_(lr * grads[n])
            pass_k(params, rows[args.batch :])

    settings = {
        "(a) today: K x (step + pass)": today,
        "(b) E-step forward reused": reused,
        "(c) K models in one vmap": vectorised,
        "(d) (b) + (c)": both,
    }
    times: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.repeats + 2):
        for name, run in settings.items():
            start = clock()
            run()
            times[name].append(clock() - start)
    flops_today, flops_reused = round_flops(args.batch, args.rows, args.clients, k)
    square = torch.randn(1024, 1024)
    square @ square
    start = clock()
    for _ in range(20):
        square @ square
    peak = 20 * 2 * 1024**3 / (clock() - start) / 1e9  # on the benchmark's clock, like the table
    print(machine_line())
    print(
        f"FashionCNN channels-last float32; per client: K={k} models, a step on {args.batch} rows and "
        f"an E-step pass over {args.rows} rows; round = {args.clients} clients; {args.repeats} repeats "
        "(medians)"
    )
    print(
        f"round compute: (a) {flops_today / 1e9:.0f} GFLOP, (b) {flops_reused / 1e9:.0f} GFLOP; this "
        f"machine's float32 matmul (1024^3, one thread): {peak:.0f} GFLOP/s"
    )
    print(f"{'setting':<32}{'client ms':>10}{'round s':>9}{'GFLOP/s':>9}{'vs (a)':>8}")
    base = None
    for name, measured in times.items():
        client = statistics.median(measured[2:])
        round_s = args.clients * client
        base = base or round_s
        flops = flops_reused if name.startswith(("(b)", "(d)")) else flops_today
        rate = flops / 1e9 / round_s
        print(f"{name:<32}{1e3 * client:>10.1f}{round_s:>9.2f}{rate:>9.1f}{base / round_s:>7.2f}x")
    print(
        f"floor at the matmul rate: (a) {flops_today / 1e9 / peak:.2f} s, (b) "
        f"{flops_reused / 1e9 / peak:.2f} s per round (kernels only, no engine)"
    )


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
    ceiling_help = "the float32 round's floor: what computing less or better saves"
    parser.add_argument("--ceiling", action="store_true", help=ceiling_help)
    args = parser.parse_args()
    set_clock(args.clock)
    set_threads(args.threads)
    if args.ceiling:
        ceiling(args)
        return
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
