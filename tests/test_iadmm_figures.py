from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dpadmm.iadmm.figures import draw_all, without_private


def _rows(dataset: str, algorithm: str, eps: float) -> list[dict[str, Any]]:
    return [{"dataset": dataset, "algorithm": algorithm, "eps": eps, "seed": 0, "round": t,
             "test_error": 0.5 / t, "noise_magnitude": 0.0 if math.isinf(eps) else 1.0 / t,
             "consensus_violation": 1.0 / t} for t in (1, 2, 3)]


def test_a_data_set_run_at_fewer_eps_bar_values_has_its_other_panels_named_empty(tmp_path: Path) -> None:
    """003's grid at T = 20,000: MNIST at eps-bar 0.05 and 5, FEMNIST at 0.05 only, both non-private too.
    The FEMNIST panel at 5 is the one no private cell fills; the figures are still drawn, one file each."""
    rows = (_rows("mnist", "iadmm", math.inf) + _rows("mnist", "objpm", 0.05) + _rows("mnist", "objpm", 5.0)
            + _rows("femnist", "iadmm", math.inf) + _rows("femnist", "objpm", 0.05))
    assert without_private(rows) == {("femnist", 5.0)}
    assert without_private(rows + _rows("femnist", "objt", 5.0)) == set()
    errors = {("mnist", "iadmm", math.inf): [0.2], ("mnist", "objpm", 0.05): [0.3],
              ("mnist", "objpm", 5.0): [0.25], ("femnist", "iadmm", math.inf): [0.4],
              ("femnist", "objpm", 0.05): [0.5]}
    paths = draw_all(rows, errors, tmp_path)
    assert [p.name for p in paths] == ["fig1-test-error.png", "fig2-best-error-vs-eps.png", "fig3-noise.png",
                                       "fig5-consensus.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
