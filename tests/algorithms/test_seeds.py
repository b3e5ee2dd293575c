"""algorithms/seeds.py: ``derive_seed`` mixes its parts into a 63-bit seed, and every named salt
is its own stream."""

import itertools

from lightning_fedcluster.algorithms import seeds
from lightning_fedcluster.algorithms.seeds import derive_seed


def test_derive_seed_is_deterministic_and_63_bit() -> None:
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    assert derive_seed(7) == derive_seed(7)
    for parts in [(0,), (1, 2), (2**32 - 1, 299, 0x5EED), (12345, 3, 17, 0xBA7C)]:
        value = derive_seed(*parts)
        assert isinstance(value, int)
        assert 0 <= value < 2**63


def test_derive_seed_distinct_for_distinct_inputs() -> None:
    grid = list(itertools.product(range(4), range(25), range(1, 11)))  # (seed, round, client)
    seeds_of_grid = {derive_seed(*parts) for parts in grid}
    assert len(seeds_of_grid) == len(grid)
    # argument order matters
    assert derive_seed(0, 1) != derive_seed(1, 0)
    assert derive_seed(3, 5, 0x5EED) != derive_seed(3, 0x5EED, 5)


def test_derive_seed_keeps_its_recorded_values() -> None:
    """Every recorded run depends on these numbers; parts are taken modulo 2**32."""
    assert derive_seed(0) == 7896617691693857887
    assert derive_seed(0, 1, 2) == 1535930435702422785
    assert derive_seed(2**32 + 5) == derive_seed(5)
    assert derive_seed(-1) == derive_seed(2**32 - 1)


def test_the_named_salts_are_distinct_and_keep_their_values() -> None:
    salts = {name: value for name, value in vars(seeds).items() if name.isupper()}
    assert salts == {
        "CLUSTER_INIT": 0xC1,
        "CLIENT_SAMPLING": 0x5EED,
        "CLIENT_RNG": 0x7015E,
        "MINIBATCH_ORDER": 0xBA7C,
        "FINETUNE_ORDER": 0xF1E,
        "FEDSOFT_SELECTION": 0x50F7,
        "FESEM_INITIAL_ASSIGNMENT": 0xFE5E,
        "FESEM_CENTRES": 0xCE,
        "DFEDEM_GRAPH": 0x9A4,
    }
    assert len(set(salts.values())) == len(salts)
