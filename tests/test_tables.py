"""dpadmm.runs.tables: the growing CSV tables of a reproduce folder, its settings, and grids from flags."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from dpadmm.runs.tables import Tables, from_args


def test_rows_are_appended_and_read_back_with_nine_digits(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {"cells": ("name", "value")})
    assert tables.read("cells") == []
    tables.append("cells", [{"name": "a", "value": 1 / 3}])
    tables.append("cells", [{"name": "b", "value": 2}])
    assert tables.read("cells") == [{"name": "a", "value": "0.333333333"}, {"name": "b", "value": "2"}]
    assert (tmp_path / "cells.csv").read_text().splitlines()[0] == "name,value"
    # a table cut short (a disk full, an edit): named, not read into a report (float(None) failed later)
    (tmp_path / "cells.csv").write_text("name,value\na,0.333333333\nb\n")
    with pytest.raises(ValueError, match=r"cells\.csv, line 3: 2 fields expected, the row has fewer or more"):
        tables.read("cells")


def test_a_folder_keeps_its_settings_and_refuses_others(tmp_path: Path) -> None:
    tables = Tables(tmp_path / "out", {})
    tables.claim({"seeds": 2, "eps": (0.1, 1.0)})
    tables.claim({"seeds": 2, "eps": [0.1, 1.0]})  # the same, as JSON holds it
    assert tables.settings() == {"seeds": 2, "eps": [0.1, 1.0]}
    with pytest.raises(ValueError, match="seeds: 2 there, 3 now\\); choose another --out"):
        tables.claim({"seeds": 3, "eps": (0.1, 1.0)})


@dataclass(frozen=True)
class _Grid:
    out: str = "x"
    rates: tuple[float, ...] = (0.1,)
    rounds: tuple[int, ...] = (5,)
    seeds: int = 1


def test_a_grid_from_flags_converts_lists_like_their_defaults() -> None:
    grid = from_args(_Grid, out="y", rates="1, 3", rounds="10,20", seeds=None, command="reproduce")
    assert grid == _Grid(out="y", rates=(1.0, 3.0), rounds=(10, 20), seeds=1)
    with pytest.raises(ValueError, match="rounds='1.5' is not allowed; give comma-separated integers"):
        from_args(_Grid, rounds="1.5")
    # two cells of one key: refused at once, not by the runner once the grid's first cells had run
    with pytest.raises(ValueError, match="rounds='5,10,5' is not allowed: 5 comes twice; give each value"):
        from_args(_Grid, rounds="5,10,5")
