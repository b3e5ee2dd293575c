"""``Task``: what differs between classification and regression, in one place.

The default per-sample loss, what a model's raw output becomes (class probabilities or flat
predictions), the prediction a client's mixture gives, and the summed scores behind every
accuracy / MSE the library reports (training metrics, validation, test, Flower's validation).
A ``str`` enum, so the datamodule's ``task = "classification"`` is accepted as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor


class Task(str, Enum):
    """Classification or regression. Members are named by their values, so that a ``Task`` and
    its name are equal, hash alike (dict keys) and print alike."""

    classification = "classification"
    regression = "regression"
    CLASSIFICATION = "classification"  # aliases
    REGRESSION = "regression"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def of(cls, value: str | Task) -> Task:
        """The task named ``value`` (a datamodule's ``task`` attribute)."""
        try:
            return cls(value)
        except ValueError:
            names = [t.value for t in cls]
            raise ValueError(f"task must be one of {names}, got {value!r}") from None

    @property
    def is_classification(self) -> bool:
        return self is Task.CLASSIFICATION

    @property
    def metric(self) -> str:
        """The reported metric's short name: "acc" (accuracy) or "mse"."""
        return "acc" if self.is_classification else "mse"

    @property
    def round_metrics(self) -> tuple[str, str]:
        """The training metrics every round reports (and a plateau scheduler may monitor)."""
        return ("train/loss", f"train/{self.metric}")

    def label_classes(self, num_classes: int) -> int:
        """Rows of the label statistics: the class count, 0 for regression."""
        return num_classes if self.is_classification else 0

    def default_loss(self) -> Callable[[Tensor, Tensor], Tensor]:
        """Per-sample loss [N] of raw outputs: cross-entropy, or the squared error averaged over
        the output dimensions (regression)."""
        if self.is_classification:
            return lambda out, y: F.cross_entropy(out, y, reduction="none")
        return lambda out, y: (out.reshape(y.shape) - y).square().reshape(y.shape[0], -1).mean(1)

    def outputs(self, raw: Tensor) -> Tensor:
        """Class probabilities [N, C] (classification) or predictions flattened to [N, D]."""
        if self.is_classification:
            return torch.softmax(raw.float(), dim=1)
        return raw.reshape(raw.shape[0], -1).float()

    def predict(self, outputs: Tensor) -> Tensor:
        """The prediction of (mixture) outputs: the most likely class, or the prediction itself."""
        return outputs.argmax(1) if self.is_classification else outputs

    def score(self, prediction: Tensor, y: Tensor) -> Tensor:
        """Summed correct predictions (classification) or summed per-sample squared error (float64)."""
        if self.is_classification:
            return (prediction.argmax(1) == y).sum().double()
        return self.squared_error(prediction, y).sum()

    def loss_and_score(self, mixture: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Summed mixture NLL and correct predictions (regression: the squared error twice), float64."""
        loss, score = self.row_loss_and_score(mixture, y)
        return loss.sum(), score.sum()

    def row_loss_and_score(self, mixture: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Per row [..., N] (any leading axes), float64: the mixture's NLL and whether its
        prediction is right (regression: the squared error twice)."""
        if self.is_classification:
            likelihood = mixture.gather(-1, y.unsqueeze(-1)).squeeze(-1).clamp_min(1e-300)
            return -likelihood.log(), (mixture.argmax(-1) == y).double()
        error = (mixture.double() - y.reshape(mixture.shape).double()).square().mean(-1)
        return error, error

    @staticmethod
    def squared_error(prediction: Tensor, y: Tensor) -> Tensor:
        """Per-sample squared error [N], averaged over output dimensions, in float64."""
        return (prediction.double() - y.reshape(y.shape[0], -1).double()).square().mean(1)
