"""Which ``Trainer(precision=...)`` the federated strategies train with (checked at setup).

- "32-true" (the default) and "bf16-mixed" train. With "bf16-mixed" every forward the engine
  makes runs under Lightning's autocast: the whole round inside ``training_step`` (the clients'
  E-steps and local steps); evaluation inside ``validation_step``/``test_step``; and the
  passes that run in hooks (the estimation pass at fit start, inference) through
  ``LocalSetup.evaluate`` and ``ClusteredModule.evaluate_clusters``, which enter the plugin's
  ``forward_context``. Weights,
  gradients, the optimizer, aggregation and the E-step's arithmetic stay float32/float64; the
  logits are read back as float32 (``engine/outputs.py``). The vectorised executor refuses it
  (``engine/executors/select.py``): ``vmap`` applies no autocast to its no-grad E-step pass.
- "16-mixed" needs a gradient scaler, which the engine's update steps do not apply; the "true"
  half and double precisions would convert the weights that the engine averages and stores in
  float32. They are refused before anything runs. On a CPU, Lightning's Trainer itself replaces
  "16-mixed" by "bf16-mixed" (with its warning), which trains.
"""

from __future__ import annotations

import lightning.pytorch as pl

SUPPORTED_PRECISIONS = ("32-true", "bf16-mixed")


def check_precision(trainer: pl.Trainer) -> None:
    """Refuse a ``Trainer(precision=...)`` the engine does not train with, naming the ones it does."""
    precision = trainer.strategy.precision_plugin.precision
    if precision not in SUPPORTED_PRECISIONS:
        raise ValueError(
            f"Trainer(precision={precision!r}) is not supported by the federated strategies: use "
            "precision='32-true' (the default) or precision='bf16-mixed' (bfloat16 autocast on every "
            "forward the engine makes; weights, optimizer and aggregation stay float32). To halve the "
            "persistent optimizer store use optimizer_state_dtype='bfloat16'"
        )
