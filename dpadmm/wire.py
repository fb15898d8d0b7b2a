"""How the ADMM variables travel in one Flower ``ArrayRecord``: flat keys ``<role>.<parameter>``.

A message carries several variables of the same model (the server sends w, lambda_p and
the last local iterate z; the agent replies z_p and, for E > 1, its last iterate), and a
model has several parameter tensors (logistic regression one, ``weight``; a network many,
``fc1.weight``, ...). One record keyed ``role.name`` holds them all, so a message stays a
single ``ArrayRecord`` as in Flower's own strategies. Roles contain no dot; parameter names
may, so a key splits at its first dot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # the server reads refusals, and so does the device's runtime, which logs its own
    from flwr.app import Message

T = TypeVar("T")

IDENTITY_KEY = "run-identity"  # server -> node, in every train config record: the run's identity
KIND_KEY = "randomness"  # node -> server, in the reply's config record: the kind of randomness it used
# node -> server, in a DP-IADMM reply's config record: the mechanism the node ran, as it calibrated it
# (dpadmm.iadmm.privacy.mechanism_of); the server's statement covers a reply only if it is the announced one
MECHANISM_KEY = "mechanism"
# node -> server, in the reply's config record instead of an answer (to the partition query before round 1,
# or to a round's message): why this node cannot take part at all (its configuration or its data is
# refused), a fault that would repeat every round, so the server ends the run
REFUSED_KEY = "refused"
DOWN = ("w", "lambda", "z")  # server -> agent: the model, the agent's dual, its last local iterate
UP = ("z", "z-last")  # agent -> server: z_p^{t+1} and (the average of E > 1 iterates) the last one

# DP-ADMM / DP-AccADMM (002): one vector each way, so plain keys.
POINT_KEY = "x"  # server -> client: where the iteration takes its gradient, [d]
GRADIENT_KEY = "gradient-sum"  # client -> server: sum_i clip_c(g_i) over the client's rows, [d]

# ADMM sharing (001): N-vectors, one per sample.
PULLED_KEY = "s-minus-z"  # server -> party: sum_m D_m x~_m - z, [N]
DUAL_KEY = "y"  # server -> party: the dual y, [N]
OWN_KEY = "own"  # server -> party, after a fault only: the party's message the server holds, [N]
MESSAGE_KEY = "message"  # party -> server: D_m x~_m (with its noise), [N]
SCORES_KEY = "test-scores"  # party -> server, evaluation: D_m^test x~_m, [N_test]
IDS_DIGEST_KEY = "ids-sha256"  # party -> server, in the train reply's config record: its ids' digest
# Paper 004 (decentralised): the router and an agent
EXCHANGED_KEY = "exchanged"  # router -> agent: x^{k-1} of the agent and its neighbours, [1 + |N_i|, d];
# agent -> router: its x^k, [d]
NEIGHBOURS_KEY = "agents"  # router -> agent, in the config record: the ids of those rows, the agent's first


def refusal_in(reply: Message) -> str | None:
    """The reason a reply refuses the run (:data:`REFUSED_KEY`), or None."""
    if reply.has_error():
        return None
    try:
        return str(reply.content["config"][REFUSED_KEY])
    except (KeyError, TypeError):
        return None


def pack(variables: Mapping[str, Mapping[str, T]]) -> dict[str, T]:
    """{role: {name: array}} -> {"role.name": array}."""
    return {f"{role}.{name}": value for role, params in variables.items() for name, value in params.items()}


def unpack(flat: Mapping[str, T]) -> dict[str, dict[str, T]]:
    """{"role.name": array} -> {role: {name: array}}; a key without a dot is an error naming it."""
    out: dict[str, dict[str, T]] = {}
    for key, value in flat.items():
        role, dot, name = key.partition(".")
        if not dot or not name:
            raise ValueError(f"array key {key!r} is not allowed; keys are '<role>.<parameter name>'")
        out.setdefault(role, {})[name] = value
    return out
