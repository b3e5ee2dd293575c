"""Named seed salts: every random stream of the library is ``derive_seed(seed, ..., SALT)`` with
one of these, so that no two streams share numbers by accident and each is named in one place.
The values are the ones the streams have always used (changing one changes results)."""

import numpy as np

CLUSTER_INIT = 0xC1  # independent initialisation of the K cluster copies
CLIENT_SAMPLING = 0x5EED  # which clients take part in a round
CLIENT_RNG = 0x7015E  # a rule's per-client generator (FedRC's label-sum noise, ...)
MINIBATCH_ORDER = 0xBA7C  # a client's local minibatch permutation in a round
FINETUNE_ORDER = 0xF1E  # FedRC-FT's minibatch order at evaluation
FEDSOFT_SELECTION = 0x50F7  # FedSoft's per-cluster client selection
FESEM_INITIAL_ASSIGNMENT = 0xFE5E  # FeSEM's random first assignment of a client
FESEM_CENTRES = 0xCE  # FeSEM/WeCFL's K-means centre picks
DFEDEM_GRAPH = 0x9A4  # D-FedEM's random communication graph


def derive_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (seed, round, client, ...)."""
    state = np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))
