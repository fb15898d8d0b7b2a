"""The files of a ``dpadmm reproduce`` folder, for any paper: CSV tables that grow as each unit completes,
and :func:`pyplot` for its figures.

A reproduction is a grid of units (a cell, a curve, a baseline). Each unit's rows are appended to
its table the moment it completes, so an interrupted call loses at most the unit it was in, and
the next call with the same ``--out`` skips what the tables hold. ``grid.json`` keeps the
settings that the rows depend on; a call with other settings is refused rather than mixed in.
Floats are written with 9 significant digits: beyond the runs' own variation, and half the size of
``repr``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

SETTINGS = "grid.json"


class Tables:
    """The CSV tables of one folder, each with its fixed columns (``schema``: name -> columns)."""

    def __init__(self, out: str | Path, schema: Mapping[str, tuple[str, ...]]) -> None:
        self.out = Path(out)
        self.schema = dict(schema)

    def read(self, name: str) -> list[dict[str, str]]:
        """The rows of table ``name`` (none before its first unit completes); a row that lacks fields or has
        more (a table cut short or edited) is a ValueError naming the file and line, not a report built from
        it."""
        path = self.out / f"{name}.csv"
        if not path.exists():
            return []
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
        for line, row in enumerate(rows, start=2):
            if None in row or None in row.values():
                raise ValueError(f"{path}, line {line}: {len(reader.fieldnames or [])} fields expected, the "
                                 "row has fewer or more (the table was cut short or edited); restore it or "
                                 "rerun the grid into a new --out")
        return rows

    def append(self, name: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append ``rows`` to table ``name``, writing its header first if it is new."""
        path = self.out / f"{name}.csv"
        new = not path.exists()
        with open(path, "a", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.schema[name])
            if new:
                writer.writeheader()
            writer.writerows({k: f"{v:.9g}" if isinstance(v, float) else v for k, v in row.items()}
                             for row in rows)

    def append_all(self, rows: Mapping[str, Iterable[Mapping[str, Any]]]) -> None:
        """Append a grid cell's result: rows per table name (:mod:`dpadmm.runs.grid`); empty ones write
        nothing, not even a header."""
        for name, table_rows in rows.items():
            table_rows = list(table_rows)
            if table_rows:
                self.append(name, table_rows)

    def settings(self) -> dict[str, Any]:
        """The settings saved by :meth:`claim`."""
        return json.loads((self.out / SETTINGS).read_text())

    def claim(self, settings: Mapping[str, Any]) -> None:
        """Create the folder with ``settings``, or check that it holds the same; a ValueError naming each
        difference otherwise (choose another ``--out``)."""
        path = self.out / SETTINGS
        mine = json.loads(json.dumps(settings))
        if path.exists():
            saved = json.loads(path.read_text())
            if saved != mine:
                diff = ", ".join(f"{k}: {saved.get(k)!r} there, {mine.get(k)!r} now"
                                 for k in sorted(set(saved) | set(mine)) if saved.get(k) != mine.get(k))
                raise ValueError(f"{self.out} holds a grid with other settings ({diff}); "
                                 "choose another --out")
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(mine, indent=2) + "\n")


def from_args(kind: type, **kwargs: Any) -> Any:
    """A grid dataclass ``kind`` from command-line values: a tuple field takes a comma-separated string,
    each item converted like the field default's first item; values of None and unknown names are left to
    the defaults."""
    defaults = {f.name: f.default for f in fields(kind)}
    values: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name not in defaults or value is None:
            continue
        default = defaults[name]
        if isinstance(default, tuple) and isinstance(value, str):
            convert = type(default[0]) if default else str
            try:
                value = tuple(convert(v.strip()) for v in value.split(",") if v.strip())
            except ValueError:
                kind_name = {int: "integers", float: "numbers"}.get(convert, "values")
                raise ValueError(f"{name.replace('_', '-')}={value!r} is not allowed; give comma-separated "
                                 f"{kind_name}") from None
            twice = [v for i, v in enumerate(value) if v in value[:i]]
            if twice:  # two cells of one key: refused before any runs, not by the runner after the first
                raise ValueError(f"{name.replace('_', '-')}={','.join(map(str, value))!r} is not allowed: "
                                 f"{twice[0]} comes twice; give each value once")
        values[name] = value
    return kind(**values)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend: a report's figures are files, drawn where no display is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
