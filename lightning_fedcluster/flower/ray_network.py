"""Keep the Ray cluster that ``simulate`` starts on this machine's loopback interface.

On Linux, Ray takes the machine's outward IP as its node address and its servers (gcs_server,
raylet, workers) then listen on every interface, reachable from the network, although a
simulation only talks to itself; ``ray.init`` turns a ``127.0.0.1`` node address back into the
outward one. On macOS and Windows Ray keeps a single-machine cluster on loopback, switched by
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and its servers then listen on 127.0.0.1 only. The same
switch here: in the environment (the processes Ray starts read it) and in Ray's constant, which
it reads when it picks the node address (a Ray imported earlier read the environment already).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
CONSTANTS = "ray._private.ray_constants"


@contextlib.contextmanager
def ray_on_loopback() -> Iterator[None]:
    """Within the block, a Ray cluster started on this machine listens on 127.0.0.1 only."""
    saved = os.environ.get(SWITCH)
    os.environ[SWITCH] = "0"
    constants = sys.modules.get(CONSTANTS)
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = saved
        constants = sys.modules.get(CONSTANTS)
        if constants is not None:  # as Ray reads it at import
            constants.ENABLE_RAY_CLUSTER = constants.env_bool(SWITCH, not constants.IS_WINDOWS_OR_OSX)
