"""Pure tensor math of the algorithms: E-steps, weights, aggregation, client state, server actions.

One module per algorithm's rules: :mod:`.fedrc` (FedRC, FedEM), :mod:`.dfedem`, :mod:`.fedsoft`,
:mod:`.ifca`, :mod:`.fesem` (FeSEM, WeCFL), :mod:`.cfl`, :mod:`.fedprox` (FedProx, FedAvg); the
contract they implement is in :mod:`.base`. Shared by all: server optimizers
(:mod:`.server_optimizer`); FedRC's optional re-seeding of dead clusters is :mod:`.reseed`.
"""

from lightning_fedcluster.algorithms.base import Algorithm, ClientReport, HardAssignment
from lightning_fedcluster.algorithms.cfl import CFL
from lightning_fedcluster.algorithms.client_state import ClientState
from lightning_fedcluster.algorithms.dfedem import DFedEM
from lightning_fedcluster.algorithms.fedprox import FedProx
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.fedsoft import FedSoft
from lightning_fedcluster.algorithms.fesem import FeSEM, initial_assignment
from lightning_fedcluster.algorithms.ifca import IFCA

__all__ = [
    "CFL",
    "IFCA",
    "Algorithm",
    "ClientReport",
    "ClientState",
    "DFedEM",
    "FeSEM",
    "FedProx",
    "FedRC",
    "FedSoft",
    "HardAssignment",
    "initial_assignment",
]
