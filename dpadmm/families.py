"""The families of the house, by the ``algorithm`` values each runs: how the entry points pick one.

``dpadmm train | privacy`` and the Flower apps read ``algorithm`` first and hand the other keys
to that family's configuration. The configurations import neither torch nor Flower, so the
command line stays fast to start.

In the Flower app's run config (``[tool.flwr.app.config]`` in pyproject.toml) only ``algorithm`` and
DP-IADMM's ``preset`` are top-level; every family's keys sit in a table of its own,
``[tool.flwr.app.config.<table>]``, which Flower flattens to ``<table>.<key>`` (``flwr run .
--run-config "algorithm='dp-admm' linadmm.dataset='ijcnn1'"``). DP-IADMM has two, one per preset:
``iadmm`` (the main job, the plain defaults) and ``iadmm-papers`` (the papers' settings, every key
written out). Flower merges a run's ``--run-config`` over these values, so the app cannot tell a given
value from a default; the shape makes that harmless:

- a key that no table has (``rounds`` with no table) is refused by Flower itself;
- the family reads its own table as it is, so no preset ever replaces a given value;
- a key of a table the run does not read that differs from its default was given for nothing, and is
  refused with the table to use (``iadmm.rounds=1 is not read with algorithm='ldp-admm'; its keys are
  decentral.*: decentral.rounds``).

Families share key names with different defaults (``delta`` is 1e-5 for DP-IADMM, the paper's 1e-3 for
DP-ADMM), which one flat table could not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dpadmm.decentral.config import ALGORITHMS as DECENTRAL_ALGORITHMS
from dpadmm.decentral.config import DecentralConfig
from dpadmm.iadmm.config import ALGORITHMS as IADMM_ALGORITHMS
from dpadmm.iadmm.config import PRESETS, RunConfig, from_app_config, preset_values
from dpadmm.keys import allowed, coerce
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
TOP_LEVEL = ("algorithm", "preset")  # the run config's keys outside the tables


def family_of(algorithm: str) -> Family:
    """The family that runs ``algorithm``; a ValueError naming every allowed value otherwise."""
    for family in FAMILIES:
        if algorithm in family.algorithms:
            return family
    raise ValueError(f"algorithm={algorithm!r} is not allowed; choose one of {', '.join(ALGORITHMS)}")


def table_of(family: Family, preset: str = PRESETS[0]) -> str:
    """The run-config table a family reads: its name, or for DP-IADMM under the papers preset iadmm-papers."""
    return family.name if preset == PRESETS[0] else f"{family.name}-{preset}"


def tables() -> dict[str, dict[str, Any]]:
    """Every table of the Flower run config, by name, with its keys' values (pyproject.toml holds these; a
    test keeps them equal): DP-IADMM's one per preset, every other family's at its configuration's
    defaults. ``algorithm`` is top-level, in no table."""
    values = {table_of(DEFAULT, preset): preset_values(preset) for preset in PRESETS}
    values.update({f.name: f.config().to_mapping() for f in FAMILIES if f is not DEFAULT})
    return {name: {k: v for k, v in table.items() if k != "algorithm"} for name, table in values.items()}


def from_run_config(run_config: Mapping[str, Any]) -> Any:
    """The configuration of the family that ``run_config["algorithm"]`` picks, from its own table.

    ``run_config`` is flat, as Flower gives it (``linadmm.rounds``), and may hold every table with
    pyproject.toml's values merged in, or only the keys given (``run_simulation``). A ValueError about a
    key names it as the run config does (``linadmm.rounds=0 is not allowed; ...``).

    Cached by value: a ClientApp reads its run config for every message, and building the configuration
    checks every key of every table (about 5 ms, most of a small model's message at 195 agents); the
    configurations are frozen, so one serves every message of a run. A refused run config is checked again
    each time (errors are not cached)."""
    # each value with its type: 1, 1.0 and True are equal keys, and a value of a refused type must not be
    # answered with the configuration built from an equal one of the right type
    items = tuple(sorted((name, type(value).__name__, value) for name, value in run_config.items()))
    try:
        return _from_items(items)
    except TypeError:  # an unhashable value (Flower's run config holds none): built without the cache
        return _from_run_config(run_config)


@lru_cache(maxsize=16)
def _from_items(items: tuple[tuple[str, str, Any], ...]) -> Any:
    return _from_run_config({name: value for name, _, value in items})


def _from_run_config(run_config: Mapping[str, Any]) -> Any:
    algorithm = str(run_config.get("algorithm", DEFAULT.config().algorithm))
    family = family_of(algorithm)
    preset = str(run_config.get("preset", PRESETS[0]))
    allowed("preset", preset, PRESETS)
    if preset != PRESETS[0] and family is not DEFAULT:
        raise ValueError(f"preset={preset!r} is not allowed with algorithm={algorithm!r}: presets are "
                         f"DP-IADMM's; {family.name}.* holds {family.papers}'s settings")
    every = tables()
    table = table_of(family, preset)
    split: dict[str, dict[str, Any]] = {}
    for name, value in run_config.items():
        prefix, dot, rest = name.partition(".")
        if not dot and name in TOP_LEVEL:
            continue
        if not dot or prefix not in every:
            raise ValueError(f"unknown configuration key {name!r}; the run config has {', '.join(TOP_LEVEL)} "
                             f"and the tables {', '.join(f'{t}.*' for t in every)}")
        split.setdefault(prefix, {})[rest] = value
    own = split.pop(table, {})
    _unread(table, {k: v for k, v in own.items() if k not in every[table]}, every[table], table, "")
    for other, values in split.items():
        _unread(other, values, every[other], table, f"algorithm={algorithm!r}"
                + (f" preset={preset!r}" if family is DEFAULT else ""))
    prefix = f"{table}."
    try:
        if family is DEFAULT:
            return from_app_config({**own, "algorithm": algorithm}, preset)
        return family.config.from_mapping({**own, "algorithm": algorithm})
    except ValueError as error:
        named = str(error).split("=")[0] in own
        raise ValueError(f"{prefix}{error}" if named else f"{error} (in the {table}.* keys)") from None


def _unread(name: str, values: Mapping[str, Any], defaults: Mapping[str, Any], table: str, run: str) -> None:
    """Refuse a value given in table ``name``, which the run (``run``) does not read: one that differs from
    the table's default (Flower merges the defaults into every run config, so only a difference tells a
    given value). The message names the key to use instead when the read ``table`` has one."""
    for key_, value in values.items():
        if key_ not in defaults:
            raise ValueError(f"unknown configuration key '{name}.{key_}'; known keys: "
                             f"{', '.join(f'{name}.{k}' for k in sorted(defaults))}")
        default = defaults[key_]
        try:
            same = coerce(key_, value, type(default).__name__) == default
        except ValueError:
            same = False
        if not same:
            instead = f": {table}.{key_}" if key_ in tables()[table] else ""
            raise ValueError(f"{name}.{key_}={value!r} is not read with {run}; its keys are "
                             f"{table}.*{instead}")
