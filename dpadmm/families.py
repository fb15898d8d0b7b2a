"""The families of the house, by the ``algorithm`` values each runs: how the entry points pick one.

``dpadmm train | privacy`` and the Flower apps read ``algorithm`` first and hand the other keys
to that family's configuration. The configurations import neither torch nor Flower, so the
command line stays fast to start.

In the Flower app's run config (``[tool.flwr.app.config]`` in pyproject.toml) the default
family's keys are top-level, as they always were; every other family's keys sit in a table of
its own, ``[tool.flwr.app.config.<family>]``, which Flower flattens to ``<family>.<key>``
(``flwr run . --run-config "algorithm='dp-admm' linadmm.dataset='ijcnn1'"``). Two reasons:
Flower refuses an override whose key pyproject.toml lacks, so every family's keys must be
there; and families share key names with different defaults (``delta`` is 1e-5 for DP-IADMM,
the paper's 1e-3 for DP-ADMM), which one flat table could not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpadmm.decentral.config import ALGORITHMS as DECENTRAL_ALGORITHMS
from dpadmm.decentral.config import DecentralConfig
from dpadmm.iadmm.config import ALGORITHMS as IADMM_ALGORITHMS
from dpadmm.iadmm.config import RunConfig, from_app_config
from dpadmm.linadmm.config import ALGORITHMS as LINADMM_ALGORITHMS
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.sharing.config import ALGORITHMS as SHARING_ALGORITHMS
from dpadmm.sharing.config import SharingConfig


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
    Family("sharing", "Hu et al., ADMM sharing over distributed features (001)", SharingConfig,
           SHARING_ALGORITHMS),
    Family("decentral", "Xiao, Ye & Devadas, decentralised local-DP optimisation (004)", DecentralConfig,
           DECENTRAL_ALGORITHMS),
)
ALGORITHMS = tuple(a for f in FAMILIES for a in f.algorithms)
DEFAULT = FAMILIES[0]  # the default job's family: `flwr run .` and `dpadmm train` without --algorithm


def family_of(algorithm: str) -> Family:
    """The family that runs ``algorithm``; a ValueError naming every allowed value otherwise."""
    for family in FAMILIES:
        if algorithm in family.algorithms:
            return family
    raise ValueError(f"algorithm={algorithm!r} is not allowed; choose one of {', '.join(ALGORITHMS)}")


def from_run_config(run_config: Mapping[str, Any]) -> Any:
    """The configuration of the family that ``run_config["algorithm"]`` picks, from its own keys.

    A ValueError about one of another family's keys names it as the run config does
    (``linadmm.rounds=0 is not allowed; ...``)."""
    algorithm = str(run_config.get("algorithm", DEFAULT.config().algorithm))
    family = family_of(algorithm)
    if family is DEFAULT:  # the main job, or the papers' defaults (dpadmm.iadmm.config.requested)
        return from_app_config({k: v for k, v in run_config.items() if "." not in k})
    prefix = f"{family.name}."
    own = {k[len(prefix):]: v for k, v in run_config.items() if k.startswith(prefix)}
    try:
        return family.config.from_mapping({**own, "algorithm": algorithm})
    except ValueError as error:
        named = str(error).split("=")[0] in own
        raise ValueError(f"{prefix}{error}" if named else f"{error} (in the {family.name}.* keys)") from None
