"""engine/gradient_clipping.py: each trained copy's local gradient rescaled to ``gradient_clip_val``
where longer, by hand; one FedAvg round with it through the public API against the step computed
here; the refusals (a bad value, shared layers, the Trainer's own ``gradient_clip_val``)."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

import lightning_fedcluster as lf
from lightning_fedcluster.datamodules import DigitsFederated
from lightning_fedcluster.engine.gradient_clipping import (
    check_gradient_clip_val,
    clip_copy_gradients,
    clip_pair_gradients,
)
from lightning_fedcluster.models import MLPClassifier
from tests.conftest import make_trainer


def _copies_with_gradients(first: list[float], second: list[float]) -> torch.nn.ModuleList:
    """Two one-parameter-pair copies whose gradients are ``first`` and ``second`` (weight, bias)."""
    copies = torch.nn.ModuleList([torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)])
    for model, (w, b) in zip(copies, (first, second), strict=True):
        model.weight.grad = torch.tensor([[w]])
        model.bias.grad = torch.tensor([b])
    return copies


def test_a_longer_gradient_is_rescaled_to_the_bound_and_a_shorter_one_is_left_exactly():
    copies = _copies_with_gradients([3.0, 4.0], [0.3, 0.4])  # norms 5 and 0.5
    clip_copy_gradients(copies, (0, 1), 2.5)
    assert copies[0].weight.grad.item() == pytest.approx(1.5)
    assert copies[0].bias.grad.item() == pytest.approx(2.0)
    assert copies[1].weight.grad.item() == torch.tensor(0.3).item()  # bit-for-bit untouched
    assert copies[1].bias.grad.item() == torch.tensor(0.4).item()


def test_each_copy_is_clipped_on_its_own_norm_and_only_the_trained_copies():
    copies = _copies_with_gradients([6.0, 8.0], [0.0, 20.0])  # norms 10 and 20
    clip_copy_gradients(copies, (1,), 5.0)
    assert copies[0].weight.grad.item() == 6.0  # not trained: untouched
    assert copies[1].bias.grad.item() == pytest.approx(5.0)  # 20 → 5, not scaled with copy 0's norm
    clip_copy_gradients(copies, (0,), None)  # None: no clipping
    assert copies[0].bias.grad.item() == 8.0


def test_the_stacked_gradients_of_every_pair_are_clipped_as_the_loop_clips_each_copy():
    weight = torch.tensor([[[3.0], [0.3]], [[0.0], [12.0]]])  # [C=2, K=2, 1]
    bias = torch.tensor([[4.0, 0.4], [0.0, 5.0]])  # [C, K]: norms (5, 0.5), (0, 13)
    clipped = clip_pair_gradients({"weight": weight, "bias": bias}, 2.5)
    torch.testing.assert_close(clipped["weight"], torch.tensor([[[1.5], [0.3]], [[0.0], [12.0 * 2.5 / 13]]]))
    torch.testing.assert_close(clipped["bias"], torch.tensor([[2.0, 0.4], [0.0, 5.0 * 2.5 / 13]]))
    assert clipped["bias"][1, 0].item() == 0.0  # a zero gradient stays zero (no 0/0)


@pytest.mark.parametrize("value", [0, -1.0, True, "5", math.inf, math.nan, [1.0]])
def test_a_bad_gradient_clip_val_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"gradient_clip_val must be a finite number > 0 .* or None"):
        check_gradient_clip_val(value)
    with pytest.raises(ValueError, match=r"gradient_clip_val must be a finite number > 0"):
        lf.FedAvgStrategy(gradient_clip_val=value)


def test_shared_layers_and_the_trainers_own_clipping_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"gradient_clip_val=1 does not support shared_layers"):
        lf.FedRCStrategy(2, shared_layers=("net.0",), gradient_clip_val=1.0)
    trainer = make_trainer(lf.FedAvgStrategy(local_steps=1), max_epochs=1, gradient_clip_val=1.0)
    with pytest.raises(ValueError, match=r"pass it to the strategy instead, e\.g\. FedRCStrategy\(\.\.\., "):
        trainer.fit(MLPClassifier(), datamodule=DigitsFederated(num_clients=6, batch_size=512))


class _Start(pl.Callback):
    """The global model before the first round."""

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.start = {n: p.detach().clone() for n, p in module.models[0].named_parameters()}


@pytest.mark.parametrize("executor", ["loop", "vectorized"])
def test_one_fedavg_round_steps_each_client_along_its_clipped_gradient(executor):
    """One local step of plain SGD over each client's whole training split (batch_size above every
    split), clipped to 0.2: θ₁ = Σ N_i (θ₀ − lr · clip(g_i)) / Σ N_i, with g_i computed here."""
    dm = DigitsFederated(num_clients=6, batch_size=512)
    start, lr, bound = _Start(), 0.1, 0.2
    strategy = lf.FedAvgStrategy(local_steps=1, gradient_clip_val=bound, executor=executor)
    trainer = make_trainer(strategy, max_epochs=1, limit_val_batches=0, callbacks=[start])
    trainer.fit(MLPClassifier(lr=lr), datamodule=dm)
    reference = MLPClassifier()
    expected = {n: torch.zeros_like(p) for n, p in start.start.items()}
    clipped_clients = 0
    for client in range(dm.num_clients):
        x, y = dm.train_split(client)[:2]
        reference.load_state_dict(start.start)
        reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        grads = {n: p.grad for n, p in reference.named_parameters()}
        norm = torch.stack([g.norm() for g in grads.values()]).norm()
        clipped_clients += int(norm > bound)
        scale = min(1.0, bound / float(norm))
        for name in expected:
            expected[name] += x.shape[0] * (start.start[name] - lr * scale * grads[name])
    assert clipped_clients >= 4  # the bound acts on most clients here
    total = sum(dm.train_split(c)[0].shape[0] for c in range(dm.num_clients))
    trained = dict(trainer.lightning_module.models[0].named_parameters())
    for name, value in expected.items():
        torch.testing.assert_close(trained[name].detach(), value / total, rtol=1e-5, atol=1e-6, msg=name)
