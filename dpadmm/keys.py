"""Run-config keys, shared by every family's configuration: kebab-case names, checks, coercion.

A family's configuration is a frozen dataclass whose fields are its keys in snake_case; the
Flower app reads them from ``context.run_config`` (``[tool.flwr.app.config]``, overridable with
``flwr run . --run-config "..."``) and the ``dpadmm`` command builds one flag per field, so
``local_steps`` is ``local-steps`` everywhere. Errors name the bad value and what is allowed
(the convention of Opacus and dp-accounting).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

_C = TypeVar("_C")


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
        raise ValueError(f"{name}={value!r} is not allowed; expected a {kind}") from None
