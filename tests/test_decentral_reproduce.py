"""dpadmm.decentral.reproduce (`dpadmm reproduce --paper 004`): a small grid on real UCI Adult, resuming.
(The same numbers on Ray workers and on any thread count: tests/test_cluster.py.)"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dpadmm.decentral.reproduce import CELLS, Grid, bands, cell_key, estimate, run_grid
from dpadmm.runs import references
from dpadmm.runs.grid import GridOptions, numbers

QUIET = GridOptions(progress=False)


@pytest.mark.slow  # a grid of several cells, run again to resume it, and its report
def test_a_small_grid_runs_resumes_and_reports(tmp_path: Path, binary_dir: Path) -> None:
    grid = Grid(out=str(tmp_path / "r"), data_dir=str(binary_dir / "adult"), figures=("2", "C", "D-1"),
                seeds=2, rounds=12)
    cells = [c for c in CELLS if c.figure in grid.figures]
    estimated = estimate(grid)  # before it starts: each cell timed by a short probe of its own
    assert estimated.units == estimated.probes == len(cells) and estimated.seconds > 0
    assert estimated.line().startswith("reproduce: estimated wall time about ")
    out = run_grid(grid, QUIET, log=lambda _: None)
    with open(out / "curves.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    cells = [c for c in CELLS if c.figure in grid.figures]
    assert len(rows) == len(cells) * 2 * 12  # every iteration of every run
    curves = bands(rows)
    ours, fixed = curves[("2", "Algorithm 1")], curves[("2", "fixed penalties")]
    assert ours["epsilon"][-1] == fixed["epsilon"][-1]  # the same a-priori loss: the guarantee
    assert ours["epsilon_ex_post"][-1] < ours["epsilon"][-1]  # the random aggregator's amplification
    assert fixed["epsilon_ex_post"][-1] == pytest.approx(fixed["epsilon"][-1], rel=1e-9)
    assert all(lo <= m <= hi for lo, m, hi in zip(ours["min"], ours["mean"], ours["max"], strict=True))
    report = (out / "summary.md").read_text()
    assert "## Fig. C" in report and "## Fig. B" not in report
    # the baseline by its authors (the References list them), not by 004's number; 2\* escaped for Markdown
    assert "Algorithm 2\\*'s privacy loss is only 30% of noisy DGD's (Huang, Mitra & Vaidya)" in report
    assert "| noisy DGD (Huang, Mitra & Vaidya) |" in report and "[45]'s" not in report
    assert report.rstrip().endswith(references.ENTRIES["huang2015"])  # the References close the page
    # the rows keep their label: docs/results/004/curves.csv, written with it, still reads
    assert "noisy DGD [45]" in {r["method"] for r in rows if r["figure"] == "C"}
    assert (out / "fig-2.png").stat().st_size > 0 and not (out / "fig-B.png").exists()
    assert (out / "fig-1.png").stat().st_size > 0  # gamma: no runs needed
    assert "| 0.1 | 0.9526 / 0.9517 |" in report  # the notes' table: exact / eq. (11) at beta = 2
    before = (out / "curves.csv").read_text()
    assert estimate(grid).units == 0  # nothing left to run: nothing probed
    logged: list[str] = []
    run_grid(grid, QUIET, log=logged.append)  # every cell complete: each skipped, none run
    assert [line for line in logged if line.endswith("complete, skipped")] == [
        f"{cell_key(c)}: complete, skipped" for c in cells]
    assert not any("running" in line for line in logged)
    assert (out / "curves.csv").read_text() == before
    with pytest.raises(ValueError, match="seeds: 2 there, 3 now"):
        run_grid(Grid(**{**grid.__dict__, "seeds": 3}), QUIET, log=lambda _: None)


def test_bad_grids_are_named() -> None:
    with pytest.raises(ValueError, match="figures='E' is not allowed; choose among 2, B, C, D-1, D-2"):
        Grid(figures=("E",))
    with pytest.raises(ValueError, match="seeds=0 and rounds=100 must be >= 1"):
        Grid(seeds=0)
    # every cell used to run and fail (each told to retry) where the paper's noise has no finite guarantee
    with pytest.raises(ValueError, match=r"rounds=40000 is not allowed for Fig\. 2 \(Algorithm 1\), whose "
                                         "noise is the paper's: noise-growth=1.02 over 40000 rounds"):
        Grid(rounds=40_000)


@pytest.mark.slow  # 5 s
def test_an_interrupted_grid_resumes_with_the_cells_it_had_not_committed(tmp_path: Path,
                                                                         binary_dir: Path) -> None:
    """Cells are committed one by one: a call that stopped after the first (here: a grid of one figure's
    first curve, then the whole figure) runs only the rest, and the tables equal an uninterrupted call's."""
    data = str(binary_dir / "adult")
    whole = Grid(out=str(tmp_path / "whole"), data_dir=data, figures=("D-1",), seeds=1, rounds=3)
    run_grid(whole, QUIET, log=lambda _: None)
    part = Grid(**{**whole.__dict__, "out": str(tmp_path / "part")})
    first = next(c for c in CELLS if c.figure == "D-1")
    run_grid(part, QUIET, log=lambda _: None)
    with open(tmp_path / "part" / "curves.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    with open(tmp_path / "part" / "curves.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))  # as if stopped after the first cell
        writer.writeheader()
        writer.writerows(r for r in rows if r["method"] == first.label)
    logged: list[str] = []
    run_grid(part, QUIET, log=logged.append)
    assert sum(line.endswith("complete, skipped") for line in logged) == 1
    assert sum(line.endswith(": running") for line in logged) == 3
    assert numbers(tmp_path / "part") == numbers(tmp_path / "whole")
