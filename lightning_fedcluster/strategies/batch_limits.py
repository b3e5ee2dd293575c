"""What Lightning's batch limits mean for federated rounds (checked when the strategy sets up).

A training epoch is one round and one batch (``RoundBatch``: the round runs whole inside it), and
an evaluation pass is chunks of clients followed by one item per unseen client. So:

- ``limit_train_batches`` keeps its meaning where it allows the one batch (an int >= 1, or 1.0:
  every round runs whole); a limit that allows none (0, a fraction below 1) would train nothing
  and is rejected, and ``overfit_batches`` would replace the round sampler: both are rejected,
  naming what to use instead (``clients_per_round``, ``max_epochs``).
- ``fast_dev_run=n`` keeps Lightning's meaning for training: n batches, so n whole rounds (one
  epoch: round 0). Validation, test and predict run whole (evaluation is chunked, so a whole pass
  costs about one round), because a pass cut after n items would report the clients it never
  scored as 0.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn


def _whole(limit: int | float) -> bool:
    """True where the limit allows a round's one batch: the float 1.0 (all batches) or an int >= 1."""
    return limit == 1.0 if isinstance(limit, float) else limit >= 1


def apply_batch_limits(trainer: pl.Trainer) -> None:
    """Reject batch limits that cut rounds; under ``fast_dev_run`` evaluate (and predict) every client."""
    if trainer.fast_dev_run:
        trainer.limit_val_batches = trainer.limit_test_batches = trainer.limit_predict_batches = 1.0
        return
    if trainer.state.fn != TrainerFn.FITTING:
        return
    if trainer.overfit_batches > 0:
        raise ValueError(
            f"overfit_batches={trainer.overfit_batches} does not apply to federated rounds (it would replace "
            "the round sampler): to overfit, train a few clients with clients_per_round and many local_steps"
        )
    if not _whole(trainer.limit_train_batches):
        raise ValueError(
            f"limit_train_batches={trainer.limit_train_batches} would train no round (a round is one "
            "training batch, so a limit below one batch skips it): train fewer clients per round with the "
            "strategy's clients_per_round, or fewer rounds with max_epochs; fast_dev_run=True runs one round"
        )
