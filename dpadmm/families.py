"""The families of the house, by the ``algorithm`` values each runs: how the entry points pick one.

``dpadmm train | privacy`` and the Flower apps read ``algorithm`` first and hand the other keys
to that family's configuration. The configurations import neither torch nor Flower, so the
command line stays fast to start.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpadmm.iadmm.config import ALGORITHMS as IADMM_ALGORITHMS
from dpadmm.iadmm.config import RunConfig
from dpadmm.linadmm.config import ALGORITHMS as LINADMM_ALGORITHMS
from dpadmm.linadmm.config import LinAdmmConfig


@dataclass(frozen=True)
class Family:
    """One family: its package under dpadmm/, the papers it implements, its configuration class."""

    name: str
    papers: str
    config: type
    algorithms: tuple[str, ...]


FAMILIES = (
    Family("iadmm", "Ryu & Kim, DP-IADMM (003, 000)", RunConfig, IADMM_ALGORITHMS),
    Family("linadmm", "Xu et al., DP-ADMM / DP-AccADMM (002)", LinAdmmConfig, LINADMM_ALGORITHMS),
)
ALGORITHMS = tuple(a for f in FAMILIES for a in f.algorithms)
DEFAULT = FAMILIES[0]  # the default job's family: `flwr run .` and `dpadmm train` without --algorithm


def family_of(algorithm: str) -> Family:
    """The family that runs ``algorithm``; a ValueError naming every allowed value otherwise."""
    for family in FAMILIES:
        if algorithm in family.algorithms:
            return family
    raise ValueError(f"algorithm={algorithm!r} is not allowed; choose one of {', '.join(ALGORITHMS)}")
