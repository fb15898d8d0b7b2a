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
import logging
import sys
from collections.abc import Callable, Mapping

import torch

from dpadmm.privacy import device
from dpadmm.privacy.device import Charge, Device, RunRequest
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
log = logging.getLogger("dpadmm.node")
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


def data_digest(*tensors: torch.Tensor) -> str:
    """The digest of a node's data (its tensors' dtypes, shapes and bytes): what binds a charge of the
    device's budget to the data it was spent on (:mod:`dpadmm.privacy.device`)."""
    parts: list[bytes | str] = []
    for tensor in tensors:
        data = tensor.detach().cpu().contiguous().numpy().tobytes()
        parts += [str(tensor.dtype), repr(list(tensor.shape)), data]
    return device.digest(*parts)


def node_admission(node_config: Mapping[str, object], agent: int, identity: str,
                   request: Callable[[], RunRequest]) -> None:
    """Before any release (the partition query): on a deployed node, refuse a run that admission at its first
    release would refuse. With the run identity the server drew (``identity``), everything that admission
    checks, the lifetime and period budgets included, without writing anything
    (:meth:`~dpadmm.privacy.device.Device.admit` with ``charge=False``: a run already charged under that
    identity is admitted as it would be at its next release); without one (a server that sends none), the
    policy and the cap of one run (:meth:`~dpadmm.privacy.device.Device.preview`), and the first release
    refuses such a run. Simulation kinds check nothing (they protect nothing), so ``request`` is built only on
    a deployed node."""
    if node_kind(node_config) != DEPLOYMENT:
        return
    budget = Device(state_dir(node_config), agent)
    if identity:
        budget.admit(identity, request(), charge=False)
    else:
        budget.preview(request())


def node_charge(node_config: Mapping[str, object], settings: Mapping[str, object], agent: int, round_: int,
                request: Callable[[], RunRequest]) -> Charge | None:
    """On a deployed node, the device's charge for the run the server names in ``settings`` (``request()``
    admitted by its policy and lifetime budget, charged and fsynced at the run's first release) after
    checking that ``round_`` is one of the run's: :class:`~dpadmm.privacy.device.Device`. None for the
    simulation kinds. A request without a run identity is refused before anything is written."""
    if node_kind(node_config) != DEPLOYMENT:
        return None
    budget = Device(state_dir(node_config), agent)
    charge = budget.admit(str(settings.get(IDENTITY_KEY, "")), request())
    budget.check_round(charge, round_)
    return charge


def node_randomness(node_config: Mapping[str, object], settings: Mapping[str, object], agent: int,
                    round_: int, digest: Callable[[], str], request: Callable[[], RunRequest]
                    ) -> tuple[Secret | None, str, Charge | None]:
    """(this agent's randomness for the request, the kind to report, the device's charge for the run): None
    and None for the simulation kinds; on a deployed node the agent's
    :class:`~dpadmm.privacy.randomness.Secret` for the run the server names in ``settings`` and the run's
    :class:`~dpadmm.privacy.device.Charge`, after the device admitted the run (:func:`node_charge`;
    ``request()`` is built only on a deployed node) and recorded the request (``digest()``, also computed only
    there: it hashes every array of the message) as answered for this round (a different request for the
    same round is refused: :meth:`~dpadmm.privacy.randomness.NodeSecret.answer`)."""
    kind = node_kind(node_config)
    charge = node_charge(node_config, settings, agent, round_, request)
    if charge is None:
        return None, kind, None
    identity = str(settings.get(IDENTITY_KEY, ""))
    keeper = NodeSecret(state_dir(node_config), agent)
    randomness = keeper.randomness(identity)
    keeper.answer(identity, round_, digest())
    if round_ == charge.rounds:  # the node's own statement of the run, in its own log
        log.info("dpadmm node: agent %d answers the last round (%d) of run %s: the run costs this device "
                 "(eps = %.6g, delta = %.3g) by its own accountant (%s, %s); `dpadmm node status` shows its "
                 "total", agent, round_, identity, charge.epsilon, charge.delta, charge.algorithm,
                 charge.mechanism)
    return randomness, kind, charge
