"""Which kind of randomness a ClientApp uses, decided on the node (:mod:`dpadmm.privacy.randomness`).

A ClientApp running inside Flower's simulation engine (a Ray actor of ``flwr run`` on the simulation
engine, or of ``flwr.simulation.run_simulation``) takes the **simulation** kind: its draws are keyed by the
run's seed, so a simulation equals the engine bit for bit. Anywhere else, and wherever it cannot tell, it
takes the **deployment** kind: its draws come from its node's own secret. Nothing the server sends
chooses the kind (the run config is the server's); the node's own node config (``randomness``) or
environment (``$DPADMM_RANDOMNESS``) may force one, for tests. A deployed node forced onto the simulation
kind says so in every reply, and the server prints it as a warning in the privacy statement.

Each reply reports the kind its agent used in its config record, under ``randomness``: one of
:data:`REPORTED`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping

from dpadmm.privacy.randomness import (
    DEPLOYMENT,
    FORCED_SIMULATION,
    SIMULATION,
    NodeSecret,
    Secret,
    forced_kind,
    state_dir,
)
from dpadmm.wire import IDENTITY_KEY

REPORTED = (SIMULATION, DEPLOYMENT, FORCED_SIMULATION)
_ACTOR_MODULE = "flwr.simulation.ray_transport.ray_actor"


def in_simulation_engine() -> bool:
    """Whether this call runs inside Flower's simulation engine: a frame of the call stack belongs to one of
    its Ray actors (``VirtualClientEngineActor.run``, which calls the ClientApp). A deployed SuperNode's
    ClientApp process never imports that module."""
    module = sys.modules.get(_ACTOR_MODULE)
    if module is None:
        return False
    actor = module.VirtualClientEngineActor
    frame = inspect.currentframe()
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), actor):
            return True
        frame = frame.f_back
    return False


def node_kind(node_config: Mapping[str, object]) -> str:
    """The kind this node uses (one of :data:`REPORTED`): what its own settings force, else what it runs
    in."""
    simulated = in_simulation_engine()
    forced = forced_kind(node_config)
    if forced == SIMULATION:
        return SIMULATION if simulated else FORCED_SIMULATION
    if forced == DEPLOYMENT:
        return DEPLOYMENT
    return SIMULATION if simulated else DEPLOYMENT


def node_randomness(node_config: Mapping[str, object], settings: Mapping[str, object], agent: int,
                    round_: int, digest: str) -> tuple[Secret | None, str]:
    """(this agent's randomness for the request, the kind to report): None for the simulation kinds, else
    the agent's :class:`~dpadmm.privacy.randomness.Secret` for the run the server names in ``settings``,
    after recording the request (``digest``) as answered for this round (a different request for the same
    round is refused: :meth:`~dpadmm.privacy.randomness.NodeSecret.answer`)."""
    kind = node_kind(node_config)
    if kind != DEPLOYMENT:
        return None, kind
    identity = str(settings.get(IDENTITY_KEY, ""))
    keeper = NodeSecret(state_dir(node_config), agent)
    randomness = keeper.randomness(identity)  # refuses a request without a run identity
    keeper.answer(identity, round_, digest)
    return randomness, kind
