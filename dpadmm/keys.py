"""Run-config keys, shared by every family's configuration: kebab-case names, checks, coercion.

A family's configuration is a frozen dataclass whose fields are its keys in snake_case; the
Flower app reads them from ``context.run_config`` (the family's table of ``[tool.flwr.app.config]``,
overridable with ``flwr run . --run-config "<table>.<key>=..."``) and the ``dpadmm`` command builds
one flag per field, so ``local_steps`` is ``local-steps`` everywhere. Errors name the bad value and
what is allowed (the convention of Opacus and dp-accounting).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Self, TypeVar

_C = TypeVar("_C")


class Keyed:
    """Mixin of a family's configuration dataclass: built from and written to its kebab-case mapping."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Self:
        """Build from kebab-case keys (a Flower run config); unknown keys are an error."""
        return from_mapping(cls, values)

    def to_mapping(self) -> dict[str, Any]:
        return to_mapping(self)

    def check_types(self) -> None:
        """Refuse a field whose value is not of its annotated type, naming it (what :func:`coerce` does for a
        run config, for a configuration built in Python: ``rounds="abc"``, ``rounds=2.7`` or ``rounds=True``
        would otherwise fail deep inside a run, or run as 1); an int given for a float becomes that float."""
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            kind = field.type if isinstance(field.type, str) else field.type.__name__
            if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, field.name, float(value))
            elif kind in _TYPES and not (isinstance(value, _TYPES[kind]) and
                                         (kind == "bool" or not isinstance(value, bool))):
                raise ValueError(f"{key(field.name)}={value!r} is not allowed; expected {_A[kind]}")


def key(name: str) -> str:
    """The kebab-case key of a snake_case field name."""
    return name.replace("_", "-")


def allowed(name: str, value: object, options: tuple[str, ...]) -> None:
    """A ValueError naming ``value`` and every allowed option, unless ``value`` is one of them."""
    if value not in options:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {', '.join(options)}")


def from_mapping(cls: type[_C], values: Mapping[str, Any]) -> _C:
    """An instance of the dataclass ``cls`` from kebab-case keys (a Flower run config); unknown keys are an
    error that lists the known ones."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for name_, value in values.items():
        name = name_.replace("-", "_")
        if name not in fields:
            known = ", ".join(sorted(key(n) for n in fields))
            raise ValueError(f"unknown configuration key {name_!r}; known keys: {known}")
        kwargs[name] = coerce(name_, value, fields[name].type)
    return cls(**kwargs)


def to_mapping(config: Any) -> dict[str, Any]:
    """The kebab-case mapping of a configuration dataclass (what config.json holds)."""
    return {key(f.name): getattr(config, f.name) for f in dataclasses.fields(config)}


def coerce(name: str, value: Any, type_name: Any) -> Any:
    """Accept what TOML and the command line give (ints for floats, 'inf' strings, 'true' for booleans)."""
    kind = type_name if isinstance(type_name, str) else type_name.__name__
    try:
        if kind == "float":
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if kind == "bool":
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if not isinstance(value, bool):
                raise TypeError
            return value
        return str(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not allowed; expected {_A.get(kind, kind)}") from None


_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
_A = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}

RULES = {
    "> 0": lambda v: v > 0,
    "finite and > 0": lambda v: 0 < v < math.inf,
    "finite and >= 0": lambda v: 0 <= v < math.inf,
    ">= 1": lambda v: v >= 1,
    "in (0, 1)": lambda v: 0 < v < 1,
}


def require(config: Any, rule: str, *names: str) -> None:
    """A ValueError naming the first of ``names`` whose value breaks ``rule`` (a key of :data:`RULES`);
    NaN breaks every rule."""
    for name in names:
        value = getattr(config, name)
        if not RULES[rule](value):
            raise ValueError(f"{key(name)}={value!r} is not allowed; it must be {rule}")


def require_default(config: Any, reason: str, *names: str) -> None:
    """Refuse a value other than its default for a key of ``names``, which the run does not read ``reason``:
    it would be recorded in config.json and silently ignored."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in names and value != field.default:
            raise ValueError(f"{key(field.name)}={value!r} is not read {reason}; leave it at its default "
                             f"{field.default!r}")


def require_seed(seed: int) -> None:
    """Seeds key 32-bit noise streams."""
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed={seed!r} is not allowed; it must satisfy 0 <= seed < 2**32")


def flower_fields(client: str, round_name: str) -> dict[str, Any]:
    """The Flower app's waiting times (``client``: who holds a node; ``round_name``: what the server waits
    for each round)."""
    return {
        "node_timeout": dataclasses.field(default=60.0, metadata={
            "help": f"seconds the Flower server waits at its start for every {client}'s node to connect "
                    "(Flower app only)"}),
        "round_timeout": dataclasses.field(default=600.0, metadata={
            "help": f"seconds the Flower server waits for the {round_name} (Flower app only)"}),
    }


def run_fields(eval_unit: str) -> dict[str, Any]:
    """The fields every family's run has, with one help text each: seed, device, dtype, eval-every, out.
    Spread into a configuration with ``seed: int = FIELDS["seed"]`` and so on (dataclass fields cannot
    be inherited in the middle of a class)."""
    def one(default: Any, help_text: str) -> Any:
        return dataclasses.field(default=default, metadata={"help": help_text})

    return {
        "seed": one(0, "seed of the noise streams, 0 <= seed < 2**32"),
        "device": one("cpu", "compute device: cpu or cuda"),
        "dtype": one("float64", "float64 or float32"),
        "eval_every": one(1, f"evaluate every this many {eval_unit}"),
        "out": one("", "output folder for metrics.jsonl; empty = "
                       "runs/<algorithm>-<dataset>-eps<eps>-seed<seed>"),
    }
