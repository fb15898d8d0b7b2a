"""dpadmm.linadmm.reproduce (`dpadmm reproduce --paper 002`): a small grid on real ijcnn1, resuming."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from dpadmm.linadmm.reproduce import TUNED, Grid, crossover, estimate, finals, run_grid, tuned
from dpadmm.runs.grid import GridOptions, numbers

QUIET = GridOptions(progress=False)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow  # a grid of several cells, run again to resume it, and its report
def test_a_small_grid_runs_resumes_and_reports(tmp_path: Path, binary_dir: Path) -> None:
    grid = Grid(out=str(tmp_path / "r"), data_dir=str(binary_dir), datasets=("ijcnn1",), eps=(0.05, 0.5),
                rounds=(5, 10), seeds=2, optimum_rounds=300)
    estimated = estimate(grid)  # before it starts: the optimum's 2 long runs, 2 x 6 cells, 6 curves
    assert estimated.units == 2 + 2 * 6 + 6 and estimated.probes == 6 and estimated.seconds > 0
    assert "not included: the reference solver" in estimated.line()
    logged: list[str] = []
    out = run_grid(grid, QUIET, log=logged.append)
    # one cell per unit: the problem and the optimum, per T 2 + 2 x 2 (method, eps), 2 + 2 x 2 curves
    assert sum(line.endswith(": complete") for line in logged) == 2 + 2 * 6 + 6
    assert "ijcnn1 DP-ADMM eps=0.05 T=10: complete" in logged and "ijcnn1 ADMM T=5: complete" in logged
    cells = _rows(out / "cells.csv")
    # per T: 2 non-private runs, 2 private methods x 2 eps x 2 seeds
    assert len(cells) == 2 * (2 + 2 * 2 * 2)
    problem = _rows(out / "problems.csv")[0]
    assert float(problem["eta"]) == pytest.approx(1 / float(problem["smoothness"]))
    optimum = _rows(out / "optimum.csv")[0]
    # the independent solver is below what 300 iterations of either method reach, and F* is its value
    assert float(optimum["optimum"]) == float(optimum["reference"])
    assert float(optimum["reference"]) < min(float(optimum["admm_long"]), float(optimum["accadmm_long"]))
    curves = _rows(out / "curves.csv")
    assert len(curves) == (2 + 2 * 2) * 10  # Fig. 1: every iteration of the largest T
    assert all(float(c["objective"]) > float(optimum["optimum"]) for c in curves)
    report = (out / "summary.md").read_text()
    assert "| ijcnn1 | 10 |" in report and "T* per data set" in report
    assert "\n## References\n\n- **002**: Tao Xu" in report  # written here, so a rebuilt page keeps it
    assert (out / "fig1-gap-vs-time.png").stat().st_size > 0 and (out / "fig2-vs-eps.png").stat().st_size > 0
    # the mean of the seeds is the table's
    table = finals(cells)
    seeds = [float(c["objective"]) for c in cells
             if c["method"] == "DP-ADMM" and c["eps"] == "0.05" and c["rounds"] == "10"]
    assert table[("ijcnn1", "DP-ADMM", 0.05, 10)]["objective"][0] == pytest.approx(sum(seeds) / 2)
    # the private runs differ by seed
    assert len(set(seeds)) == 2
    before = (out / "cells.csv").read_text()
    assert estimate(grid).units == 0
    logged.clear()
    run_grid(grid, QUIET, log=logged.append)  # a second call skips every cell
    assert sum(line.endswith(": complete, skipped") for line in logged) == 2 + 2 * 6 + 6
    assert not [line for line in logged[1:] if not line.endswith(": complete, skipped")]
    assert (out / "cells.csv").read_text() == before
    with pytest.raises(ValueError, match="seeds: 2 there, 3 now"):
        run_grid(Grid(**{**grid.__dict__, "seeds": 3}), QUIET, log=lambda _: None)


@pytest.mark.slow  # starts Ray
def test_ray_workers_write_the_same_numbers_and_an_interrupted_grid_resumes(tmp_path: Path,
                                                                           binary_dir: Path) -> None:
    """The same tiny grid in this process and on two local Ray workers (one thread per cell in both): the
    same tables, every number equal (the clocks aside). A folder that holds the rows of its first cells
    only (a call interrupted there) is completed to the same tables."""
    values = dict(data_dir=str(binary_dir), datasets=("ijcnn1",), eps=(0.05,), rounds=(3,), seeds=2,
                  optimum_rounds=20)
    here = run_grid(Grid(out=str(tmp_path / "here"), **values), QUIET, log=lambda _: None)
    logged: list[str] = []
    on_ray = run_grid(Grid(out=str(tmp_path / "ray"), **values), GridOptions(workers=2, progress=False),
                      log=logged.append)
    assert "grid: 2 cells at once on a local Ray instance, 1 thread(s) each" in logged
    assert numbers(on_ray) == numbers(here)

    resumed = tmp_path / "resumed"  # interrupted after the problem, the optimum and the non-private cells
    resumed.mkdir()
    for name in ("grid.json", "problems.csv", "optimum.csv"):
        (resumed / name).write_bytes((here / name).read_bytes())
    lines = (here / "cells.csv").read_text().splitlines(keepends=True)
    (resumed / "cells.csv").write_text("".join(lines[:3]))  # the header and the rows of ADMM, AccADMM
    logged.clear()
    run_grid(Grid(out=str(resumed), **values), QUIET, log=logged.append)
    assert sum(line.endswith(": complete, skipped") for line in logged) == 4
    assert numbers(resumed) == numbers(here)


def _table(admm: list[float], acc: list[float], eps: list[float]) -> dict:
    table = {}
    for e, a, b in zip(eps, admm, acc, strict=True):
        table[("d", "DP-ADMM", e, 10)] = {"objective": (a, 0.0)}
        table[("d", "DP-AccADMM", e, 10)] = {"objective": (b, 0.0)}
    return table


def test_crossover_is_the_eps_from_which_accadmm_stays_ahead() -> None:
    eps = [0.01, 0.02, 0.03, 0.04]
    assert crossover(_table([1, 1, 1, 1], [2, 0.5, 2, 0.5], eps), "d", 10, "objective") == (0.04, True)
    assert crossover(_table([1, 1, 1, 1], [2, 2, 0.5, 0.5], eps), "d", 10, "objective") == (0.03, True)
    assert crossover(_table([1, 1, 1, 1], [0.5] * 4, eps), "d", 10, "objective") == (0.01, False)
    assert crossover(_table([1, 1, 1, 1], [2] * 4, eps), "d", 10, "objective") == (None, True)
    assert crossover({}, "d", 10, "objective") == (None, False)


def test_tuned_gives_each_method_and_eps_its_best_t() -> None:
    table = {("d", "DP-ADMM", 0.1, 25): {"objective": (0.5, 0.0), "test_accuracy": (0.7, 0.0)},
             ("d", "DP-ADMM", 0.1, 50): {"objective": (0.4, 0.0), "test_accuracy": (0.6, 0.0)}}
    assert tuned(table, "objective")[("d", "DP-ADMM", 0.1, TUNED)]["objective"] == (0.4, 0.0)
    assert tuned(table, "test_accuracy")[("d", "DP-ADMM", 0.1, TUNED)]["test_accuracy"] == (0.7, 0.0)


def test_a_grid_names_its_bad_values() -> None:
    with pytest.raises(ValueError, match="datasets='mnist' is not allowed"):
        Grid(datasets=("mnist",))
    with pytest.raises(ValueError, match="fig1-eps=inf"):
        Grid(fig1_eps=math.inf)
    with pytest.raises(ValueError, match="dtype='float16' is not allowed"):
        Grid(dtype="float16")
    with pytest.raises(ValueError, match="eta=inf is not allowed; it must be finite"):  # every cell failed
        Grid(eta=math.inf)
