"""The engine: torch machinery that simulates clients and rounds, with no algorithm named.
Cluster copies (``copies``), losses and the no-grad pass (``losses``), the client contract
(``client``), a round's accumulators (``round``), the server step (``server``), per-client
vectors and personal models (``vectors``), persistent local-optimizer state
(``optimizer_state``), the server optimizer's state (``server_optimizer``), evaluation
(``evaluation``), the round and its executors (``federation``, ``executors``), checkpoint
metadata (``checkpoint``), checks before training (``setup_checks``), where the logits are in a
model's output (``outputs``) and the user's LR schedulers over rounds (``schedulers``)."""
