"""Pure tensor math of the algorithms: E-steps, weights, aggregation, client state, server actions.

One module per algorithm's rules: `fedrc` (FedRC, FedEM), `dfedem`, `fedsoft`,
`ifca`, `fesem` (FeSEM, WeCFL), `cfl`, `fedprox` (FedProx, FedAvg). The
contract they implement: [`base`][lightning_fedcluster.algorithms.base] (``ClientRule``, ``ServerRule``,
``Algorithm``), the optional
protocols in [`protocols`][lightning_fedcluster.algorithms.protocols], what the server hooks see
([`server_view`][lightning_fedcluster.algorithms.server_view]) and return
([`actions`][lightning_fedcluster.algorithms.actions]), and the client store with its declared entries
([`client_state`][lightning_fedcluster.algorithms.client_state]). Shared
by all: server optimizers (`server_optimizer`). The mechanisms that find the concepts (concept
grouping, merging, retirement, removal, re-seeding, the ω weighting) are components that a rule
runs in order ([`discovery`][lightning_fedcluster.algorithms.discovery]).
"""

from lightning_fedcluster.algorithms.base import (
    Algorithm,
    ClientReport,
    ClientRule,
    HardAssignment,
    ServerRule,
    SoftMixture,
)
from lightning_fedcluster.algorithms.cfl import CFL
from lightning_fedcluster.algorithms.client_state import ClientState, Scope, StateEntry
from lightning_fedcluster.algorithms.dfedem import DFedEM
from lightning_fedcluster.algorithms.fedprox import FedProx
from lightning_fedcluster.algorithms.fedrc import FedRC
from lightning_fedcluster.algorithms.fedsoft import FedSoft
from lightning_fedcluster.algorithms.fesem import FeSEM, initial_assignment
from lightning_fedcluster.algorithms.ifca import IFCA
from lightning_fedcluster.algorithms.protocols import (
    Capabilities,
    Estimation,
    LabelStatistics,
    ModelDistances,
    PersonalMixing,
    PersonalModels,
    ServerSelection,
)
from lightning_fedcluster.algorithms.server_view import ClientStoreView, RoundOutcome, ServerView

__all__ = [
    "CFL",
    "IFCA",
    "Algorithm",
    "Capabilities",
    "ClientReport",
    "ClientRule",
    "ClientState",
    "ClientStoreView",
    "DFedEM",
    "Estimation",
    "FeSEM",
    "FedProx",
    "FedRC",
    "FedSoft",
    "HardAssignment",
    "LabelStatistics",
    "ModelDistances",
    "PersonalMixing",
    "PersonalModels",
    "RoundOutcome",
    "Scope",
    "ServerRule",
    "ServerSelection",
    "ServerView",
    "SoftMixture",
    "StateEntry",
    "initial_assignment",
]
